package apiserver

import (
	"context"

	"connectrpc.com/connect"

	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// PackDiff forwards to the edge that owns the sandbox: the writable layer
// is there, and so is what freezes the sandbox while it is read.
//
// A name another project owns is refused here, before the sandbox is
// frozen; the edge's write of the image checks again (cluster.WriteImage).
func (p *sandboxProxy) PackDiff(ctx context.Context, req *connect.Request[sandboxv1.PackDiffRequest]) (*connect.Response[sandboxv1.PackDiffResponse], error) {
	if ref, err := cluster.ParseRef(req.Msg.GetName()); err == nil {
		switch img, err := p.s.cfg.Cluster.GetImageCached(ctx, ref); {
		case err == nil:
			if err := cluster.CheckWritable(img, keyFrom(ctx).Principal()); err != nil {
				return nil, err
			}
		case !errdefs.Is(err, errdefs.ErrNotFound):
			return nil, err
		}
	}
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.PackDiff)
}
