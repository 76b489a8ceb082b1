package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// statsRow is one sandbox's line of dsec stats (and its JSON object).
type statsRow struct {
	ID string
	dsec.Stats
	// CPUPercent is the share of its CPU cap used over the sample, when
	// sampled.
	CPUPercent *float64 `json:",omitempty"`
	err        error
}

func newStatsCmd(g *globalFlags) *cobra.Command {
	var (
		selector []string
		output   string
		sample   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "stats [flags] [ID...]",
		Short: "Show sandboxes' resource use",
		Long: `Show the resource use of the named sandboxes, or of every sandbox matching -l
(all of them without either):

  CPU      CPU time used since the sandbox started, and the share of its CPU
           cap used over a short sample (--sample, default 1s: dsec reads
           the counters twice; --sample 0 reads them once and shows the
           total only)
  MEM      memory in use / its limit
  PIDS     processes and threads / the limit
  DISK     writable layer in use / its size
  OUTPUT   exec output kept for the sandbox / its quota

When a sandbox has a network (dsec run --network), also:

  NET IN / OUT  bytes received and sent through the node's egress proxy
  CONNS         connections it made
  DENIED        connections and name lookups refused (dsec net log ID says
                which and why)

Sizes are in powers of 1024 (512M = 512 MiB).`,
		Example: `  dsec stats
  dsec stats -l job=eval --sample 0
  dsec stats -o json ID`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if sample < 0 {
				return usageErrorf("--sample must be 0 or more")
			}
			sel, err := parseKV("-l", selector)
			if err != nil {
				return err
			}
			if len(args) > 0 && len(sel) > 0 {
				return usageErrorf("give IDs or -l, not both")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			ids, named := args, len(args) > 0
			if !named {
				sbs, err := c.List(ctx, sel)
				if err != nil {
					return err
				}
				for _, sb := range sbs {
					if sb.State == dsec.StateRunning || sb.State == dsec.StatePaused {
						ids = append(ids, sb.ID)
					}
				}
			}
			rows, err := collectStats(ctx, c, ids, sample)
			if err != nil {
				return err
			}
			failed := 0
			kept := rows[:0]
			for _, r := range rows {
				switch {
				case r.err == nil:
					kept = append(kept, r)
				case !named && isNotFound(r.err):
					// Deleted since it was listed.
				default:
					failed++
					fmt.Fprintf(cmd.ErrOrStderr(), "dsec: %s: %v\n", r.ID, r.err)
				}
			}
			if err := printStats(cmd.OutOrStdout(), output, kept, sample > 0); err != nil {
				return err
			}
			if failed > 0 {
				return exitError{125}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&selector, "label", "l", nil, "only sandboxes with label k=v (repeatable, ANDed)")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	f.DurationVar(&sample, "sample", time.Second, "how long to sample CPU use for the % of the cap (0: CPU time only)")
	return cmd
}

// collectStats reads the stats of ids, twice sample apart when sample > 0.
// Errors are per row.
func collectStats(ctx context.Context, c *dsec.Client, ids []string, sample time.Duration) ([]statsRow, error) {
	rows := make([]statsRow, len(ids))
	first := make([]time.Time, len(ids))
	read := func(i int) {
		st, err := c.Sandbox(ids[i]).Stats(ctx)
		if err != nil {
			rows[i].err = err
			return
		}
		now := time.Now()
		if rows[i].ID != "" && sample > 0 {
			cpu := (st.CPU - rows[i].CPU).Seconds()
			elapsed := now.Sub(first[i]).Seconds()
			cores := st.CPUs
			if cores <= 0 {
				cores = 1
			}
			if elapsed > 0 {
				pct := 100 * cpu / elapsed / cores
				rows[i].CPUPercent = &pct
			}
		}
		rows[i].ID, rows[i].Stats, first[i] = ids[i], *st, now
	}
	round := func() error {
		var eg errgroup.Group
		eg.SetLimit(16)
		for i := range ids {
			if rows[i].err != nil {
				continue
			}
			eg.Go(func() error { read(i); return nil })
		}
		return eg.Wait()
	}
	if err := round(); err != nil {
		return nil, err
	}
	if sample > 0 && len(ids) > 0 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(sample):
		}
		if err := round(); err != nil {
			return nil, err
		}
	}
	for i := range rows {
		rows[i].ID = ids[i]
	}
	return rows, nil
}

