package dsec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// ExecRequest is a command to run in a sandbox. Exactly one of Argv and
// Shell is set.
type ExecRequest struct {
	// Argv runs directly: Argv[0] is looked up in PATH.
	Argv []string
	// Shell runs with /bin/sh -c.
	Shell string
	// Env is added to the sandbox's environment.
	Env map[string]string
	// Cwd is the working directory (default: the sandbox's).
	Cwd string
	// User is a name, uid or uid:gid in the sandbox (default: the
	// sandbox's).
	User string
	// Stdin is written to the command's standard input, which is then
	// closed.
	Stdin []byte
	// Timeout kills the command's process group after this long (default:
	// no limit beyond the sandbox's TTLs).
	Timeout time.Duration
	// StdinOpen keeps standard input open after Stdin, for WriteStdin (and
	// Process.Stdin) to write more; a TTY command's is always open.
	StdinOpen bool
	// TTY runs the command on a terminal of Rows x Cols (default 24x80).
	// Its output then comes as one stream, stdout.
	TTY  bool
	Rows int
	Cols int
	// OutputLimit caps each output stream in bytes (default 16 MiB): past
	// it the command runs on, the rest of its output is dropped and the
	// exit status says so.
	OutputLimit int64
	// Detach asks the server to answer right after the command started;
	// ExecDetached sets it, ExecStream refuses it.
	Detach bool
	// Session runs Shell (Argv is refused) in the sandbox's shell session
	// of this name, made on first use: cwd, environment, functions,
	// aliases and background jobs carry from one command to the next.
	// Names are 1-64 of [A-Za-z0-9_.-]. A command sent to a session that
	// is running one fails with ErrFailedPrecondition. See Sandbox.Session.
	Session string
	// SessionShell is the shell of a new session (default /bin/bash when
	// the image has it, else /bin/sh); ignored for a session that exists.
	SessionShell string
	// Sealed runs the command sealed (SealFreeze or SealKill): the
	// sandbox's other processes are frozen (or killed) while it runs, it
	// runs in the sandbox's mount and pid view as recorded at create with
	// the platform's read-only tools first on PATH (/.dsec/bin) and the
	// image's original layers read-only at /.dsec/image, and nothing of the
	// sandbox can ptrace or signal it. For graders of untrusted work.
	Sealed Seal
	// StepKey names this step of the caller's work in the sandbox's
	// journal (at most MaxStepKey bytes): an exec with the step key of an
	// earlier exec of the sandbox is refused with ErrAlreadyExists, naming
	// it, so that a restarted client finds the step (ListExecs with
	// WithStepKeys) instead of running it twice. RunSteps does that.
	StepKey string
}

// Seal says whether and how a command runs sealed (ExecRequest.Sealed).
type Seal int

const (
	// SealNone runs the command as usual.
	SealNone Seal = iota
	// SealFreeze freezes the sandbox's other processes for the command's
	// duration and thaws them afterwards: an agent's services survive.
	SealFreeze
	// SealKill kills the sandbox's other processes instead.
	SealKill
)

// String returns "none", "freeze" or "kill".
func (s Seal) String() string {
	switch s {
	case SealNone:
		return "none"
	case SealFreeze:
		return "freeze"
	case SealKill:
		return "kill"
	}
	return fmt.Sprintf("Seal(%d)", int(s))
}

func (s Seal) proto() sandboxv1.Seal {
	switch s {
	case SealFreeze:
		return sandboxv1.Seal_SEAL_FREEZE
	case SealKill:
		return sandboxv1.Seal_SEAL_KILL
	}
	return sandboxv1.Seal_SEAL_UNSPECIFIED
}

// ExecOption changes an ExecRequest.
type ExecOption func(*ExecRequest)

// WithEnv adds environment variables to the command's.
func WithEnv(env map[string]string) ExecOption {
	return func(r *ExecRequest) {
		if r.Env == nil {
			r.Env = make(map[string]string, len(env))
		}
		maps.Copy(r.Env, env)
	}
}

// WithCwd sets the command's working directory.
func WithCwd(dir string) ExecOption { return func(r *ExecRequest) { r.Cwd = dir } }

// WithUser runs the command as user: a name, uid or uid:gid.
func WithUser(user string) ExecOption { return func(r *ExecRequest) { r.User = user } }

