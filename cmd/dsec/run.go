package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

type createFlags struct {
	env, labels             []string
	workdir, user, backend  string
	memory, disk            string
	network                 string
	cpus                    float64
	pids                    int64
	ttl, idleTTL, pausedTTL time.Duration
	idleAction              string
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
	fl.DurationVar(&f.idleTTL, "idle-ttl", 0, "delete (or with --idle-action pause, pause) the sandbox after this long without use (default 15m)")
	fl.DurationVar(&f.pausedTTL, "paused-ttl", 0, "delete the sandbox once it has been paused this long (default 24h); paused time counts against neither TTL")
	fl.StringVar(&f.idleAction, "idle-action", "", "what the idle TTL does: delete (the default) or pause (the next request resumes it)")
	fl.StringVar(&f.backend, "backend", "", "isolation backend (default container)")
	fl.StringVar(&f.network, "network", "", networkFlagHelp)
}

func (f *createFlags) options(image string) (dsec.CreateOptions, error) {
	o := dsec.CreateOptions{Image: image, Workdir: f.workdir, User: f.user, CPUs: f.cpus, Pids: f.pids,
		TTL: f.ttl, IdleTTL: f.idleTTL, PausedTTL: f.pausedTTL, Backend: f.backend}
	var err error
	if o.IdleAction, err = idleActionFlag(f.idleAction); err != nil {
		return o, err
	}
	if f.ttl < 0 || f.idleTTL < 0 || f.pausedTTL < 0 {
		return o, usageErrorf("--ttl, --idle-ttl and --paused-ttl must be positive")
	}
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
	if o.Network, err = networkOption(f.network); err != nil {
		return o, err
	}
	return o, nil
}

