package dsec

import (
	"context"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// Session is a named shell session of a sandbox: a shell that lives on
// between commands, so that cwd, environment, functions, aliases and
// background jobs carry from one command to the next. It is made on the
// first command; each command still gets its own exec ID, journal entry,
// separate stdout and stderr, and exit code. A session's commands run one
// at a time; several sessions of a sandbox run concurrently.
//
// A command's timeout interrupts its foreground processes (SIGINT): the
// result says TimedOut with Signal 2 and no exit code. If they outlive the
// interrupt for a grace period, the shell is killed: the result then says
// TimedOut, Signal 9 and SessionLost, and the next command runs in a new
// shell and says SessionRestarted.
type Session struct {
	sb *Sandbox
	// Name is the session's name in its sandbox.
	Name string
	// Shell is the shell the session is made with, on its first command
	// (default /bin/bash when the image has it, else /bin/sh). It does not
	// change a session that exists.
	Shell string
}

// Session returns the sandbox's session called name (1-64 of
// [A-Za-z0-9_.-]) without calling the server: the session is made by its
// first command.
func (s *Sandbox) Session(name string) *Session {
	return &Session{sb: s, Name: name}
}

// Run runs the shell line cmdline in the session, waits for it and returns
// its output and exit status. A command that fails is not an error; see
// ExecStream for the errors. A session running another command is
// ErrFailedPrecondition.
func (ss *Session) Run(ctx context.Context, cmdline string, opts ...ExecOption) (*ExecResult, error) {
	req, err := ss.request(cmdline, opts)
	if err != nil {
		return nil, err
	}
	return ss.sb.collect(ctx, req)
}

// Start starts the shell line cmdline in the session and returns once it
// runs (see Sandbox.Start).
func (ss *Session) Start(ctx context.Context, cmdline string, opts ...ExecOption) (*Process, error) {
	req, err := ss.request(cmdline, opts)
	if err != nil {
		return nil, err
	}
	return ss.sb.Start(ctx, req)
}

// request is cmdline with opts in the session; a name the server would
// refuse is refused here (an empty one would run outside any session).
func (ss *Session) request(cmdline string, opts []ExecOption) (ExecRequest, error) {
	if err := checkSessionName(ss.Name); err != nil {
		return ExecRequest{}, err
	}
	req := ExecRequest{Shell: cmdline}
	for _, o := range opts {
		o(&req)
	}
	req.Session, req.SessionShell = ss.Name, ss.Shell
	return req, nil
}

// Delete ends the session: its shell and every process it started are
// killed, and a command running in it ends with SessionLost. A session
// that does not exist is ErrNotFound.
func (ss *Session) Delete(ctx context.Context) error {
	return ss.sb.DeleteSession(ctx, ss.Name)
}

// SessionInfo describes one shell session of a sandbox.
type SessionInfo struct {
	Name string
	// Shell is the shell's path in the sandbox.
	Shell     string
	CreatedAt time.Time
	// Commands is how many commands ran in it so far.
	Commands int64
	// RunningExecID is the command running now, if any.
	RunningExecID string
}

// ListSessions returns the sandbox's shell sessions, by name.
func (s *Sandbox) ListSessions(ctx context.Context) ([]SessionInfo, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	resp, err := s.c.sandboxes.ListSessions(ctx, connect.NewRequest(&sandboxv1.ListSessionsRequest{SandboxId: s.ID}))
	if err != nil {
		return nil, s.c.err(err)
	}
	out := make([]SessionInfo, 0, len(resp.Msg.GetSessions()))
	for _, p := range resp.Msg.GetSessions() {
		out = append(out, SessionInfo{
			Name:          p.GetName(),
			Shell:         p.GetShell(),
			CreatedAt:     timeOf(p.GetCreatedAt()),
			Commands:      p.GetCommands(),
			RunningExecID: p.GetRunningExecId(),
		})
	}
	return out, nil
}

// DeleteSession ends the sandbox's session called name (see
// Session.Delete). A session that does not exist is ErrNotFound.
func (s *Sandbox) DeleteSession(ctx context.Context, name string) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := checkSessionName(name); err != nil {
		return err
	}
	_, err := s.c.sandboxes.DeleteSession(ctx, connect.NewRequest(&sandboxv1.DeleteSessionRequest{SandboxId: s.ID, Name: name}))
	return s.c.err(err)
}

// checkSessionName refuses a name the server would refuse, before the call.
func checkSessionName(name string) error {
	ok := len(name) >= 1 && len(name) <= 64
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			ok = false
			break
		}
	}
	if !ok {
		return newError(ErrInvalidArgument, "session name %.80q: use 1 to 64 of A-Z, a-z, 0-9, _, . and - (example: \"main\")", name)
	}
	return nil
}