// WithStdin gives the command data on its standard input.
func WithStdin(data []byte) ExecOption { return func(r *ExecRequest) { r.Stdin = data } }

// WithTimeout kills the command after d; the result then says TimedOut.
func WithTimeout(d time.Duration) ExecOption { return func(r *ExecRequest) { r.Timeout = d } }

// WithTTY runs the command on a terminal of rows x cols (0 takes the
// default, 24x80). Its output then comes as one stream, stdout.
func WithTTY(rows, cols int) ExecOption {
	return func(r *ExecRequest) { r.TTY, r.Rows, r.Cols = true, rows, cols }
}

// WithStdinOpen keeps the command's standard input open for WriteStdin.
func WithStdinOpen() ExecOption { return func(r *ExecRequest) { r.StdinOpen = true } }

// WithOutputLimit caps each of the command's output streams at n bytes.
func WithOutputLimit(n int64) ExecOption { return func(r *ExecRequest) { r.OutputLimit = n } }

// WithStepKey gives the command a step key (ExecRequest.StepKey).
func WithStepKey(key string) ExecOption { return func(r *ExecRequest) { r.StepKey = key } }

// WithSealed runs the command sealed: SealFreeze freezes the sandbox's other
// processes while it runs, SealKill kills them (see ExecRequest.Sealed).
// Trust the result only when its Sealed is set: a server older than sealed
// execs ignores the request (dsec exec --sealed fails then).
func WithSealed(s Seal) ExecOption { return func(r *ExecRequest) { r.Sealed = s } }

// ExitStatus is how a command ended. A command that ran and failed is not
// an error: look at ExitCode, Signal, TimedOut and OOMKilled.
type ExitStatus struct {
	// ExecID names the command in its sandbox, to attach to it later.
	ExecID string
	// ExitCode is the command's exit code when it exited.
	ExitCode int
	// Signal is the number of the signal that ended it (ExitCode is then 0
	// and means nothing).
	Signal int
	// TimedOut: the request's timeout killed the command's process group;
	// Signal is then 9 and ExitCode 0. The CLI exits 124.
	TimedOut bool
	// OOMKilled: the kernel killed it for memory.
	OOMKilled bool
	// StdoutTruncated and StderrTruncated: the stream passed its cap and
	// the rest of it was dropped.
	StdoutTruncated bool
	StderrTruncated bool
	// Duration is how long the command ran.
	Duration time.Duration
	// Lost: the command's end was not observed (its node's keeper
	// restarted while it ran); it may have ended any way, and the other
	// fields say nothing.
	Lost bool
	// Sealed: the command ran sealed (ExecRequest.Sealed).
	Sealed bool
	// SessionLost: the command's session shell ended (its timeout's grace
	// period passed, the command ended the shell, the session was deleted,
	// or the node's keeper restarted). The session's state is gone; its
	// next command gets a new shell.
	SessionLost bool
	// SessionRestarted: the command ran in a new shell that replaced a lost
	// one, so state set by the session's earlier commands (cwd,
	// environment, jobs) is gone.
	SessionRestarted bool
}

// Code returns the exit code a shell reports for the command, as the CLI
// does: 124 when it timed out, 128+N when signal N ended it, else its exit
// code.
func (s ExitStatus) Code() int {
	switch {
	case s.TimedOut:
		return 124
	case s.Signal != 0:
		return 128 + s.Signal
	}
	return s.ExitCode
}

// ExecResult is a finished command with its collected output.
type ExecResult struct {
	ExitStatus
	Stdout []byte
	Stderr []byte
}

// Exec runs argv in the sandbox, waits for it, and returns its output. See
// ExecStream for the errors.
func (s *Sandbox) Exec(ctx context.Context, argv []string, opts ...ExecOption) (*ExecResult, error) {
	req := ExecRequest{Argv: argv}
	for _, o := range opts {
		o(&req)
	}
	return s.collect(ctx, req)
}

// Shell runs cmd with /bin/sh -c in the sandbox, waits for it, and returns
// its output. See ExecStream for the errors.
func (s *Sandbox) Shell(ctx context.Context, cmd string, opts ...ExecOption) (*ExecResult, error) {
	req := ExecRequest{Shell: cmd}
	for _, o := range opts {
		o(&req)
	}
	return s.collect(ctx, req)
}

