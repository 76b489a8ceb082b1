package apiserver

import (
	"context"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// PackDiff forwards to the edge that owns the sandbox: the writable layer
// is there, and so is what freezes the sandbox while it is read.
func (p *sandboxProxy) PackDiff(ctx context.Context, req *connect.Request[sandboxv1.PackDiffRequest]) (*connect.Response[sandboxv1.PackDiffResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.PackDiff)
}
