package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newBackendsCmd(g *globalFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "backends",
		Short: "List the backends of every node, with their isolation tier and capabilities",
		Long: `List each node's sandbox backends (what dsec run --backend takes), the isolation
tier of each (process, container, user-kernel, microvm, vm) and what it has:
optional operations (pause, snapshot, network, pack, events) and the
properties it keeps (memory-limit, pids-limit, disk-limit, tty, restart,
sealed-exec, qos). What a backend does not list, it lacks: an operation that
needs it fails with FailedPrecondition naming the backend and the capability.
DEFAULT marks the backend a create that names none gets.`,
		Example: `  dsec backends
  dsec backends -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			bs, err := c.Backends(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				type backendJSON struct {
					Node         string   `json:"node"`
					Name         string   `json:"name"`
					Tier         string   `json:"tier"`
					Capabilities []string `json:"capabilities"`
					Default      bool     `json:"default"`
				}
				js := make([]backendJSON, 0, len(bs))
				for _, b := range bs {
					js = append(js, backendJSON{b.Node, b.Name, b.Tier, append([]string{}, b.Capabilities...), b.Default})
				}
				return encodeJSON(out, js)
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tBACKEND\tTIER\tDEFAULT\tCAPABILITIES")
			for _, b := range bs {
				def := ""
				if b.Default {
					def = "yes"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", b.Node, b.Name, b.Tier, def, strings.Join(b.Capabilities, ","))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}
