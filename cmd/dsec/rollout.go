package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	rolloutv1 "github.com/dsecproject/dsec/api/dsec/rollout/v1"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newRolloutCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Make, read and delete rollouts (a worker and its agent's sandboxes, together)",
		Long: `A rollout is the sandboxes of one agent rollout made, kept and ended together:
a worker that runs the agent loop, the agent's sandbox, helpers. It has one ID
(which a trainer keeps, to reconnect after its GPU job was preempted), the
labels every member gets, one lifetime, and a small key/value status its
worker writes. Its members carry the label dsec.rollout=ID, which only the
platform sets. docs/rollouts.md describes the spec and the worker's key.`,
		Example: `  dsec rollout create -f spec.json
  dsec rollout get ID
  dsec rollout ls -l job=ppo-7
  dsec rollout rm ID`,
	}
	cmd.AddCommand(newRolloutCreateCmd(g), newRolloutGetCmd(g), newRolloutLsCmd(g), newRolloutRmCmd(g))
	return cmd
}

func newRolloutCreateCmd(g *globalFlags) *cobra.Command {
	var file, key, output string
	cmd := &cobra.Command{
		Use:   "create -f FILE",
		Short: "Make a rollout and all its members from a spec (JSON or YAML)",
		Long: `Make a rollout from its spec and print its ID once every member runs. The
members are made in order on one node, all or none: when one cannot be made,
those made before it are deleted and the error says which member failed.

The spec is the API's rollout.v1.Spec in JSON (protobuf's field names, as -o
json prints them) or the same in YAML; - reads it from standard input:

  {
    "labels": {"job": "ppo-7"},
    "ttl": "7200s", "idleTtl": "1800s",
    "members": [
      {"name": "worker", "role": "worker",
       "sandbox": {"image": "rollout/python", "network": {"text": "allow=dsec-api,policy"}}},
      {"name": "agent", "sandbox": {"image": "busybox", "resources": {"memoryBytes": "536870912"}}}
    ]
  }

Every member gets the rollout's labels, its TTLs (their own are ignored) and
the environment DSEC_ROLLOUT (the ID), DSEC_ROLLOUT_MEMBER (its name) and
DSEC_ROLLOUT_MEMBERS (name=sandbox-id,... of all). A member whose network
allows dsec-api reaches the API as its own key, which acts on its rollout
only: exec and files in its members, its status, nothing else.`,
		Example: `  dsec rollout create -f spec.json
  dsec rollout create -f spec.yaml --idempotency-key job-7/rollout-3
  dsec rollout create -f - -o json < spec.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if file == "" {
				return usageErrorf("give the spec with -f FILE (- reads standard input)")
			}
			spec, err := readRolloutSpec(file, cmd.InOrStdin())
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ro, err := c.CreateRollout(cmd.Context(), spec, dsec.CreateRolloutOptions{IdempotencyKey: key})
			if err != nil {
				return err
			}
			if output == "json" {
				return encodeProto(cmd.OutOrStdout(), rolloutProto(ro))
			}
			fmt.Fprintln(cmd.OutOrStdout(), ro.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "the rollout's spec, JSON or YAML (- reads standard input)")
	f.StringVar(&key, "idempotency-key", "", "a retry with this key and the same spec returns the same rollout (kept 24h)")
	f.StringVarP(&output, "output", "o", "table", "output format: table (the ID) or json")
	return cmd
}

// readRolloutSpec reads a spec file (or stdin for -), JSON or YAML.
func readRolloutSpec(file string, stdin io.Reader) (dsec.RolloutSpec, error) {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(io.LimitReader(stdin, 16<<20))
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return dsec.RolloutSpec{}, err
	}
	if t := bytes.TrimSpace(data); len(t) == 0 || t[0] != '{' {
		if data, err = yaml.YAMLToJSON(data); err != nil {
			return dsec.RolloutSpec{}, usageErrorf("%s: neither JSON nor YAML: %v", file, err)
		}
	}
	spec, err := dsec.ParseRolloutSpec(data)
	if err != nil {
		return dsec.RolloutSpec{}, usageErrorf("%s: %v", file, err)
	}
	return spec, nil
}

func newRolloutGetCmd(g *globalFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get [flags] ID",
		Short: "Show a rollout: its members, their sandboxes and states, and its status",
		Long: `Show a rollout by its ID: node, labels, age and time left, each member (name,
role, sandbox ID, state) and the status its members set. -o json prints the
API's own JSON.`,
		Example: `  dsec rollout get ID
  dsec rollout get -o json ID`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ro, err := c.Rollout(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return encodeProto(out, rolloutProto(ro))
			}
			now := time.Now()
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "ID\t%s\nPROJECT\t%s\nNODE\t%s\nLABELS\t%s\nAGE\t%s\nTTL LEFT\t%s\n",
				ro.ID, ro.Project, ro.Node, labelString(ro.Labels), human(now.Sub(ro.CreatedAt)), human(ro.ExpiresAt.Sub(now)))
			fmt.Fprintln(tw, "\nMEMBER\tROLE\tSANDBOX\tSTATE")
			for _, m := range ro.Members {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Name, m.Role, m.SandboxID, m.State)
			}
			if len(ro.Status) > 0 {
				fmt.Fprintln(tw, "\nSTATUS\tVALUE")
				keys := make([]string, 0, len(ro.Status))
				for k := range ro.Status {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range keys {
					v := strings.ReplaceAll(ro.Status[k], "\n", `\n`)
					if len(v) > 100 {
						v = v[:99] + "…"
					}
					fmt.Fprintf(tw, "%s\t%s\n", k, v)
				}
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newRolloutLsCmd(g *globalFlags) *cobra.Command {
	var (
		quiet    bool
		output   string
		selector []string
	)
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List rollouts",
		Long: `List the rollouts your key may see, in ID order: ID, members (running of
all), age, time left, status keys, labels. -l filters by the rollouts' labels
(repeatable, ANDed).`,
		Example: `  dsec rollout ls
  dsec rollout ls -q -l job=ppo-7
  dsec rollout ls -o json`,
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
			ros, err := c.ListRollouts(cmd.Context(), sel)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch {
			case quiet:
				for _, ro := range ros {
					fmt.Fprintln(out, ro.ID)
				}
			case output == "json":
				return encodeProtos(out, ros, rolloutProto)
			default:
				tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tMEMBERS\tAGE\tTTL LEFT\tSTATUS KEYS\tLABELS")
				now := time.Now()
				for _, ro := range ros {
					running := 0
					for _, m := range ro.Members {
						if m.State == dsec.StateRunning {
							running++
						}
					}
					fmt.Fprintf(tw, "%s\t%d/%d running\t%s\t%s\t%d\t%s\n", ro.ID, running, len(ro.Members),
						human(now.Sub(ro.CreatedAt)), human(ro.ExpiresAt.Sub(now)), len(ro.Status), labelString(ro.Labels))
				}
				return tw.Flush()
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&quiet, "quiet", "q", false, "print only IDs")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	f.StringArrayVarP(&selector, "label", "l", nil, "only rollouts with label k=v (repeatable, ANDed)")
	return cmd
}

func newRolloutRmCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rm ID...",
		Short: "Delete rollouts and all their members",
		Long: `Delete each rollout named and every member's sandbox, printing each ID
deleted. A member's sandbox is deleted with its rollout only: dsec rm ID of a
member refuses and names its rollout.`,
		Example: `  dsec rollout rm ID
  dsec rollout rm $(dsec rollout ls -q -l job=ppo-7)`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var first error
			for _, id := range args {
				if err := c.DeleteRollout(cmd.Context(), id); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "dsec: rollout %s: %v\n", id, err)
					if first == nil {
						first = err
					}
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			if first != nil {
				return exitError{125}
			}
			return nil
		},
	}
	return cmd
}

// rolloutProto is a rollout as the API's message, for -o json.
func rolloutProto(ro *dsec.Rollout) *rolloutv1.Rollout {
	out := &rolloutv1.Rollout{
		Id: ro.ID, Project: ro.Project, Node: ro.Node, Labels: ro.Labels, Status: ro.Status,
		CreatedAt: timeProto(ro.CreatedAt), ExpiresAt: timeProto(ro.ExpiresAt),
	}
	for _, m := range ro.Members {
		out.Members = append(out.Members, &rolloutv1.MemberStatus{Name: m.Name, Role: m.Role, SandboxId: m.SandboxID, State: stateProto(m.State)})
	}
	return out
}
