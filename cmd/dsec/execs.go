package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newAttachCmd(g *globalFlags) *cobra.Command {
	var stdoutOff, stderrOff int64
	cmd := &cobra.Command{
		Use:   "attach [flags] ID EXEC_ID",
		Short: "Follow a command's output and exit",
		Long: `Stream the output of a command (by its exec ID, from dsec exec -d or dsec
execs) from the given byte offsets of stdout and stderr (0 replays it all),
whether it still runs or has ended, then exit with its code: 128+N for
signal N, 124 for a timeout. A command whose end was lost (its node
restarted while it ran) exits 125 with a message; so do errors of dsec.

Ctrl-C stops following; the command runs on. Nothing is sent to the
command (see dsec kill).`,
		Example: `  dsec attach ID EXEC_ID
  dsec attach --stdout-offset 1048576 ID EXEC_ID`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if stdoutOff < 0 || stderrOff < 0 {
				return usageErrorf("offsets must be 0 or more")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
			defer stop()
			sb := c.Sandbox(args[0])
			st, err := sb.Attach(ctx, args[1], stdoutOff, stderrOff, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil && ctx.Err() != nil && cmd.Context().Err() == nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "dsec: stopped following exec %s; it runs on\n", args[1])
				return exitError{130}
			}
			return exitOf(sb.ID, st, err)
		},
	}
	f := cmd.Flags()
	f.Int64Var(&stdoutOff, "stdout-offset", 0, "start stdout at this byte offset")
	f.Int64Var(&stderrOff, "stderr-offset", 0, "start stderr at this byte offset")
	return cmd
}

func newExecsCmd(g *globalFlags) *cobra.Command {
	var (
		output   string
		noTrunc  bool
		stepKeys []string
	)
	cmd := &cobra.Command{
		Use:   "execs [flags] ID",
		Short: "List the commands run in a sandbox",
		Long: `List a sandbox's command journal, oldest first: exec ID, command, when it
started, its status (running, exit N, signal N, timed out, or lost when its
end was not observed; then ", sealed" for a sealed command and ", session
NAME" for one of a shell session, "(shell lost)" when it ended its session's
shell), the bytes of stdout and stderr kept (the offsets dsec attach can
replay from), and its step key (dsec exec --step-key). --step-key lists only
the execs of those step keys.`,
		Example: `  dsec execs ID
  dsec execs -o json ID`,
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
			var opts []dsec.ListExecsOption
			if len(stepKeys) > 0 {
				opts = append(opts, dsec.WithStepKeys(stepKeys...))
			}
			execs, err := c.Sandbox(args[0]).ListExecs(cmd.Context(), opts...)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return encodeProtos(out, execs, execInfoProto)
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EXEC ID\tCOMMAND\tSTARTED\tSTATUS\tSTDOUT\tSTDERR\tSTEP KEY")
			now := time.Now()
			for _, e := range execs {
				command := shellQuote(e.Argv)
				if !noTrunc && len(command) > 40 {
					command = command[:39] + "…"
				}
				key := e.StepKey
				if key == "" {
					key = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s ago\t%s\t%s\t%s\t%s\n", e.ID, command, human(now.Sub(e.StartedAt)), execStatus(e),
					dsec.FormatSize(e.StdoutBytes), dsec.FormatSize(e.StderrBytes), key)
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	f.BoolVar(&noTrunc, "no-trunc", false, "do not shorten long commands")
	f.StringArrayVar(&stepKeys, "step-key", nil, "only the execs with this step key (repeatable)")
	return cmd
}

// execStatus describes how an exec ended, or that it runs, and whether it
// ran sealed or in a session.
func execStatus(e dsec.ExecInfo) string {
	s := execEnd(e)
	if e.Sealed {
		s += ", sealed"
	}
	if e.Session != "" {
		s += ", session " + e.Session
		if e.Exit != nil && e.Exit.SessionLost {
			s += " (shell lost)"
		}
	}
	return s
}

// execEnd describes how an exec ended, or that it runs.
func execEnd(e dsec.ExecInfo) string {
	st := e.Exit
	switch {
	case e.Running || st == nil:
		return "running"
	case st.Lost:
		return "lost"
	case st.TimedOut:
		return "timed out"
	case st.Signal != 0:
		s := "signal " + strconv.Itoa(st.Signal)
		if name := signalName(st.Signal); name != "" {
			s += " (" + name + ")"
		}
		if st.OOMKilled {
			s += ", out of memory"
		}
		return s
	}
	return "exit " + strconv.Itoa(st.ExitCode)
}

// shellQuote joins argv the way a shell would read it back.
func shellQuote(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && !strings.ContainsFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) {
			parts[i] = a
			continue
		}
		parts[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(parts, " ")
}

func newKillCmd(g *globalFlags) *cobra.Command {
	var sig string
	cmd := &cobra.Command{
		Use:   "kill [-s SIGNAL] ID EXEC_ID",
		Short: "Send a signal to a command",
		Long: `Send a signal to a command's process group in a sandbox (the sandbox keeps
running; dsec rm deletes it). SIGNAL is a name (TERM, KILL, INT, HUP, USR1,
with or without SIG) or a Linux signal number.`,
		Example: `  dsec kill ID EXEC_ID
  dsec kill -s KILL ID EXEC_ID
  dsec kill -s 2 ID EXEC_ID`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := parseSignal(sig)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			return c.Sandbox(args[0]).Signal(cmd.Context(), args[1], n)
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "TERM", "signal name or number")
	return cmd
}

// checkOutput checks an -o flag.
func checkOutput(output string) error {
	if output != "table" && output != "json" {
		return usageErrorf("-o %q: use table or json", output)
	}
	return nil
}

// encodeJSON writes v as indented JSON.
func encodeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isNotFound reports whether err is the API's NotFound.
func isNotFound(err error) bool { return errors.Is(err, dsec.ErrNotFound) }
