package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newPackCmd(g *globalFlags) *cobra.Command {
	var (
		name, output string
		scrub        []string
		write        imageWriteFlags
	)
	cmd := &cobra.Command{
		Use:   "pack ID --name NAME[:TAG] [--scrub PATH]...",
		Short: "Pack a sandbox's changes into a new environment (pack_diff)",
		Long: `Turn what the sandbox changed (its writable layer) into a new read-only layer,
and register NAME[:TAG] as the sandbox's environment plus that layer, with the
config of the image the sandbox was made from. Sandboxes started from NAME:TAG
see the files as the sandbox had them: deleted files stay deleted, replaced
directories stay replaced, owners and modes are kept. Running processes and
memory are not packed.

The sandbox is frozen while its writable layer is read, then runs on.

--scrub PATH (absolute, repeatable) leaves PATH and everything below it out of
the new layer: the new environment shows PATH as the sandbox's environment had
it (caches, scratch files, secrets).

A second pack of the same sandbox while one runs, or a pack of a sandbox being
deleted, fails; wait, or pack before deleting.

The new environment belongs to the key's project and is private unless
--public. Packing onto an existing NAME:TAG needs that image's project (or an
admin key), and --force when the packed layers differ from the image's.`,
		Example: `  dsec pack sb-node1-abc --name task/42:step3
  dsec pack sb-node1-abc --name task/42:step3 --scrub /root/.cache --scrub /tmp
  dsec run -d --count 8 task/42:step3    # branch: 8 sandboxes from the packed state`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if name == "" {
				return usageErrorf("--name is required: the new environment's NAME[:TAG]")
			}
			if err := write.check(); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			p, err := c.Sandbox(args[0]).PackDiffWith(cmd.Context(), name, scrub, write.options()...)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return encodeProto(out, packProto(p))
			}
			fmt.Fprintf(out, "%s\n", p.Image)
			fmt.Fprintf(cmd.ErrOrStderr(), "layer %s: %s, %d names; %d layers in all; frozen %s, took %s\n",
				p.LayerDigest, formatBytes(p.LayerSize), p.Files, len(p.Layers),
				p.Frozen.Round(100_000), p.Duration.Round(100_000))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "the new environment, NAME[:TAG] (tag latest by default)")
	f.StringArrayVar(&scrub, "scrub", nil, "absolute path to leave out of the new layer (repeatable)")
	f.StringVarP(&output, "output", "o", "table", "output: table (the image name on stdout, figures on stderr) or json")
	write.register(f)
	return cmd
}

// formatBytes writes n in powers of 1024 with a unit.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
