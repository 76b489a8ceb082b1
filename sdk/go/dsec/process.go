package dsec

import (
	"context"
	"io"
	"math"
	"sync"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// Process is a command started with Start, for interactive use: write its
// input with Stdin, read its output and exit with Wait, resize its terminal
// and signal it meanwhile.
type Process struct {
	// ID is the command's exec ID.
	ID string
	// Stdin writes to the command's standard input, one WriteStdin call per
	// Write; Close closes the input. It is nil unless the request had
	// StdinOpen or TTY. Safe for concurrent use.
	Stdin io.WriteCloser

	sb *Sandbox
	// ctx is the context given to Start, kept because the process handle
	// outlives the call (like exec.CommandContext): it bounds the output
	// stream and Stdin's calls. cancel ends both; Wait and Close call it.
	ctx    context.Context
	cancel context.CancelFunc
	events *execEvents

	mu sync.Mutex
	// done is set by Wait or Close, whichever comes first; it closes the
	// stream. Guarded by mu.
	done bool
}

// Start starts a command and returns once it runs, with its exec ID. Call
// Wait to read its output and exit (or Close to stop following it; the
// command runs on). ctx bounds the whole handle: when it ends, Wait returns
// and Stdin's writes fail. Errors are those of ExecStream.
func (s *Sandbox) Start(ctx context.Context, req ExecRequest) (*Process, error) {
	if err := s.checkExec(req); err != nil {
		return nil, err
	}
	if req.Detach {
		return nil, newError(ErrInvalidArgument, "exec: Start follows the command; use ExecDetached to start it detached")
	}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := s.c.sandboxes.Exec(ctx, connect.NewRequest(s.execRequest(req)))
	if err != nil {
		cancel()
		return nil, s.c.err(err)
	}
	events := &execEvents{stream: stream}
	for stream.Receive() {
		msg := stream.Msg()
		if st := msg.GetStarted(); st != nil {
			p := &Process{ID: st.GetExecId(), sb: s, ctx: ctx, cancel: cancel, events: events}
			if req.StdinOpen || req.TTY {
				p.Stdin = &stdinWriter{p: p}
			}
			return p, nil
		}
		// Anything before the start (there should be nothing) is kept
		// for Wait.
		events.pending = append(events.pending, msg)
	}
	err = stream.Err()
	_ = stream.Close()
	cancel()
	if err != nil {
		return nil, s.c.err(err)
	}
	return nil, newError(ErrUnavailable, "exec in sandbox %s: the stream ended before the command started; it is unknown whether it ran", s.ID)
}

// Wait writes the command's output to stdout and stderr (nil discards) as it
// arrives and returns how it ended; see ExecStream for the errors. It can
// be called once; it ends the handle (Stdin's writes fail afterwards).
func (p *Process) Wait(stdout, stderr io.Writer) (*ExitStatus, error) {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		return nil, newError(ErrFailedPrecondition, "exec %s: Wait was already called, or Close", p.ID)
	}
	p.done = true
	p.mu.Unlock()
	defer func() {
		p.cancel()
		_ = p.events.stream.Close()
	}()
	return p.sb.follow(p.ctx, p.events, p.ID, stdout, stderr)
}

// Close stops following the command; the command runs on (attach to it by
// ID, or Signal it first). Close is idempotent and may be called while Wait
// runs, which then returns context.Canceled with the exec ID.
func (p *Process) Close() error {
	p.cancel()
	p.mu.Lock()
	waiting := p.done
	p.done = true
	p.mu.Unlock()
	if waiting {
		return nil // Wait closes the stream
	}
	return p.events.stream.Close()
}

// Resize changes the command's terminal size.
func (p *Process) Resize(ctx context.Context, rows, cols int) error {
	return p.sb.ResizeTTY(ctx, p.ID, rows, cols)
}

// Signal sends signal number sig (Linux numbering) to the command's
// process group.
func (p *Process) Signal(ctx context.Context, sig int) error {
	return p.sb.Signal(ctx, p.ID, sig)
}

// stdinWriter is Process.Stdin.
type stdinWriter struct {
	p *Process

	mu sync.Mutex
	// guarded by mu
	closed bool
}

func (w *stdinWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, io.ErrClosedPipe
	}
	n := 0
	for n < len(b) {
		end := min(len(b), n+chunkSize)
		if err := w.p.sb.WriteStdin(w.p.ctx, w.p.ID, b[n:end], false); err != nil {
			return n, err
		}
		n = end
	}
	return n, nil
}

// Close closes the command's standard input; later calls do nothing.
func (w *stdinWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	return w.p.sb.WriteStdin(w.p.ctx, w.p.ID, nil, true)
}