func printStats(w io.Writer, output string, rows []statsRow, sampled bool) error {
	if output == "json" {
		js := make([]json.RawMessage, 0, len(rows))
		for _, r := range rows {
			b, err := statsJSON(r)
			if err != nil {
				return err
			}
			js = append(js, b)
		}
		return encodeJSON(w, js)
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	net := slices.ContainsFunc(rows, func(r statsRow) bool { return r.Networked })
	head := "ID\tCPU\tMEM / LIMIT\tPIDS / LIMIT\tDISK / LIMIT\tOUTPUT"
	if net {
		head += "\tNET IN / OUT\tCONNS\tDENIED"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		cpu := fmt.Sprintf("%.2fs", r.CPU.Seconds())
		if r.CPUPercent != nil {
			cpu += fmt.Sprintf(" %.0f%%", *r.CPUPercent)
		} else if sampled {
			cpu += " -"
		}
		mem := dsec.FormatSize(r.Memory) + " / " + dsec.FormatSize(r.MemoryLimit)
		if r.OOMKills > 0 {
			mem += fmt.Sprintf(" (%d OOM)", r.OOMKills)
		}
		if r.Swapped > 0 {
			mem += " (" + dsec.FormatSize(r.Swapped) + " swapped)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d / %d\t%s / %s\t%s / %s", r.ID, cpu, mem, r.Pids, r.PidsLimit,
			dsec.FormatSize(r.Disk), dsec.FormatSize(r.DiskLimit), dsec.FormatSize(r.Output), dsec.FormatSize(r.OutputLimit))
		switch {
		case net && r.Networked:
			fmt.Fprintf(tw, "\t%s / %s\t%d\t%d", dsec.FormatSize(r.NetIn), dsec.FormatSize(r.NetOut), r.NetConnections, r.NetDenied)
		case net:
			fmt.Fprint(tw, "\t-\t-\t-")
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

func newTimeoutCmd(g *globalFlags) *cobra.Command {
	var (
		ttl, idleTTL, pausedTTL time.Duration
		idleAction              string
	)
	cmd := &cobra.Command{
		Use:   "timeout ID (--ttl D | --idle-ttl D | --paused-ttl D | --idle-action A)...",
		Short: "Change a live sandbox's TTLs",
		Long: `Set a sandbox's hard TTL (counted from now: the sandbox is deleted that long
from now; for a paused sandbox, from when it resumes, as paused time does not
count), its idle TTL (it is deleted, or paused with --idle-action pause, after
that long without use), its paused TTL (it is deleted once paused that long,
counted from its pause) and what its idle TTL does. A paused sandbox stays
paused. Prints when it now expires.`,
		Example: `  dsec timeout ID --ttl 4h
  dsec timeout ID --idle-ttl 30m --idle-action pause
  dsec timeout ID --paused-ttl 72h`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if ttl == 0 && idleTTL == 0 && pausedTTL == 0 && idleAction == "" {
				return usageErrorf("give --ttl, --idle-ttl, --paused-ttl or --idle-action")
			}
			if ttl < 0 || idleTTL < 0 || pausedTTL < 0 {
				return usageErrorf("TTLs must be positive")
			}
			action, err := idleActionFlag(idleAction)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			sb := c.Sandbox(args[0])
			if err := sb.SetTimeouts(cmd.Context(), dsec.Timeouts{TTL: ttl, IdleTTL: idleTTL, PausedTTL: pausedTTL, IdleAction: action}); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if sb.State == dsec.StatePaused {
				fmt.Fprintf(w, "%s is paused until %s (in %s), then deleted; once resumed it expires %s after; idle TTL %s (then %s)\n", sb.ID,
					sb.PausedExpiresAt.Local().Format(time.DateTime), time.Until(sb.PausedExpiresAt).Round(time.Second),
					time.Until(sb.ExpiresAt).Round(time.Second), sb.IdleTTL, orDefault(sb.IdleAction, dsec.IdleDelete))
				return nil
			}
			fmt.Fprintf(w, "%s expires at %s (in %s), idle TTL %s (then %s), paused TTL %s\n", sb.ID,
				sb.ExpiresAt.Local().Format(time.DateTime), time.Until(sb.ExpiresAt).Round(time.Second), sb.IdleTTL,
				orDefault(sb.IdleAction, dsec.IdleDelete), sb.PausedTTL)
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&ttl, "ttl", 0, "new hard TTL, counted from now (from the resume for a paused sandbox) (e.g. 2h)")
	f.DurationVar(&idleTTL, "idle-ttl", 0, "new idle TTL (e.g. 30m)")
	f.DurationVar(&pausedTTL, "paused-ttl", 0, "new paused TTL, counted from the pause for a paused sandbox (e.g. 72h)")
	f.StringVar(&idleAction, "idle-action", "", "what the idle TTL does: delete or pause")
	return cmd
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func newLabelCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "label ID k=v... k-...",
		Short: "Set and remove a sandbox's labels",
		Long: `Set labels (k=v) and remove them (k-, the key followed by a dash) on a
sandbox. Prints the labels it then has.`,
		Example: `  dsec label ID job=eval owner=alice
  dsec label ID stage-`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, remove, err := parseLabelEdits(args[1:])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			sb := c.Sandbox(args[0])
			if err := sb.UpdateLabels(cmd.Context(), set, remove...); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), labelString(sb.Labels))
			return nil
		},
	}
	return cmd
}

