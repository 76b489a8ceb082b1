package edge

import (
	"context"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// Not built yet (issue 12): sessions.

func (a *sandboxAPI) ListSessions(ctx context.Context, req *connect.Request[sandboxv1.ListSessionsRequest]) (*connect.Response[sandboxv1.ListSessionsResponse], error) {
	return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "shell sessions are not built yet")
}

func (a *sandboxAPI) DeleteSession(ctx context.Context, req *connect.Request[sandboxv1.DeleteSessionRequest]) (*connect.Response[sandboxv1.DeleteSessionResponse], error) {
	return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "shell sessions are not built yet")
}
