//go:build !dsec_client

package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/purge"
)

func newPurgeCmd(g *globalFlags) *cobra.Command {
	var (
		yes, keepImages bool
		cgroupParent    string
	)
	cmd := &cobra.Command{
		Use:   "purge",
		Short: verbShort("purge"),
		Long: `Stop dsec up and the node keeper, kill every sandbox, and remove every mount,
cgroup, loop device, runtime state and file dsec made for the state directory
(--state-dir). Sandboxes and their files are lost. It works from what is on disk
and in the kernel, so it also cleans up after a crash.

With --keep-images, the layer store, images and API keys stay; only sandboxes and
node state are removed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			stateDir := g.resolvedStateDir()
			if !yes {
				fmt.Fprintf(cmd.ErrOrStderr(), "This deletes every sandbox and removes %s. Type yes to go on: ", stateDir)
				line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if strings.TrimSpace(line) != "yes" {
					return usageErrorf("not confirmed (pass --yes to skip the question)")
				}
			}
			if os.Geteuid() != 0 {
				return usageErrorf("purge needs root")
			}
			return purge.Run(cmd.Context(), purge.Config{
				StateDir: stateDir, CgroupParent: cgroupParent, KeepImages: keepImages, Out: cmd.OutOrStdout(),
			})
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	f.BoolVar(&keepImages, "keep-images", false, "keep the layer store, images and API keys")
	f.StringVar(&cgroupParent, "cgroup-parent", "", "cgroup holding the sandboxes (default: what dsec up recorded, else dsec)")
	return cmd
}