// parseLabelEdits parses k=v (set) and k- (remove) arguments.
func parseLabelEdits(items []string) (set map[string]string, remove []string, err error) {
	for _, it := range items {
		if k, v, ok := strings.Cut(it, "="); ok {
			if k == "" {
				return nil, nil, usageErrorf("label %q: want k=v or k-", it)
			}
			if set == nil {
				set = map[string]string{}
			}
			set[k] = v
			continue
		}
		if k, ok := strings.CutSuffix(it, "-"); ok && k != "" {
			remove = append(remove, k)
			continue
		}
		return nil, nil, usageErrorf("label %q: want k=v to set or k- to remove", it)
	}
	return set, remove, nil
}

func newWatchCmd(g *globalFlags) *cobra.Command {
	var (
		selector []string
		initial  bool
		output   string
	)
	cmd := &cobra.Command{
		Use:   "watch [flags]",
		Short: "Print sandbox events as they happen",
		Long: `Print a line per state change of the sandboxes matching -l (all without it):
time, event (created, exited, oom, ttl_expired, failed, deleted, updated,
paused, resumed),
sandbox ID and reason. With --initial, first a created event for every
sandbox that exists. -o json prints one JSON object per line. Runs until
interrupted (exit 0), or until the stream fails (exit 125).`,
		Example: `  dsec watch
  dsec watch -l job=eval --initial -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			sel, err := parseKV("-l", selector)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out := cmd.OutOrStdout()
			return c.Watch(ctx, dsec.WatchOptions{Selector: sel, Initial: initial}, func(ev dsec.Event) error {
				if output == "json" {
					return writeProtoLine(out, eventProto(ev))
				}
				id := "-"
				if ev.Sandbox != nil {
					id = ev.Sandbox.ID
				}
				_, err := fmt.Fprintf(out, "%s  %-11s  %s  %s\n", ev.Time.Local().Format(time.RFC3339), ev.Type, id, ev.Reason)
				return err
			})
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&selector, "label", "l", nil, "only sandboxes with label k=v (repeatable, ANDed)")
	f.BoolVar(&initial, "initial", false, "first report every existing sandbox as created")
	f.StringVarP(&output, "output", "o", "table", "output format: table (one line per event) or json (one object per line)")
	return cmd
}
