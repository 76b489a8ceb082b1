//go:build !dsec_client

package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/swap"
	"github.com/dsecproject/dsec/internal/uplock"
)

func newDownCmd(g *globalFlags) *cobra.Command {
	var (
		all, yes bool
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "down",
		Short: verbShort("down"),
		Long: `Stop the "dsec up" of this state directory (--state-dir) and wait until it has
exited, as Ctrl-C or SIGTERM to it would: the platform stops, the sandboxes keep
running under the node keeper, and the next "dsec up" finds them again. The swap
file of "dsec up --swap" is turned off and removed (paused sandboxes stay paused,
their memory back in RAM).

With --all it also deletes every sandbox (their files are lost) and stops the
node keeper. It asks first; -y/--yes skips the question, and without a terminal
to ask on it refuses unless --yes. Images, keys and the state directory stay
(to remove everything, see "dsec purge").

When no dsec up runs it says so and exits 0 (with --all it still deletes the
sandboxes of a keeper left running). It exits 125 when dsec up does not exit
within --timeout.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			stateDir := g.resolvedStateDir()
			if all && !yes {
				if !isTerminal(os.Stdin.Fd()) {
					return usageErrorf("--all deletes every sandbox: pass --yes to confirm (there is no terminal to ask on)")
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "This stops dsec up and the node keeper and deletes every sandbox of %s. Type yes to go on: ", stateDir)
				line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if strings.TrimSpace(line) != "yes" {
					return usageErrorf("not confirmed (pass --yes to skip the question)")
				}
			}
			out := cmd.OutOrStdout()
			rec, running, err := uplock.Running(stateDir)
			if errors.Is(err, os.ErrPermission) {
				return fmt.Errorf("cannot read %s/run: run dsec down as root (or as the user that runs dsec up)", stateDir)
			}
			if err != nil {
				return err
			}
			if running {
				if err := stopUp(rec, timeout, stateDir); err != nil {
					return err
				}
				fmt.Fprintf(out, "stopped dsec up (pid %d)\n", rec.Pid)
			}
			// dsec up turns its swap file off as it stops; one it left
			// on (it was killed, or its swapoff failed) goes here.
			if sw, err := swap.Disable(stateDir, nil); err != nil {
				return fmt.Errorf("turn off dsec's swap file %s: %w", sw.Path, err)
			} else if sw.Path != "" {
				fmt.Fprintf(out, "turned off and removed the swap file %s\n", sw.Path)
			}
			if !running && !all {
				fmt.Fprintf(out, "dsec is not running (state dir %s)\n", stateDir)
				return nil
			}
			if !all {
				return nil
			}
			return stopKeeper(cmd, stateDir, timeout)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&all, "all", false, "also delete every sandbox and stop the node keeper")
	f.BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation (with --all)")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for dsec up (and with --all the keeper) to exit")
	return cmd
}

// stopUp sends SIGTERM to the recorded, verified dsec up and waits until
// it has exited.
func stopUp(rec uplock.Record, timeout time.Duration, stateDir string) error {
	if err := syscall.Kill(rec.Pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop dsec up (pid %d): %v", rec.Pid, err)
	}
	deadline := time.Now().Add(timeout)
	for rec.Alive() {
		if time.Now().After(deadline) {
			return fmt.Errorf("dsec up (pid %d) did not exit within %s after SIGTERM: see %s/logs/dsec.log, wait longer (--timeout) or kill -9 %d",
				rec.Pid, timeout, stateDir, rec.Pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// stopKeeper has the node keeper delete every sandbox and exit.
func stopKeeper(cmd *cobra.Command, stateDir string, timeout time.Duration) error {
	out := cmd.OutOrStdout()
	kc := keeper.NewClient(stateDir)
	defer kc.Close()
	v, err := kc.Version(cmd.Context())
	if err != nil {
		fmt.Fprintln(out, "the node keeper is not running")
		return nil
	}
	keeperRec := uplock.Record{Pid: v.Pid}
	keeperRec.StartTime, err = uplock.StartTime(v.Pid)
	if err != nil {
		return fmt.Errorf("node keeper (pid %d): %v", v.Pid, err)
	}
	if err := kc.Shutdown(cmd.Context(), true); err != nil {
		return fmt.Errorf("stop the node keeper (pid %d): %w; to remove everything, run dsec purge", v.Pid, err)
	}
	deadline := time.Now().Add(timeout)
	for keeperRec.Alive() {
		if time.Now().After(deadline) {
			return fmt.Errorf("the node keeper (pid %d) did not exit within %s: see %s/logs, or remove everything with dsec purge", v.Pid, timeout, stateDir)
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintf(out, "deleted every sandbox and stopped the node keeper (pid %d)\n", v.Pid)
	return nil
}
