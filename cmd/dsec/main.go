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
	"slices"
	"strings"

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
	root := newRootCmdFor(verbOf(os.Args[1:]))
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

// newRootCmd returns the root command with every verb.
func newRootCmd() *cobra.Command { return newRootCmdFor("") }

// clientVerb makes one of the API's verbs.
type clientVerb struct {
	name string
	cmd  func(*globalFlags) *cobra.Command
}

// clientVerbs are the API's verbs, in the order of help.
var clientVerbs = []clientVerb{
	{"run", newRunCmd}, {"exec", newExecCmd}, {"attach", newAttachCmd}, {"execs", newExecsCmd},
	{"session", newSessionCmd}, {"grade", newGradeCmd}, {"kill", newKillCmd}, {"ps", newPsCmd},
	{"stats", newStatsCmd}, {"timeout", newTimeoutCmd}, {"label", newLabelCmd}, {"net", newNetCmd},
	{"watch", newWatchCmd}, {"rm", newRmCmd}, {"pause", newPauseCmd}, {"resume", newResumeCmd},
	{"cp", newCpCmd}, {"port", newPortCmd},
	{"fs", newFsCmd}, {"image", newImageCmd}, {"pack", newPackCmd}, {"key", newKeyCmd},
	{"project", newProjectCmd}, {"backends", newBackendsCmd}, {"rollout", newRolloutCmd},
}

// verbOf returns the verb args name (skipping the root's flags before it),
// or "" when they name none or ask for help or the version.
func verbOf(args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--addr" || a == "--api-key" || a == "--state-dir":
			i++ // its value
		case strings.HasPrefix(a, "--addr=") || strings.HasPrefix(a, "--api-key=") || strings.HasPrefix(a, "--state-dir="):
		case strings.HasPrefix(a, "-"):
			return "" // --help, --version, --, or a mistake: cobra says which
		default:
			return a
		}
	}
	return ""
}

// newRootCmdFor returns the root command with, when verb is one of
// clientVerbs, that verb alone beside the platform's: making every verb
// and its flags is about 0.3 ms of a dsec exec's start (bench/cli). For
// any other verb, help and completion, it has every verb.
func newRootCmdFor(verb string) *cobra.Command {
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
	only := slices.IndexFunc(clientVerbs, func(v clientVerb) bool { return v.name == verb })
	for i, v := range clientVerbs {
		if only < 0 || i == only {
			root.AddCommand(v.cmd(g))
		}
	}
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
