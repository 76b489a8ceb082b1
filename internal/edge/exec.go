package edge

import (
	"context"
	"errors"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// ExecParams is an exec request.
type ExecParams struct {
	Sandbox string
	Argv    []string
	Shell   string
	Env     map[string]string
	Cwd     string
	User    string
	Stdin   []byte
	Timeout time.Duration
	// StdinOpen keeps stdin open for WriteStdin.
	StdinOpen bool
	// TTY runs the command on a terminal of Rows x Cols.
	TTY         bool
	Rows, Cols  uint16
	OutputLimit int64
	// Detach returns after the started event.
	Detach bool
	// Session runs Shell in the sandbox's shell session of this name;
	// SessionShell is a new session's shell.
	Session      string
	SessionShell string
	// Seal runs the command sealed (backends with CapSealedExec); a shell
	// command then runs in the platform's /.dsec/bin/sh, not the
	// sandbox's /bin/sh.
	Seal sandbox.Seal
	// StepKey names the step in the sandbox's journal (backends with
	// CapStepKeys): a second exec with it is AlreadyExists.
	StepKey string
}

// ExecEvent is one event of an exec stream; exactly one field is set.
type ExecEvent struct {
	Started   string // exec ID
	Output    *Chunk
	Exit      *sandbox.ExitStatus
	Keepalive bool
}

// Chunk is a piece of one output stream at an offset.
type Chunk struct {
	Stream sandbox.Stream
	Offset int64
	Data   []byte
}

const (
	chunkSize         = 256 << 10
	keepaliveInterval = 10 * time.Second
	maxPollDelay      = 25 * time.Millisecond
)

// sealedShell runs the shell command of a sealed exec: the platform's
// static busybox, which the sandbox cannot change.
const sealedShell = "/.dsec/bin/sh"

// defaultPath is the PATH of an exec whose image sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Exec runs a command and calls send for each event until the command
// has exited and its output is sent. If send fails or ctx ends, the
// command keeps running.
//
// A paused sandbox is resumed first (ready), once the request is known to
// be good.
func (e *Edge) Exec(ctx context.Context, caller Caller, p ExecParams, send func(ExecEvent) error) error {
	r, err := e.lookup(caller, p.Sandbox)
	if err != nil {
		return err
	}
	argv := p.Argv
	switch {
	case p.Session != "" && (len(argv) > 0 || p.Shell == ""):
		return errdefs.Newf(errdefs.ErrInvalidArgument, "a session command is a shell command line: give shell, not argv")
	case p.Session != "" && (p.TTY || p.StdinOpen):
		return errdefs.Newf(errdefs.ErrInvalidArgument, "a session command runs without a terminal and takes its stdin whole: drop tty and stdin_open")
	case p.Session != "" && p.Seal != sandbox.SealNone:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "a session command cannot be sealed: run the sealed command without session")
	case p.Session != "":
		argv = []string{p.Shell}
	case p.SessionShell != "":
		return errdefs.Newf(errdefs.ErrInvalidArgument, "session_shell needs session")
	case len(argv) > 0 && p.Shell != "":
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec takes argv or a shell command, not both")
	case p.Shell != "" && p.Seal != sandbox.SealNone:
		argv = []string{sealedShell, "-c", p.Shell}
	case p.Shell != "":
		argv = []string{"/bin/sh", "-c", p.Shell}
	case len(argv) == 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: no command")
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: an argument holds a NUL byte")
		}
	}
	if err := validateEnv(p.Env); err != nil {
		return err
	}
	if p.Timeout < 0 || p.OutputLimit < 0 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec timeout and output limit must not be negative")
	}
	be, err := e.backend(r.Backend)
	if err != nil {
		return err
	}
	if p.TTY {
		if err := sandbox.Check(be, sandbox.CapTTY); err != nil {
			return err
		}
	}
	if p.Session != "" {
		if err := sandbox.Check(be, sandbox.CapSessions); err != nil {
			return err
		}
	}
	if p.Seal != sandbox.SealNone {
		if err := sandbox.Check(be, sandbox.CapSealedExec); err != nil {
			return err
		}
	}
	if p.StepKey != "" {
		if err := checkStepKey(p.StepKey); err != nil {
			return err
		}
		if err := sandbox.Check(be, sandbox.CapStepKeys); err != nil {
			return err
		}
	}
	r, started, err := e.ready(ctx, caller, p.Sandbox)
	if err != nil {
		return err
	}
	defer started() // once the command has started, if not before
	if !r.active() {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s (%s): create a new one", r.ID, r.State, r.Reason)
	}
	done := e.streamOpen(r.ID)
	defer done()

	user := p.User
	if user == "" {
		user = r.User
	}
	id, err := resolveUser(ctx, user, sandboxFiles(be, r.ID))
	if err != nil {
		return err
	}
	cwd := p.Cwd
	if cwd == "" {
		cwd = r.Workdir
	}
	if cwd == "" {
		cwd = "/"
	}
	spec := sandbox.ExecSpec{
		ID:          "x" + sandbox.RandomString(15),
		Argv:        argv,
		Env:         execEnv(r, id, p.Env),
		Cwd:         cwd,
		UID:         id.UID,
		GID:         id.GID,
		Groups:      id.Groups,
		Stdin:       p.Stdin,
		Timeout:     p.Timeout,
		StdinOpen:   p.StdinOpen,
		TTY:         p.TTY,
		Rows:        p.Rows,
		Cols:        p.Cols,
		OutputLimit: p.OutputLimit,
		Seal:        p.Seal,
	}
	spec.Session, spec.SessionShell = p.Session, p.SessionShell
	spec.StepKey = p.StepKey
	if p.TTY {
		spec.Env = append(spec.Env, "TERM=xterm-256color")
	}
	start := time.Now()
	err = be.StartExec(ctx, r.ID, spec)
	started() // a pause may stop it now, the command with it
	if err != nil {
		return err
	}
	if m := e.cfg.Metrics; m != nil {
		m.ExecStartSeconds.WithLabelValues(r.Backend).Observe(time.Since(start).Seconds())
	}
	if err := send(ExecEvent{Started: spec.ID}); err != nil || p.Detach {
		return err
	}
	err = e.follow(ctx, be, r.ID, spec.ID, [2]int64{}, send)
	if m := e.cfg.Metrics; m != nil && err == nil {
		m.ExecSeconds.WithLabelValues(r.Backend).Observe(time.Since(start).Seconds())
	}
	return err
}

