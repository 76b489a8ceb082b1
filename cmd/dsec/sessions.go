package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// sessionFlags are dsec exec's flags for shell sessions and sealed execs.
type sessionFlags struct {
	session, shell, sealed string
}

func (f *sessionFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.session, "session", "", "run the command words, joined into one shell line, in the sandbox's shell session NAME (made on first use); cwd, environment and jobs carry over between its commands")
	fl.StringVar(&f.shell, "shell", "", "shell of a new --session (default /bin/bash when the image has it, else /bin/sh); ignored for a session that exists")
	fl.StringVar(&f.sealed, "sealed", "", "run sealed: freeze the sandbox's other processes while the command runs (--sealed=kill kills them), in the view recorded at create, with the platform's tools at /.dsec/bin")
	fl.Lookup("sealed").NoOptDefVal = "freeze"
}

// apply puts the flags into req, whose Argv holds the command words.
func (f *sessionFlags) apply(req *dsec.ExecRequest, stdin, tty bool) error {
	switch f.sealed {
	case "":
	case "freeze":
		req.Sealed = dsec.SealFreeze
	case "kill":
		req.Sealed = dsec.SealKill
	default:
		return usageErrorf("--sealed=%q: use --sealed (freeze the sandbox's other processes) or --sealed=kill (kill them)", f.sealed)
	}
	if f.session == "" {
		if f.shell != "" {
			return usageErrorf("--shell chooses the shell of a --session: give --session NAME too")
		}
		return nil
	}
	if stdin || tty {
		return usageErrorf("--session cannot be combined with -i or -t: a session's command reads no input (run an interactive shell with dsec exec -it ID -- sh)")
	}
	req.Session, req.SessionShell = f.session, f.shell
	req.Shell, req.Argv = strings.Join(req.Argv, " "), nil
	return nil
}

// check reports, after a command ended, what became of its session, and
// refuses a result that was asked sealed but does not say it ran so.
func (f *sessionFlags) check(w io.Writer, sandboxID string, st *dsec.ExitStatus) error {
	if st == nil {
		return nil
	}
	if f.sealed != "" && !st.Sealed && !st.Lost {
		return fmt.Errorf("exec %s in sandbox %s: asked to run sealed, but the server does not report it sealed (is it older than this dsec?): do not trust its result", st.ExecID, sandboxID)
	}
	sessionNotes(w, f.session, st)
	return nil
}

// sessionNotes writes dsec's notes on a session command's shell to w.
func sessionNotes(w io.Writer, session string, st *dsec.ExitStatus) {
	if session == "" || st == nil {
		return
	}
	if st.SessionRestarted {
		fmt.Fprintf(w, "dsec: session %s: its earlier shell was lost; this command ran in a new shell (cwd, environment and jobs set before are gone)\n", session)
	}
	if st.SessionLost {
		why := "it ended, or the session was deleted"
		if st.TimedOut {
			why = "the command timed out and did not stop when interrupted"
		}
		fmt.Fprintf(w, "dsec: session %s: the session's shell was lost (%s); the next command gets a new shell\n", session, why)
	}
}

func newSessionCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "List and end a sandbox's shell sessions",
		Long: `A shell session is a named shell in a sandbox that lives on between commands,
so that cwd, environment, functions, aliases and background jobs carry from
one command to the next. dsec exec --session NAME ID -- 'CMD' makes one on
first use and runs commands in it; these commands list and end them.`,
		Example: `  dsec exec --session main ID -- 'cd /workspace && export MODE=test'
  dsec session ls ID
  dsec session rm ID main`,
	}
	cmd.AddCommand(newSessionLsCmd(g), newSessionRmCmd(g))
	return cmd
}

func newSessionLsCmd(g *globalFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "ls [flags] ID",
		Short: "List a sandbox's shell sessions",
		Long: `List a sandbox's shell sessions by name: the shell, how many commands ran in
it, the command running now (its exec ID), and when it was made.`,
		Example: `  dsec session ls ID
  dsec session ls -o json ID`,
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
			sessions, err := c.Sandbox(args[0]).ListSessions(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return encodeProtos(out, sessions, sessionProto)
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSHELL\tCOMMANDS\tRUNNING\tCREATED")
			now := time.Now()
			for _, s := range sessions {
				running := s.RunningExecID
				if running == "" {
					running = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s ago\n", s.Name, s.Shell, s.Commands, running, human(now.Sub(s.CreatedAt)))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newSessionRmCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID NAME...",
		Short: "End shell sessions",
		Long: `End a sandbox's shell sessions: each one's shell and every process it started
are killed; a command running in it ends with its session lost. A session
that does not exist is an error (exit 125) after the others are ended.`,
		Example: `  dsec session rm ID main
  dsec session rm ID agent-1 agent-2`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			sb := c.Sandbox(args[0])
			failed := 0
			for _, name := range args[1:] {
				if err := sb.DeleteSession(cmd.Context(), name); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "dsec: session %s: %v\n", name, err)
					failed++
				}
			}
			if failed > 0 {
				return exitError{125}
			}
			return nil
		},
	}
}