func newRunCmd(g *globalFlags) *cobra.Command {
	var (
		cf             createFlags
		detach, keep   bool
		keepPartial    bool
		stdinF, tty    bool
		count          int
		idempotencyKey string
	)
	cmd := &cobra.Command{
		Use:   "run [flags] IMAGE [-- CMD...]",
		Short: "Create a sandbox, and run a command or a shell in it",
		Long: `Create a sandbox from IMAGE.

With -d, print the new sandbox's ID and return; with --count N, create N
sandboxes in one batch and print their IDs one per line. When some of the N
cannot be created (the node is full, say), dsec says on standard error how
many were created and why the others failed (each reason once), deletes the
ones it created and exits 125; --keep-partial keeps them instead and prints
their IDs. (With --idempotency-key, a retry of a batch whose created items
were deleted returns them as deleted: retry with a new key.)

With a command, run it, stream its output, delete the sandbox (unless --keep)
and exit with the command's exit code (128+N for signal N, 124 on timeout).
-i streams standard input to it, -t gives it a terminal.

Without a command and without -d, open an interactive shell (/bin/sh on a
terminal) in the new sandbox, and delete the sandbox when it exits (unless
--keep); this needs a terminal.

Ctrl-C (SIGINT), SIGTERM and SIGHUP are passed to the command; a second one
stops waiting for it. Errors of dsec itself exit 125, bad usage 2.`,
		Example: `  dsec run busybox -- echo hello
  dsec run busybox                       # a shell, gone when you exit it
  dsec run -d --count 10 --label job=eval busybox
  dsec run -d --idempotency-key job-42 busybox
  dsec run --memory 2G --cpus 2 -e LANG=C.UTF-8 python -- python3 -c 'print(1)'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			image, argv := args[0], dropDash(args[1:])
			switch {
			case count < 1 || count > dsec.MaxBatch:
				return usageErrorf("--count must be 1 to %d", dsec.MaxBatch)
			case count > 1 && !detach:
				return usageErrorf("--count needs -d")
			case detach && len(argv) > 0:
				return usageErrorf("-d with a command is not supported: create with -d, then `dsec exec -d ID -- CMD`")
			case detach && (stdinF || tty):
				return usageErrorf("-d cannot be combined with -i or -t")
			}
			interactive := !detach && len(argv) == 0
			var term *os.File
			if tty || interactive {
				if term = terminalOf(cmd.InOrStdin()); term == nil {
					if interactive {
						return usageErrorf("dsec run IMAGE without a command opens an interactive shell, which needs a terminal on standard input: give a command (dsec run IMAGE -- CMD...) or use -d")
					}
					return usageErrorf("-t needs a terminal on standard input (drop -t; -i alone streams piped input)")
				}
			}
			if interactive {
				argv = []string{"/bin/sh"}
			}
			opts, err := cf.options(image)
			if err != nil {
				return err
			}
			opts.IdempotencyKey = idempotencyKey
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			if detach {
				return createDetached(ctx, c, opts, count, keepPartial, cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			sb, err := c.Create(ctx, opts)
			if err != nil {
				return err
			}
			noteClamped(cmd.ErrOrStderr(), opts, sb)
			if !keep {
				defer func() {
					dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
					defer cancel()
					if err := sb.Delete(dctx); err != nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "dsec: delete sandbox %s: %v\n", sb.ID, err)
					}
				}()
			} else {
				fmt.Fprintf(cmd.ErrOrStderr(), "sandbox %s kept\n", sb.ID)
			}
			s := &session{sb: sb, req: dsec.ExecRequest{Argv: argv}, stdout: cmd.OutOrStdout(), stderr: cmd.ErrOrStderr(),
				tty: term, warn: cmd.ErrOrStderr(), ephemeral: !keep}
			if stdinF || term != nil {
				s.stdin = cmd.InOrStdin()
			}
			st, err := s.run(ctx)
			return exitOf(sb.ID, st, err)
		},
	}
	cf.register(cmd)
	f := cmd.Flags()
	f.BoolVarP(&detach, "detach", "d", false, "create and print the sandbox ID; do not run anything")
	f.BoolVar(&keep, "keep", false, "keep the sandbox after the command or shell")
	f.BoolVar(&keepPartial, "keep-partial", false, "with --count, when some sandboxes cannot be created, keep (and print) the ones that were instead of deleting them")
	f.IntVar(&count, "count", 1, fmt.Sprintf("with -d, create this many sandboxes in one batch (at most %d)", dsec.MaxBatch))
	f.StringVar(&idempotencyKey, "idempotency-key", "", "retries with the same key and flags return the same sandbox(es) instead of new ones (kept 24h; item i of --count is keyed KEY/i)")
	f.BoolVarP(&stdinF, "interactive", "i", false, "stream standard input to the command")
	f.BoolVarP(&tty, "tty", "t", false, "run the command on a terminal (needs one on standard input; implies -i)")
	f.SetInterspersed(false)
	return cmd
}

// createDetached creates count sandboxes and prints their IDs, one per
// line. When some fail, it says how many and why on errw (each distinct
// reason once) and deletes the ones it made, unless keepPartial, in which
// case their IDs are printed as usual; either way the command fails.
func createDetached(ctx context.Context, c *dsec.Client, opts dsec.CreateOptions, count int, keepPartial bool, out, errw io.Writer) error {
	if count == 1 {
		sb, err := c.Create(ctx, opts)
		if err != nil {
			return err
		}
		if sb.State == dsec.StateDeleted {
			return fmt.Errorf("sandbox %s was made by an earlier run with this --idempotency-key and deleted since: retry with a new key", sb.ID)
		}
		noteClamped(errw, opts, sb)
		fmt.Fprintln(out, sb.ID)
		return nil
	}
	results, err := c.BatchCreate(ctx, opts, count)
	var made []string
	var failures []error
	for _, r := range results {
		switch {
		case r.Err != nil:
			failures = append(failures, r.Err)
		case r.Sandbox.State == dsec.StateDeleted:
			// The item's idempotency key names a sandbox of an earlier
			// run, deleted since (a partly failed batch, say).
			failures = append(failures, errors.New("made by an earlier run with this --idempotency-key and deleted since: retry with a new key"))
		default:
			made = append(made, r.Sandbox.ID)
		}
	}
	if err == nil && len(failures) == 0 {
		if len(results) > 0 {
			noteClamped(errw, opts, results[0].Sandbox) // the same for all: once
		}
		for _, id := range made {
			fmt.Fprintln(out, id)
		}
		return nil
	}
	if err != nil && len(made) == 0 {
		return err
	}
	failed := count - len(made)
	fmt.Fprintf(errw, "dsec: created %d of %d sandboxes; %d failed:\n", len(made), count, failed)
	if err != nil {
		fmt.Fprintf(errw, "dsec:   %v\n", err)
	}
	for _, r := range distinctReasons(failures, 5) {
		fmt.Fprintf(errw, "dsec:   %s\n", r)
	}
	if keepPartial {
		for _, id := range made {
			fmt.Fprintln(out, id)
		}
		return fmt.Errorf("%d of %d sandboxes were not created; the %d created are kept (--keep-partial) and printed above", failed, count, len(made))
	}
	if len(made) == 0 {
		return fmt.Errorf("none of the %d sandboxes was created", count)
	}
	left := deleteAll(ctx, c, made, errw)
	for _, id := range left {
		fmt.Fprintln(out, id)
	}
	if len(left) > 0 {
		return fmt.Errorf("%d of %d sandboxes were not created, and %d of the %d created could not be deleted (their IDs are printed above; delete them with dsec rm)",
			failed, count, len(left), len(made))
	}
	return fmt.Errorf("%d of %d sandboxes were not created; the %d created were deleted (--keep-partial keeps them)", failed, count, len(made))
}

// distinctReasons lists each distinct error of errs once, with how many
// items it stopped, in order of first appearance; past most, the rest are
// counted in a last line.
func distinctReasons(errs []error, most int) []string {
	var order []string
	n := map[string]int{}
	for _, err := range errs {
		msg := err.Error()
		if n[msg] == 0 {
			order = append(order, msg)
		}
		n[msg]++
	}
	var out []string
	for i, msg := range order {
		if i == most {
			rest := 0
			for _, m := range order[most:] {
				rest += n[m]
			}
			other := len(order) - most
			plural := "s"
			if other == 1 {
				plural = ""
			}
			out = append(out, fmt.Sprintf("%d more, for %d other reason%s", rest, other, plural))
			break
		}
		out = append(out, fmt.Sprintf("%d × %s", n[msg], msg))
	}
	return out
}

// deleteAll deletes the sandboxes ids, a few at a time, even when ctx is
// canceled (an interrupted cleanup would leave them running), and returns
// the ones it could not delete, each reported on errw.
func deleteAll(ctx context.Context, c *dsec.Client, ids []string, errw io.Writer) []string {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var (
		mu   sync.Mutex
		left []string // guarded by mu
	)
	var g errgroup.Group
	g.SetLimit(8)
	for _, id := range ids {
		g.Go(func() error {
			if err := c.Delete(dctx, id); err != nil && !errors.Is(err, dsec.ErrNotFound) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintf(errw, "dsec: delete sandbox %s: %v\n", id, err)
				left = append(left, id)
			}
			return nil
		})
	}
	_ = g.Wait()
	slices.Sort(left)
	return left
}

func newExecCmd(g *globalFlags) *cobra.Command {
	var (
		env                  []string
		workdir, user        string
		timeout              time.Duration
		detach, stdinF, tty  bool
		outputLimit, stepKey string
		sf                   sessionFlags
	)
	cmd := &cobra.Command{
		Use:   "exec [flags] ID -- CMD...",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a running sandbox and stream its output.

The exit code is the command's (128+N for signal N, 124 when --timeout killed
it); errors of dsec itself exit 125, bad usage 2. A command whose end was lost
(its node restarted) is an error.

-i streams standard input to the command as it is read and closes the
command's input at its end. -t runs the command on a terminal: the local one
(which must be a terminal) is put in raw mode, keystrokes go to the command,
and window size changes follow; the terminal is restored when dsec returns.
-t implies -i. Output on a terminal is one stream.

With -d, the server starts the command detached: dsec prints its exec ID and
returns while it runs on (dsec attach ID EXEC_ID follows it later).

With --session NAME, the command words are joined into one shell line run in
the sandbox's shell session NAME, made on first use (/bin/bash when the image
has it, else /bin/sh; --shell chooses): cwd, environment, functions, aliases
and background jobs carry over to the session's next command. Each command
still has its own exec ID, stdout, stderr and exit code. A session runs one
command at a time. When a command's shell was lost (its --timeout's grace
period passed, it ended the shell, or the session was deleted) or it ran in a
new shell that replaced a lost one, dsec says so on standard error. dsec
session ls and dsec session rm list and end sessions.

With --sealed, every other process of the sandbox is frozen while the command
runs and thawed afterwards (--sealed=kill kills them instead); the command
runs in the sandbox's mount and pid view as recorded at create, with the
platform's read-only tools first on PATH (/.dsec/bin) and the image's
original layers read-only at /.dsec/image, out of reach of the sandbox's
processes. For graders (see also dsec grade). A result the server does not
report as sealed is an error.

With --step-key KEY, the journal records the command as that step of your
work: an exec with the key of an earlier exec of the sandbox is refused (exit
125, naming it), so a script that lost track of a step finds it (dsec execs
--step-key KEY) instead of running it twice.

Ctrl-C (SIGINT), SIGTERM and SIGHUP are passed to the command; a second one
stops following it (it runs on).`,
		Example: `  dsec exec ID -- ls -l /
  dsec exec -w /tmp -e A=1 ID -- sh -c 'echo $A > a'
  echo data | dsec exec -i ID -- cat
  dsec exec -it ID -- /bin/sh
  dsec exec -d ID -- make -j4
  dsec exec --session main ID -- 'cd /workspace && export MODE=test'
  dsec exec --session main ID -- 'pwd; echo $MODE'
  dsec exec --sealed ID -- /.dsec/bin/sh -c 'cd /workspace && ./run-tests'`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := parseKV("--env", env)
			if err != nil {
				return err
			}
			argv := dropDash(args[1:])
			if len(argv) == 0 {
				return usageErrorf("no command: dsec exec [flags] ID -- CMD...")
			}
			if detach && (stdinF || tty) {
				return usageErrorf("-d cannot be combined with -i or -t: a detached command gets no input")
			}
			var term *os.File
			if tty {
				if term = terminalOf(cmd.InOrStdin()); term == nil {
					return usageErrorf("-t needs a terminal on standard input (drop -t; -i alone streams piped input)")
				}
			}
			req := dsec.ExecRequest{Argv: argv, Env: e, Cwd: workdir, User: user, Timeout: timeout, StepKey: stepKey}
			if err := sf.apply(&req, stdinF, tty); err != nil {
				return err
			}
			if outputLimit != "" {
				if req.OutputLimit, err = dsec.ParseSize(outputLimit); err != nil {
					return usageErrorf("--output-limit: %v", err)
				}
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
			s := &session{sb: sb, req: req, stdout: cmd.OutOrStdout(), stderr: cmd.ErrOrStderr(), tty: term, warn: cmd.ErrOrStderr()}
			if stdinF || tty {
				s.stdin = cmd.InOrStdin()
			}
			st, err := s.run(cmd.Context())
			if err == nil {
				if err := sf.check(cmd.ErrOrStderr(), sb.ID, st); err != nil {
					return err
				}
			}
			return exitOf(sb.ID, st, err)
		},
	}
	f := cmd.Flags()
	sf.register(f)
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVarP(&workdir, "workdir", "w", "", "working directory (default: the sandbox's)")
	f.StringVarP(&user, "user", "u", "", "user: NAME, UID or UID:GID (default: the sandbox's)")
	f.DurationVar(&timeout, "timeout", 0, "kill the command's process group after this long (default: none)")
	f.StringVar(&outputLimit, "output-limit", "", "cap of each output stream, e.g. 64M (default 16M); past it the rest is dropped")
	f.BoolVarP(&detach, "detach", "d", false, "start the command detached, print its exec ID and return")
	f.BoolVarP(&stdinF, "interactive", "i", false, "stream standard input to the command")
	f.BoolVarP(&tty, "tty", "t", false, "run the command on a terminal (needs one on standard input; implies -i)")
	f.StringVar(&stepKey, "step-key", "", "record the command as this step (at most 256 bytes): a second exec with the key is refused")
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