// Attach streams an exec's output from the given offsets, then its exit.
// A paused sandbox is resumed first.
func (e *Edge) Attach(ctx context.Context, caller Caller, id, execID string, stdoutOff, stderrOff int64, send func(ExecEvent) error) error {
	if stdoutOff < 0 || stderrOff < 0 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "attach offsets must not be negative")
	}
	be, r, started, err := e.readyBackend(ctx, caller, id)
	if err != nil {
		return err
	}
	started() // attaching starts nothing in the sandbox
	done := e.streamOpen(r.ID)
	defer done()
	for i, off := range []int64{stdoutOff, stderrOff} {
		o, err := be.OpenOutput(ctx, r.ID, execID, sandbox.Stream(i+1))
		if err != nil {
			return err
		}
		size, err := o.Size()
		o.Close()
		if err != nil {
			return err
		}
		if off > size {
			// Output only grows; an offset past its end is a client error,
			// unless the command still writes (then it is reached later).
			if st, _ := e.execRunning(ctx, be, r.ID, execID); !st {
				return errdefs.Newf(errdefs.ErrInvalidArgument, "offset %d is past the end of %s (%d bytes)", off, sandbox.Stream(i+1), size)
			}
		}
	}
	return e.follow(ctx, be, r.ID, execID, [2]int64{stdoutOff, stderrOff}, send)
}

// execRunning reports whether an exec still runs.
func (e *Edge) execRunning(ctx context.Context, be sandbox.Backend, id, execID string) (bool, error) {
	execs, err := be.ListExecs(ctx, id)
	if err != nil {
		return false, err
	}
	for _, x := range execs {
		if x.ID == execID {
			return x.Running, nil
		}
	}
	return false, errdefs.Newf(errdefs.ErrNotFound, "exec %s not found in sandbox %s", execID, id)
}

// WriteStdin writes to a running exec's stdin, resuming a paused sandbox
// first.
func (e *Edge) WriteStdin(ctx context.Context, caller Caller, id, execID string, data []byte, closeIt bool) error {
	be, done, err := e.execReady(ctx, caller, id)
	if err != nil {
		return err
	}
	defer done()
	return be.WriteStdin(ctx, id, execID, data, closeIt)
}

// Signal signals an exec's process group (default SIGTERM), resuming a
// paused sandbox first.
func (e *Edge) Signal(ctx context.Context, caller Caller, id, execID string, sig int) error {
	be, done, err := e.execReady(ctx, caller, id)
	if err != nil {
		return err
	}
	defer done()
	if sig == 0 {
		sig = 15
	}
	return be.Signal(ctx, id, execID, sig)
}

// ResizeTTY resizes a TTY exec, resuming a paused sandbox first.
func (e *Edge) ResizeTTY(ctx context.Context, caller Caller, id, execID string, rows, cols uint16) error {
	be, done, err := e.execReady(ctx, caller, id)
	if err != nil {
		return err
	}
	defer done()
	return be.ResizeTTY(ctx, id, execID, rows, cols)
}

