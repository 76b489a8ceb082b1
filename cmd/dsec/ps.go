package main

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newPsCmd(g *globalFlags) *cobra.Command {
	var (
		quiet    bool
		output   string
		selector []string
	)
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List sandboxes",
		Long: `List the sandboxes your key may see: ID, image, state, age, time left (the
earlier of the hard TTL and the idle TTL, "12s idle" when it is the idle one;
for a paused sandbox its paused TTL, "23h paused", as paused time counts
against neither of the others), and labels. -o json prints the API's own JSON (its field names, durations like
"900s", RFC 3339 times). -l filters by labels (repeatable, ANDed).`,
		Example: `  dsec ps
  dsec ps -q -l job=eval
  dsec ps -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "" && output != "table" && output != "json" {
				return usageErrorf("-o %q: use table or json", output)
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
			sbs, err := c.List(cmd.Context(), sel)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch {
			case quiet:
				for _, sb := range sbs {
					fmt.Fprintln(out, sb.ID)
				}
			case output == "json":
				return encodeProtos(out, sbs, sandboxProto)
			default:
				tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tIMAGE\tSTATE\tAGE\tTTL LEFT\tMEMORY\tCPUS\tLABELS")
				now := time.Now()
				for _, sb := range sbs {
					state := sb.State
					if sb.Reason != "" && sb.State != dsec.StateRunning {
						state += " (" + sb.Reason + ")"
					}
					image := sb.Image
					if image == "" {
						image = "(layer list)" // created from explicit layer digests
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%g\t%s\n", sb.ID, image, state,
						human(now.Sub(sb.CreatedAt)), ttlLeft(sb, now),
						dsec.FormatSize(sb.Resources.Memory), sb.Resources.CPUs, labelString(sb.Labels))
				}
				return tw.Flush()
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&quiet, "quiet", "q", false, "print only IDs")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	f.StringArrayVarP(&selector, "label", "l", nil, "only sandboxes with label k=v (repeatable, ANDed)")
	return cmd
}

func labelString(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// ttlLeft is the time left before the earlier of sb's hard and idle
// expiries, marked "idle" when the idle TTL ends it first (and "idle
// pause" when that pauses it); for a paused sandbox, the time left of its
// paused TTL, marked "paused".
func ttlLeft(sb *dsec.Sandbox, now time.Time) string {
	if sb.State == dsec.StatePaused && !sb.PausedExpiresAt.IsZero() {
		return human(sb.PausedExpiresAt.Sub(now)) + " paused"
	}
	if !sb.IdleExpiresAt.IsZero() && sb.IdleExpiresAt.Before(sb.ExpiresAt) {
		if sb.IdleAction == dsec.IdlePause {
			return human(sb.IdleExpiresAt.Sub(now)) + " idle pause"
		}
		return human(sb.IdleExpiresAt.Sub(now)) + " idle"
	}
	return human(sb.ExpiresAt.Sub(now))
}

// human prints a duration the way ps tables do: 5s, 3m, 2h, 4d.
func human(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func newRmCmd(g *globalFlags) *cobra.Command {
	var selector []string
	cmd := &cobra.Command{
		Use:   "rm [ID...] [-l k=v]",
		Short: "Delete sandboxes",
		Long: `Delete sandboxes by ID, or every sandbox matching the labels of -l (repeatable,
ANDed). Deleting stops the sandbox and removes its files. Prints the IDs deleted.`,
		Example: `  dsec rm ID
  dsec rm -l job=eval`,
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseKV("-l", selector)
			if err != nil {
				return err
			}
			if len(args) == 0 && len(sel) == 0 {
				return usageErrorf("name sandbox IDs or a label selector (-l k=v)")
			}
			if len(args) > 0 && len(sel) > 0 {
				return usageErrorf("give IDs or -l, not both")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			out := cmd.OutOrStdout()
			if len(sel) > 0 {
				ids, err := c.DeleteSelector(cmd.Context(), sel)
				for _, id := range ids {
					fmt.Fprintln(out, id)
				}
				return err
			}
			var firstErr error
			for _, id := range args {
				if err := c.Delete(cmd.Context(), id); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "dsec: %s: %v\n", id, err)
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				fmt.Fprintln(out, id)
			}
			if firstErr != nil {
				return exitError{exitCodeOf(firstErr)}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&selector, "label", "l", nil, "delete sandboxes with label k=v (repeatable, ANDed)")
	return cmd
}