func (s *Sandbox) collect(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	var stdout, stderr bytes.Buffer
	st, err := s.ExecStream(ctx, req, &stdout, &stderr)
	res := &ExecResult{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	if st != nil {
		res.ExitStatus = *st
	}
	if err != nil {
		if st == nil {
			return nil, err
		}
		return res, err
	}
	return res, nil
}

// ExecStream runs a command and writes its output to stdout and stderr (nil
// discards) as it arrives, then returns how it ended. The writers are called
// from the calling goroutine only, one chunk at a time.
//
// When the call fails after the command started (the connection broke, the
// server went away, a writer failed, ctx ended), the command may still be
// running: ExecStream then returns a status whose only field is ExecID
// along with the error, so that the caller can attach to it later. A stream
// that ends without the command's exit is ErrUnavailable.
//
// A command with StdinOpen or a TTY is better started with Start, which
// gives its exec ID (and a writer for its input) before it ends.
func (s *Sandbox) ExecStream(ctx context.Context, req ExecRequest, stdout, stderr io.Writer) (*ExitStatus, error) {
	if err := s.checkExec(req); err != nil {
		return nil, err
	}
	if req.Detach {
		return nil, newError(ErrInvalidArgument, "exec: ExecStream waits for the command; use ExecDetached to start it detached")
	}
	// Canceled on return, so the stream is torn down on every path.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	stream, err := s.c.sandboxes.Exec(ctx, connect.NewRequest(s.execRequest(req)))
	if err != nil {
		return nil, s.c.err(err)
	}
	defer stream.Close()
	return s.follow(ctx, &execEvents{stream: stream}, "", stdout, stderr)
}

// checkExec validates req before it is sent.
func (s *Sandbox) checkExec(req ExecRequest) error {
	if err := s.check(); err != nil {
		return err
	}
	if (len(req.Argv) == 0) == (req.Shell == "") {
		return newError(ErrInvalidArgument, "exec: give either a command (argv) or a shell line, not both or neither (example: []string{\"ls\", \"-l\"})")
	}
	if req.Rows < 0 || req.Rows > math.MaxUint16 || req.Cols < 0 || req.Cols > math.MaxUint16 {
		return newError(ErrInvalidArgument, "exec: terminal size %dx%d is out of range (0 to 65535 each)", req.Rows, req.Cols)
	}
	if req.OutputLimit < 0 {
		return newError(ErrInvalidArgument, "exec: output limit %d is negative", req.OutputLimit)
	}
	if len(req.StepKey) > MaxStepKey {
		return newError(ErrInvalidArgument, "exec: a step key of %d bytes: at most %d", len(req.StepKey), MaxStepKey)
	}
	if req.Sealed < SealNone || req.Sealed > SealKill {
		return newError(ErrInvalidArgument, "exec: %v is not a seal (SealNone, SealFreeze or SealKill)", req.Sealed)
	}
	if req.Session != "" {
		if err := checkSessionName(req.Session); err != nil {
			return err
		}
		if len(req.Argv) > 0 {
			return newError(ErrInvalidArgument, "exec: a session runs shell lines, not argv: give the command as Shell (example: Shell: \"cd /tmp && ls\")")
		}
	} else if req.SessionShell != "" {
		return newError(ErrInvalidArgument, "exec: SessionShell %.80q without a Session: name the session too", req.SessionShell)
	}
	return nil
}

// execEvents yields an exec stream's events: first those already read
// (pending), then the stream's.
type execEvents struct {
	stream  *connect.ServerStreamForClient[sandboxv1.ExecResponse]
	pending []*sandboxv1.ExecResponse
}

func (e *execEvents) next() (*sandboxv1.ExecResponse, bool) {
	if len(e.pending) > 0 {
		m := e.pending[0]
		e.pending = e.pending[1:]
		return m, true
	}
	if e.stream.Receive() {
		return e.stream.Msg(), true
	}
	return nil, false
}

// follow writes the output events yields until the command's exit and
// returns that; execID is the command's ID when already known. See
// ExecStream for the errors.
func (s *Sandbox) follow(ctx context.Context, events *execEvents, execID string, stdout, stderr io.Writer) (*ExitStatus, error) {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	// failed returns err, with the exec ID when the command started.
	failed := func(err error) (*ExitStatus, error) {
		if execID == "" {
			return nil, err
		}
		var de *Error
		if errors.As(err, &de) {
			de.Message = fmt.Sprintf("exec %s in sandbox %s: %s", execID, s.ID, de.Message)
		} else {
			err = fmt.Errorf("exec %s in sandbox %s: %w", execID, s.ID, err)
		}
		return &ExitStatus{ExecID: execID}, err
	}
	for {
		msg, ok := events.next()
		if !ok {
			break
		}
		switch ev := msg.GetEvent().(type) {
		case *sandboxv1.ExecResponse_Started:
			execID = ev.Started.GetExecId()
		case *sandboxv1.ExecResponse_Output:
			w := stdout
			if ev.Output.GetStream() == sandboxv1.Stream_STREAM_STDERR {
				w = stderr
			}
			if _, err := w.Write(ev.Output.GetData()); err != nil {
				return failed(fmt.Errorf("write %s: %w", streamName(ev.Output.GetStream()), err))
			}
		case *sandboxv1.ExecResponse_Exit:
			return exitStatus(execID, ev.Exit), nil
		}
		// Keepalives and events this version does not know are skipped.
	}
	if err := events.stream.Err(); err != nil {
		return failed(s.c.err(err))
	}
	if ctx.Err() != nil {
		return failed(s.c.err(ctx.Err()))
	}
	if execID == "" {
		return nil, newError(ErrUnavailable, "exec in sandbox %s: the stream ended before the command started; it is unknown whether it ran", s.ID)
	}
	return failed(newError(ErrUnavailable, "the stream ended before the command exited; it may still be running: attach to it by its exec ID"))
}

func exitStatus(execID string, e *sandboxv1.ExecExit) *ExitStatus {
	st := &ExitStatus{
		ExecID:           execID,
		ExitCode:         int(e.GetExitCode()),
		Signal:           int(e.GetSignal()),
		TimedOut:         e.GetTimedOut(),
		OOMKilled:        e.GetOomKilled(),
		StdoutTruncated:  e.GetStdoutTruncated(),
		StderrTruncated:  e.GetStderrTruncated(),
		Lost:             e.GetLost(),
		Sealed:           e.GetSealed(),
		SessionLost:      e.GetSessionLost(),
		SessionRestarted: e.GetSessionRestarted(),
	}
	if e.GetDuration() != nil {
		st.Duration = e.GetDuration().AsDuration()
	}
	return st
}

func streamName(s sandboxv1.Stream) string {
	if s == sandboxv1.Stream_STREAM_STDERR {
		return "stderr"
	}
	return "stdout"
}

func (s *Sandbox) execRequest(req ExecRequest) *sandboxv1.ExecRequest {
	return &sandboxv1.ExecRequest{
		SandboxId:    s.ID,
		Argv:         req.Argv,
		Shell:        req.Shell,
		Env:          req.Env,
		Cwd:          req.Cwd,
		User:         req.User,
		Stdin:        req.Stdin,
		Timeout:      optDuration(req.Timeout),
		StdinOpen:    req.StdinOpen,
		Tty:          req.TTY,
		Rows:         uint32(req.Rows),
		Cols:         uint32(req.Cols),
		OutputLimit:  req.OutputLimit,
		Detach:       req.Detach,
		Session:      req.Session,
		SessionShell: req.SessionShell,
		Sealed:       req.Sealed.proto(),
		StepKey:      req.StepKey,
	}
}

// ExecDetached starts a command and returns its exec ID as soon as it
// runs, without waiting for it: the server detaches it, the command runs
// on in the sandbox and its output is kept there for Attach. Its standard
// input is closed after req.Stdin unless req.StdinOpen (then write it with
// WriteStdin).
func (s *Sandbox) ExecDetached(ctx context.Context, req ExecRequest) (string, error) {
	if err := s.checkExec(req); err != nil {
		return "", err
	}
	req.Detach = true
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.c.sandboxes.Exec(ctx, connect.NewRequest(s.execRequest(req)))
	if err != nil {
		return "", s.c.err(err)
	}
	defer stream.Close()
	for stream.Receive() {
		if ev, ok := stream.Msg().GetEvent().(*sandboxv1.ExecResponse_Started); ok {
			return ev.Started.GetExecId(), nil
		}
	}
	if err := stream.Err(); err != nil {
		return "", s.c.err(err)
	}
	return "", newError(ErrUnavailable, "exec in sandbox %s: the stream ended before the command started; it is unknown whether it ran", s.ID)
}