// execReady is readyBackend for the calls on a running exec, which count
// as use.
func (e *Edge) execReady(ctx context.Context, caller Caller, id string) (sandbox.Backend, func(), error) {
	be, _, done, err := e.readyBackend(ctx, caller, id)
	if err != nil {
		return nil, nil, err
	}
	e.touch(id)
	return be, done, nil
}

// ListExecs returns a sandbox's command journal; it does not resume a
// paused sandbox.
func (e *Edge) ListExecs(ctx context.Context, caller Caller, id string) ([]sandbox.ExecInfo, error) {
	be, err := e.execBackend(caller, id)
	if err != nil {
		return nil, err
	}
	return be.ListExecs(ctx, id)
}

// checkStepKey refuses a step key the journal cannot hold.
func checkStepKey(k string) error {
	switch {
	case len(k) > sandbox.MaxStepKey:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "step key of %d bytes: at most %d", len(k), sandbox.MaxStepKey)
	case strings.IndexByte(k, 0) >= 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "step key %.80q holds a NUL byte", k)
	}
	return nil
}

// WithStepKeys keeps the execs whose step key is one of keys (all of
// them when keys is empty).
func WithStepKeys(execs []sandbox.ExecInfo, keys []string) []sandbox.ExecInfo {
	if len(keys) == 0 {
		return execs
	}
	want := make(map[string]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	out := execs[:0]
	for _, x := range execs {
		if x.StepKey != "" && want[x.StepKey] {
			out = append(out, x)
		}
	}
	return out
}

func (e *Edge) execBackend(caller Caller, id string) (sandbox.Backend, error) {
	r, err := e.lookup(caller, id)
	if err != nil {
		return nil, err
	}
	e.touch(id)
	return e.backend(r.Backend)
}

// execEnv builds an exec's environment: defaults, then the image's, the
// sandbox's and the request's, later ones winning.
func execEnv(r *Record, id identity, req map[string]string) []string {
	env := map[string]string{
		"PATH":     defaultPath,
		"HOSTNAME": r.ID,
		"HOME":     id.Home,
	}
	if id.Name != "" {
		env["USER"] = id.Name
	}
	for _, kv := range r.ImageEnv {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	for k, v := range r.Env {
		env[k] = v
	}
	for k, v := range req {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

type waitResult struct {
	st  sandbox.ExitStatus
	err error
}

// follow streams an exec's output from the given offsets until it has
// ended and everything is sent.
func (e *Edge) follow(ctx context.Context, be sandbox.Backend, id, execID string, offs [2]int64, send func(ExecEvent) error) error {
	var outs [2]sandbox.Output
	for i, s := range []sandbox.Stream{sandbox.Stdout, sandbox.Stderr} {
		o, err := be.OpenOutput(ctx, id, execID, s)
		if err != nil {
			for _, prev := range outs[:i] {
				prev.Close()
			}
			return err
		}
		defer o.Close()
		outs[i] = o
	}
	wctx, cancel := context.WithCancel(ctx)
	waitc := make(chan waitResult, 1)
	go func() {
		st, err := be.WaitExec(wctx, id, execID)
		waitc <- waitResult{st, err}
	}()
	waited := false
	defer func() {
		cancel()
		if !waited {
			<-waitc // the waiter is owned here: wait for it to end
		}
	}()
	buf := make([]byte, chunkSize)
	drain := func() (bool, error) {
		progressed := false
		for i, o := range outs {
			for {
				n, err := o.ReadAt(buf, offs[i])
				if n > 0 {
					progressed = true
					data := append([]byte(nil), buf[:n]...)
					if serr := send(ExecEvent{Output: &Chunk{Stream: sandbox.Stream(i + 1), Offset: offs[i], Data: data}}); serr != nil {
						return progressed, serr
					}
					offs[i] += int64(n)
				}
				if err != nil && !errors.Is(err, io.EOF) {
					return progressed, err
				}
				if n < len(buf) {
					break
				}
			}
		}
		return progressed, nil
	}
	keepalive := time.NewTicker(keepaliveInterval)
	defer keepalive.Stop()
	delay := time.Millisecond
	for {
		progressed, err := drain()
		if err != nil {
			return err
		}
		if progressed {
			delay = time.Millisecond
		}
		timer := time.NewTimer(delay)
		select {
		case res := <-waitc:
			timer.Stop()
			waited = true
			if res.err != nil {
				return res.err
			}
			if _, err := drain(); err != nil {
				return err
			}
			st := res.st
			return send(ExecEvent{Exit: &st})
		case <-keepalive.C:
			timer.Stop()
			if err := send(ExecEvent{Keepalive: true}); err != nil {
				return err
			}
		case <-timer.C:
			delay = min(delay*2, maxPollDelay)
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
	}
}
