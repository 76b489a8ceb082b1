package edge

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/sandbox"
)

func (a *sandboxAPI) ListSessions(ctx context.Context, req *connect.Request[sandboxv1.ListSessionsRequest]) (*connect.Response[sandboxv1.ListSessionsResponse], error) {
	ss, err := a.e.ListSessions(ctx, callerOf(req.Header()), req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	out := &sandboxv1.ListSessionsResponse{Sessions: make([]*sandboxv1.Session, len(ss))}
	for i, s := range ss {
		out.Sessions[i] = &sandboxv1.Session{
			Name: s.Name, Shell: s.Shell, CreatedAt: timestamppb.New(s.Created),
			Commands: s.Commands, RunningExecId: s.RunningExec,
		}
	}
	return connect.NewResponse(out), nil
}

func (a *sandboxAPI) DeleteSession(ctx context.Context, req *connect.Request[sandboxv1.DeleteSessionRequest]) (*connect.Response[sandboxv1.DeleteSessionResponse], error) {
	if err := a.e.DeleteSession(ctx, callerOf(req.Header()), req.Msg.GetSandboxId(), req.Msg.GetName()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.DeleteSessionResponse{}), nil
}

// ListSessions lists a sandbox's shell sessions by name; it does not
// resume a paused sandbox.
func (e *Edge) ListSessions(ctx context.Context, caller Caller, id string) ([]sandbox.SessionInfo, error) {
	be, err := e.execBackend(caller, id)
	if err != nil {
		return nil, err
	}
	s, err := sessioner(be)
	if err != nil {
		return nil, err
	}
	return s.ListSessions(ctx, id)
}

// DeleteSession kills a session's shell and every process it started,
// resuming a paused sandbox first.
func (e *Edge) DeleteSession(ctx context.Context, caller Caller, id, name string) error {
	be, done, err := e.execReady(ctx, caller, id)
	if err != nil {
		return err
	}
	defer done()
	s, err := sessioner(be)
	if err != nil {
		return err
	}
	return s.DeleteSession(ctx, id, name)
}

func sessioner(be sandbox.Backend) (sandbox.Sessioner, error) {
	if err := sandbox.Check(be, sandbox.CapSessions); err != nil {
		return nil, err
	}
	return be.(sandbox.Sessioner), nil
}
