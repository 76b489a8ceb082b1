package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newProjectCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "project",
		Short: "Show and set per-project limits",
		Long: `A project is what an API key acts in: its sandboxes, its images. An
administrator bounds each project's live sandboxes (how many, and the sum of
their memory limits, on all nodes together) and the longest TTL its
sandboxes may ask for (7 days unless set).`,
	}
	cmd.AddCommand(newProjectLimitsCmd(g), newProjectLsCmd(g))
	return cmd
}

func newProjectLimitsCmd(g *globalFlags) *cobra.Command {
	var (
		memory, output string
		sandboxes      int64
		maxTTL         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "limits [NAME] [--memory SIZE] [--sandboxes N] [--max-ttl DURATION]",
		Short: "Show a project's limits and usage, or set them (admin keys only)",
		Long: `Without flags, show the limits of project NAME (default: the key's own; other
projects need an admin key) and what its live sandboxes hold now. With flags,
set those limits (admin keys only); the others keep their values.

Creates that would take a project over its sandbox count or memory are
refused with ResourceExhausted naming the project and the limit; a create or
a TTL change asking for a hard or idle TTL above --max-ttl is InvalidArgument.
Limits apply within a second on every API server; sandboxes already running
are not touched. Paused, exited and failed sandboxes count until deleted.`,
		Example: `  dsec project limits rl-team --memory 200G --sandboxes 2000
  dsec project limits rl-team --max-ttl 2d
  dsec project limits rl-team --memory 0   # no memory limit
  dsec project limits                      # the key's own project`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			var u dsec.LimitsUpdate
			f := cmd.Flags()
			if f.Changed("memory") {
				n, err := dsec.ParseSize(memory)
				if err != nil || n < 0 {
					return usageErrorf("--memory %q: want a size like 200G, or 0 for no limit", memory)
				}
				u.MemoryBytes = &n
			}
			if f.Changed("sandboxes") {
				if sandboxes < 0 {
					return usageErrorf("--sandboxes %d: want 0 (no limit) or more", sandboxes)
				}
				u.Sandboxes = &sandboxes
			}
			if f.Changed("max-ttl") {
				if maxTTL <= 0 {
					return usageErrorf("--max-ttl: want a positive duration like 7d or 12h")
				}
				u.MaxTTL = &maxTTL
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var p *dsec.Project
			if u == (dsec.LimitsUpdate{}) {
				p, err = c.GetProject(cmd.Context(), name)
			} else {
				if name == "" {
					return usageErrorf("name the project whose limits to set")
				}
				p, err = c.SetProjectLimits(cmd.Context(), name, u)
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return encodeJSON(out, projectJSONOf(p))
			}
			printProject(out, p)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&memory, "memory", "", "most memory the project's live sandboxes may hold together, as the sum of their limits (e.g. 200G; 0: no limit)")
	f.Int64Var(&sandboxes, "sandboxes", 0, "most sandboxes the project may have live at once (0: no limit)")
	f.Var(dayDuration{&maxTTL}, "max-ttl", "longest hard or idle TTL the project's sandboxes may ask for (e.g. 7d, 12h; default 7d)")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func limitOf(n int64, format func(int64) string) string {
	if n <= 0 {
		return "none"
	}
	return format(n)
}

func printProject(w io.Writer, p *dsec.Project) {
	count := func(n int64) string { return fmt.Sprint(n) }
	fmt.Fprintf(w, "Project:    %s\n", p.Name)
	fmt.Fprintf(w, "Sandboxes:  %d (limit %s)\n", p.Sandboxes, limitOf(p.Limits.Sandboxes, count))
	fmt.Fprintf(w, "Memory:     %s (limit %s)\n", dsec.FormatSize(p.MemoryBytes), limitOf(p.Limits.MemoryBytes, dsec.FormatSize))
	fmt.Fprintf(w, "Max TTL:    %s\n", formatDays(p.Limits.MaxTTL))
}

// projectJSON is a project as the API's JSON names its fields.
type projectJSON struct {
	Name   string `json:"name"`
	Limits struct {
		MemoryBytes int64  `json:"memoryBytes"`
		Sandboxes   int64  `json:"sandboxes"`
		MaxTTL      string `json:"maxTtl"`
	} `json:"limits"`
	Usage struct {
		MemoryBytes int64 `json:"memoryBytes"`
		Sandboxes   int64 `json:"sandboxes"`
	} `json:"usage"`
	Keys int64 `json:"keys,omitempty"`
}

func projectJSONOf(p *dsec.Project) projectJSON {
	var j projectJSON
	j.Name, j.Keys = p.Name, p.Keys
	j.Limits.MemoryBytes, j.Limits.Sandboxes = p.Limits.MemoryBytes, p.Limits.Sandboxes
	j.Limits.MaxTTL = fmt.Sprintf("%ds", int64(p.Limits.MaxTTL/time.Second))
	j.Usage.MemoryBytes, j.Usage.Sandboxes = p.MemoryBytes, p.Sandboxes
	return j
}

func newProjectLsCmd(g *globalFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the projects that have keys or limits (admin keys only)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ps, err := c.ListProjects(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				js := make([]projectJSON, 0, len(ps))
				for _, p := range ps {
					js = append(js, projectJSONOf(p))
				}
				return encodeJSON(out, js)
			}
			count := func(n int64) string { return fmt.Sprint(n) }
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PROJECT\tKEYS\tSANDBOXES\tLIMIT\tMEMORY\tLIMIT\tMAX TTL")
			for _, p := range ps {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\n", p.Name, p.Keys, p.Sandboxes, limitOf(p.Limits.Sandboxes, count),
					dsec.FormatSize(p.MemoryBytes), limitOf(p.Limits.MemoryBytes, dsec.FormatSize), formatDays(p.Limits.MaxTTL))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}
