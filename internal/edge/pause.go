package edge

import (
	"context"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// Pause and Resume: the API is defined; the edge's side is being built
// (issue 15).

func (a *sandboxAPI) Pause(context.Context, *connect.Request[sandboxv1.PauseRequest]) (*connect.Response[sandboxv1.PauseResponse], error) {
	return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "this node cannot pause sandboxes yet")
}

func (a *sandboxAPI) Resume(context.Context, *connect.Request[sandboxv1.ResumeRequest]) (*connect.Response[sandboxv1.ResumeResponse], error) {
	return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "this node cannot resume sandboxes yet")
}
