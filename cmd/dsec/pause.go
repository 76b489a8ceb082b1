package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// idleActionFlag checks an --idle-action value ("" leaves it unset).
func idleActionFlag(v string) (string, error) {
	switch v {
	case "", dsec.IdleDelete, dsec.IdlePause:
		return v, nil
	}
	return "", usageErrorf("--idle-action %q: use %s or %s", v, dsec.IdleDelete, dsec.IdlePause)
}

func newPauseCmd(g *globalFlags) *cobra.Command {
	return pauseCmd(g, "pause", "Pause sandboxes: stop them and give their memory back to the node",
		`Pause sandboxes by ID, or every sandbox matching the labels of -l (repeatable,
ANDed: a job). A paused sandbox's processes are stopped and its memory is pushed
out of RAM (to the node's swap, where it has one); its files, processes and
state stay. Paused time counts against neither its hard nor its idle TTL; its
paused TTL (dsec run --paused-ttl, default 24h) deletes it if it stays paused
longer. Any later exec, file operation (dsec cp, dsec fs), attach, session
command or port connection resumes it first; dsec ps, stats and watch do not.
Pausing a paused sandbox reports it as it is.

Prints each sandbox's ID, state, memory in RAM and out of it, and how long the
pause took; a sandbox whose pause failed is named on standard error and dsec
exits with its error's code. -o json prints the API's JSON.`,
		`  dsec pause ID
  dsec pause -l job=rl-step-42
  dsec pause -o json ID1 ID2`,
		(*dsec.Sandbox).Pause, (*dsec.Client).Pause)
}

func newResumeCmd(g *globalFlags) *cobra.Command {
	return pauseCmd(g, "resume", "Resume paused sandboxes",
		`Resume paused sandboxes by ID, or every sandbox matching the labels of -l
(repeatable, ANDed). Any request that needs a paused sandbox running resumes it
anyway; dsec resume does it ahead of time (after a preempted job comes back,
say). Resuming a running sandbox reports it as it is. A node that cannot hold
a sandbox's memory again refuses with "resource exhausted" and a retry hint,
and the sandbox stays paused.

Prints each sandbox's ID, state, memory in RAM and out of it, and how long the
resume took; a sandbox whose resume failed is named on standard error and dsec
exits with its error's code. -o json prints the API's JSON.`,
		`  dsec resume ID
  dsec resume -l job=rl-step-42`,
		(*dsec.Sandbox).Resume, (*dsec.Client).Resume)
}

// pauseCmd makes dsec pause or dsec resume, which call one (by ID) or
// bySel (by selector).
func pauseCmd(g *globalFlags, verb, short, long, example string,
	one func(*dsec.Sandbox, context.Context) (*dsec.PauseResult, error),
	bySel func(*dsec.Client, context.Context, map[string]string) ([]dsec.PauseResult, error),
) *cobra.Command {
	var (
		selector []string
		output   string
	)
	cmd := &cobra.Command{
		Use:     verb + " ID...|-l k=v",
		Short:   short,
		Long:    long,
		Example: example,
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseKV("-l", selector)
			if err != nil {
				return err
			}
			switch {
			case len(args) == 0 && len(sel) == 0:
				return usageErrorf("name sandbox IDs or a label selector (-l k=v)")
			case len(args) > 0 && len(sel) > 0:
				return usageErrorf("give IDs or -l, not both")
			}
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var results []dsec.PauseResult
			if len(sel) > 0 {
				if results, err = bySel(c, cmd.Context(), sel); err != nil {
					return err
				}
			}
			for _, id := range args {
				res, err := one(c.Sandbox(id), cmd.Context())
				if err != nil {
					var e *dsec.Error
					if !errors.As(err, &e) {
						return err
					}
					res = &dsec.PauseResult{ID: id, Err: e}
				}
				results = append(results, *res)
			}
			return printPauseResults(cmd.OutOrStdout(), cmd.ErrOrStderr(), results, output)
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&selector, "label", "l", nil, verb+" sandboxes with label k=v (repeatable, ANDed)")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// printPauseResults prints a table of the results (or them as the API's
// JSON); a failed one is named on w2 and makes the exit its error's code.
func printPauseResults(w, w2 io.Writer, results []dsec.PauseResult, output string) error {
	var failed *dsec.Error
	for _, r := range results {
		if r.Err != nil && failed == nil {
			failed = r.Err
		}
	}
	if output == "json" {
		if err := encodeProtos(w, results, pauseResultProto); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tRESIDENT\tSWAPPED\tTOOK")
		for _, r := range results {
			if r.Err != nil {
				fmt.Fprintf(w2, "dsec: %s: %v\n", r.ID, r.Err)
				continue
			}
			took := "-"
			if r.Took > 0 {
				took = r.Took.String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.ID, r.State, dsec.FormatSize(r.Resident), dsec.FormatSize(r.Swapped), took)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if failed != nil {
		return exitError{exitCodeOf(failed)}
	}
	return nil
}

func pauseResultProto(r dsec.PauseResult) *sandboxv1.PauseResult {
	out := &sandboxv1.PauseResult{Id: r.ID, ResidentBytes: r.Resident, SwappedBytes: r.Swapped}
	if r.Err != nil {
		out.Error = &sandboxv1.ItemError{Code: codeName(r.Err), Message: r.Err.Message, RetryAfter: durationProto(r.Err.RetryAfter)}
		return out
	}
	out.State = stateProto(r.State)
	out.Took = durationProto(r.Took)
	return out
}
