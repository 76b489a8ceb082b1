package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

type createFlags struct {
	env, labels            []string
	workdir, user, backend string
	memory, disk           string
	cpus                   float64
	pids                   int64
	ttl, idleTTL           time.Duration
}

func (f *createFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE for every exec (repeatable)")
	fl.StringArrayVar(&f.labels, "label", nil, "label k=v (repeatable)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "working directory of execs (default: the image's, else /)")
	fl.StringVarP(&f.user, "user", "u", "", "user of execs: NAME, UID or UID:GID (default: the image's, else root)")
	fl.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512M or 2G (default 512M)")
	fl.Float64Var(&f.cpus, "cpus", 0, "CPU cap in cores, may be fractional (default 1)")
	fl.Int64Var(&f.pids, "pids", 0, "most processes and threads (default 4096)")
	fl.StringVar(&f.disk, "disk", "", "writable layer size, e.g. 10G (default 10G)")
	fl.DurationVar(&f.ttl, "ttl", 0, "hard TTL: delete the sandbox this long after creation (default 1h)")
	fl.DurationVar(&f.idleTTL, "idle-ttl", 0, "delete the sandbox after this long without use (default 15m)")
	fl.StringVar(&f.backend, "backend", "", "isolation backend (default container)")
}

func (f *createFlags) options(image string) (dsec.CreateOptions, error) {
	o := dsec.CreateOptions{Image: image, Workdir: f.workdir, User: f.user, CPUs: f.cpus, Pids: f.pids,
		TTL: f.ttl, IdleTTL: f.idleTTL, Backend: f.backend}
	var err error
	if o.Env, err = parseKV("--env", f.env); err != nil {
		return o, err
	}
	if o.Labels, err = parseKV("--label", f.labels); err != nil {
		return o, err
	}
	if f.memory != "" {
		if o.Memory, err = dsec.ParseSize(f.memory); err != nil {
			return o, fmt.Errorf("--memory: %w", err)
		}
	}
	if f.disk != "" {
		if o.Disk, err = dsec.ParseSize(f.disk); err != nil {
			return o, fmt.Errorf("--disk: %w", err)
		}
	}
	return o, nil
}

func newRunCmd(g *globalFlags) *cobra.Command {
	var (
		cf     createFlags
		detach bool
		keep   bool
		count  int
	)
	cmd := &cobra.Command{
		Use:   "run [flags] IMAGE [-- CMD...]",
		Short: "Create a sandbox, and run a command in it",
		Long: `Create a sandbox from IMAGE.

With -d, print the new sandbox's ID (one per line with --count) and return.
With a command, run it, stream its output, delete the sandbox (unless --keep)
and exit with the command's exit code (128+N for signal N, 124 on timeout).
Errors of dsec itself exit 125.`,
		Example: `  dsec run busybox -- echo hello
  dsec run -d --count 10 --label job=eval busybox
  dsec run --memory 2G --cpus 2 -e LANG=C.UTF-8 python -- python3 -c 'print(1)'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			image, argv := args[0], dropDash(args[1:])
			if count < 1 {
				return usageErrorf("--count must be at least 1")
			}
			if count > 1 && !detach {
				return usageErrorf("--count needs -d")
			}
			if !detach && len(argv) == 0 {
				return usageErrorf("interactive shells (dsec run IMAGE without a command) need TTY exec, which this build lacks: use -d, or give a command after --")
			}
			opts, err := cf.options(image)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			if detach {
				for range count {
					sb, err := c.Create(ctx, opts)
					if err != nil {
						return err
					}
					fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
				}
				if len(argv) > 0 {
					return usageErrorf("-d with a command is not supported: create with -d, then `dsec exec -d ID -- CMD`")
				}
				return nil
			}
			sb, err := c.Create(ctx, opts)
			if err != nil {
				return err
			}
			if !keep {
				defer func() {
					dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
					defer cancel()
					if err := sb.Delete(dctx); err != nil {
						fmt.Fprintf(os.Stderr, "dsec: delete sandbox %s: %v\n", sb.ID, err)
					}
				}()
			} else {
				fmt.Fprintf(cmd.ErrOrStderr(), "sandbox %s kept\n", sb.ID)
			}
			st, err := sb.ExecStream(ctx, dsec.ExecRequest{Argv: argv}, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if code := st.Code(); code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	cf.register(cmd)
	f := cmd.Flags()
	f.BoolVarP(&detach, "detach", "d", false, "create and print the sandbox ID; do not run anything")
	f.BoolVar(&keep, "keep", false, "keep the sandbox after the command")
	f.IntVar(&count, "count", 1, "with -d, create this many sandboxes")
	f.SetInterspersed(false)
	return cmd
}

func newExecCmd(g *globalFlags) *cobra.Command {
	var (
		env            []string
		workdir, user  string
		timeout        time.Duration
		detach, stdinF bool
		tty            bool
	)
	cmd := &cobra.Command{
		Use:   "exec [flags] ID -- CMD...",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a running sandbox and stream its output.

The exit code is the command's (128+N for signal N, 124 when --timeout killed
it); errors of dsec itself exit 125. With -d, print the exec ID and return
while the command runs on. With -i, standard input is read to its end and given
to the command.`,
		Example: `  dsec exec ID -- ls -l /
  dsec exec -w /tmp -e A=1 ID -- sh -c 'echo $A > a'
  echo data | dsec exec -i ID -- cat`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tty {
				return usageErrorf("-t (TTY exec) is not in this build yet")
			}
			e, err := parseKV("--env", env)
			if err != nil {
				return err
			}
			argv := dropDash(args[1:])
			if len(argv) == 0 {
				return usageErrorf("no command: dsec exec [flags] ID -- CMD...")
			}
			req := dsec.ExecRequest{Argv: argv, Env: e, Cwd: workdir, User: user, Timeout: timeout}
			if stdinF {
				data, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 64<<20+1))
				if err != nil {
					return err
				}
				if len(data) > 64<<20 {
					return usageErrorf("-i: standard input is over 64 MiB; copy large data in with dsec cp")
				}
				req.Stdin = data
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			sb := c.Sandbox(args[0])
			if detach {
				id, err := sb.ExecDetached(cmd.Context(), req)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
				return nil
			}
			st, err := sb.ExecStream(cmd.Context(), req, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if code := st.Code(); code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVarP(&workdir, "workdir", "w", "", "working directory (default: the sandbox's)")
	f.StringVarP(&user, "user", "u", "", "user: NAME, UID or UID:GID (default: the sandbox's)")
	f.DurationVar(&timeout, "timeout", 0, "kill the command's process group after this long (default: none)")
	f.BoolVarP(&detach, "detach", "d", false, "print the exec ID and return; the command runs on")
	f.BoolVarP(&stdinF, "interactive", "i", false, "pass standard input to the command")
	f.BoolVarP(&tty, "tty", "t", false, "allocate a terminal (not yet supported)")
	f.SetInterspersed(false)
	return cmd
}

// dropDash removes the "--" that separates a command from dsec's flags
// (flag parsing stops at the first argument, so it reaches us).
func dropDash(args []string) []string {
	if len(args) > 0 && args[0] == "--" {
		return args[1:]
	}
	return args
}
