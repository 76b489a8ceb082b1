// Command dsec is the whole platform: `dsec up` runs it on one machine,
// the other verbs are its command-line client, and hidden verbs serve as
// the node keeper. It is built twice (make build, both static; see
// platform.go): bin/dsec-node runs every verb and is also each sandbox's
// init and the exec helper (see internal/nsexec, which takes over before
// the Go runtime starts); bin/dsec, the command line users run, has only
// the client's verbs and hands the platform's to dsec-node, so that a
// command such as dsec exec starts without the server's initialisation.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" {
			if dirty {
				rev += "-dirty"
			}
			return "dev-" + rev
		}
	}
	return "dev"
}

// exitError carries a process exit code (an exec'd command's) without a
// message.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func main() {
	checkForwarded()
	root := newRootCmd()
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		os.Exit(ee.code)
	default:
		fmt.Fprintln(os.Stderr, "dsec:", err)
		os.Exit(exitCodeOf(err))
	}
}

func newRootCmd() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:   "dsec",
		Short: "Elastic sandboxes for AI agents",
		Long: `dsec creates isolated, stateful sandboxes for agents and runs their commands.

Start the platform on this machine with "dsec up -d", then:
  dsec image build busybox --from-dir ./rootfs
  dsec run busybox -- echo hello
  dsec run -d busybox            # prints a sandbox ID
  dsec exec ID -- ls /
  dsec exec -it ID -- sh
  dsec cp ./project ID:/work
  dsec ps`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildVersion(),
	}
	root.PersistentFlags().StringVar(&g.addr, "addr", "", "API address (default $DSEC_ADDR, the config file, or http://127.0.0.1:7420)")
	root.PersistentFlags().StringVar(&g.apiKey, "api-key", "", "API key (default $DSEC_API_KEY, ~/.config/dsec/config.toml, or <state-dir>/admin.key)")
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", "", "state directory of a local dsec (default $DSEC_STATE_DIR or /var/lib/dsec)")
	root.AddCommand(platformCmds(g)...)
	root.AddCommand(
		newRunCmd(g),
		newExecCmd(g),
		newAttachCmd(g),
		newExecsCmd(g),
		newSessionCmd(g),
		newGradeCmd(g),
		newKillCmd(g),
		newPsCmd(g),
		newStatsCmd(g),
		newTimeoutCmd(g),
		newLabelCmd(g),
		newNetCmd(g),
		newWatchCmd(g),
		newRmCmd(g),
		newCpCmd(g),
		newPortCmd(g),
		newFsCmd(g),
		newImageCmd(g),
		newPackCmd(g),
		newKeyCmd(g),
		newProjectCmd(g),
		newBackendsCmd(g),
	)
	markUsageErrors(root)
	return root
}

// markUsageErrors makes cobra's flag and argument errors of cmd and its
// subcommands usage errors (exit 2).
func markUsageErrors(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageErrorf("%v (see %s --help)", err, c.CommandPath())
	})
	if args := cmd.Args; args != nil {
		cmd.Args = func(c *cobra.Command, a []string) error {
			if err := args(c, a); err != nil {
				return usageErrorf("%v (see %s --help)", err, c.CommandPath())
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		markUsageErrors(sub)
	}
}

// globalFlags are the flags every client command shares.
type globalFlags struct {
	addr, apiKey, stateDir string
}
