package edge

import (
	"context"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// Not built yet (issue 12): GradeFrom.

func (a *sandboxAPI) GradeFrom(ctx context.Context, req *connect.Request[sandboxv1.GradeFromRequest]) (*connect.Response[sandboxv1.GradeFromResponse], error) {
	return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "GradeFrom is not built yet")
}