// Attach follows a command by its exec ID, whether it still runs or has
// ended: it writes its output from the given byte offsets of each stream
// (0 replays it all) to stdout and stderr (nil discards), then returns how
// it ended. Errors are those of ExecStream; the returned status always
// carries ExecID.
func (s *Sandbox) Attach(ctx context.Context, execID string, stdoutOffset, stderrOffset int64, stdout, stderr io.Writer) (*ExitStatus, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if execID == "" {
		return nil, newError(ErrInvalidArgument, "attach: empty exec ID (dsec execs lists them)")
	}
	if stdoutOffset < 0 || stderrOffset < 0 {
		return nil, newError(ErrInvalidArgument, "attach: offsets must be ≥ 0 (got %d and %d)", stdoutOffset, stderrOffset)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.c.sandboxes.Attach(ctx, connect.NewRequest(&sandboxv1.AttachRequest{
		SandboxId: s.ID, ExecId: execID, StdoutOffset: stdoutOffset, StderrOffset: stderrOffset,
	}))
	if err != nil {
		return nil, s.c.err(err)
	}
	defer stream.Close()
	return s.follow(ctx, &execEvents{stream: stream}, execID, stdout, stderr)
}

// WriteStdin writes data to the standard input of a command started with
// StdinOpen or a TTY, and closes it after data when close is set.
func (s *Sandbox) WriteStdin(ctx context.Context, execID string, data []byte, close bool) error {
	if err := s.check(); err != nil {
		return err
	}
	_, err := s.c.sandboxes.WriteStdin(ctx, connect.NewRequest(&sandboxv1.WriteStdinRequest{
		SandboxId: s.ID, ExecId: execID, Data: data, Close: close,
	}))
	return s.c.err(err)
}

// Signal sends signal number sig to a command's process group. Numbers are
// Linux's (the sandbox's), not the client's: 15 is SIGTERM, 9 SIGKILL; 0
// sends SIGTERM.
func (s *Sandbox) Signal(ctx context.Context, execID string, sig int) error {
	if err := s.check(); err != nil {
		return err
	}
	if sig < 0 || sig > 64 {
		return newError(ErrInvalidArgument, "signal %d: Linux signals are 1 to 64", sig)
	}
	_, err := s.c.sandboxes.Signal(ctx, connect.NewRequest(&sandboxv1.SignalRequest{
		SandboxId: s.ID, ExecId: execID, Signal: int32(sig),
	}))
	return s.c.err(err)
}

// ResizeTTY changes the terminal size of a TTY command.
func (s *Sandbox) ResizeTTY(ctx context.Context, execID string, rows, cols int) error {
	if err := s.check(); err != nil {
		return err
	}
	if rows <= 0 || rows > math.MaxUint16 || cols <= 0 || cols > math.MaxUint16 {
		return newError(ErrInvalidArgument, "resize: terminal size %dx%d is out of range (1 to 65535 each)", rows, cols)
	}
	_, err := s.c.sandboxes.ResizeTTY(ctx, connect.NewRequest(&sandboxv1.ResizeTTYRequest{
		SandboxId: s.ID, ExecId: execID, Rows: uint32(rows), Cols: uint32(cols),
	}))
	return s.c.err(err)
}

// ExecInfo is one entry of a sandbox's command journal.
type ExecInfo struct {
	ID   string
	Argv []string
	TTY  bool
	// StartedAt is when the command started.
	StartedAt time.Time
	// Running: the command has not ended (Exit is then nil).
	Running bool
	// Exit is how it ended, once it has.
	Exit *ExitStatus
	// StdoutBytes and StderrBytes are the sizes of its output streams, the
	// offsets up to which Attach can replay them.
	StdoutBytes int64
	StderrBytes int64
	// Session is the session the command ran in, if any.
	Session string
	// Sealed: the command ran sealed.
	Sealed bool
	// StepKey is the exec's step key (ExecRequest.StepKey), if any.
	StepKey string
}

// ListExecs returns the sandbox's command journal: every exec and its
// result, oldest first (WithStepKeys: only the execs of those step keys).
func (s *Sandbox) ListExecs(ctx context.Context, opts ...ListExecsOption) ([]ExecInfo, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	resp, err := s.listExecs(ctx, opts)
	if err != nil {
		return nil, s.c.err(err)
	}
	out := make([]ExecInfo, 0, len(resp.Msg.GetExecs()))
	for _, e := range resp.Msg.GetExecs() {
		info := ExecInfo{
			ID:          e.GetExecId(),
			Argv:        e.GetArgv(),
			TTY:         e.GetTty(),
			StartedAt:   timeOf(e.GetStartedAt()),
			Running:     e.GetRunning(),
			StdoutBytes: e.GetStdoutBytes(),
			StderrBytes: e.GetStderrBytes(),
			Session:     e.GetSession(),
			Sealed:      e.GetSealed(),
			StepKey:     e.GetStepKey(),
		}
		if e.GetExit() != nil {
			info.Exit = exitStatus(e.GetExecId(), e.GetExit())
		}
		out = append(out, info)
	}
	return out, nil
}
