package edge

import (
	"context"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
)

func (a *sandboxAPI) PackDiff(ctx context.Context, req *connect.Request[sandboxv1.PackDiffRequest]) (*connect.Response[sandboxv1.PackDiffResponse], error) {
	return nil, errdefs.Newf(errdefs.ErrUnavailable, "pack_diff is not ready yet")
}
