package apiserver

import (
	"context"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/cluster"
)

// Sessions and grading are answered by the sandbox's node.

func (p *sandboxProxy) ListSessions(ctx context.Context, req *connect.Request[sandboxv1.ListSessionsRequest]) (*connect.Response[sandboxv1.ListSessionsResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.ListSessions)
}

func (p *sandboxProxy) DeleteSession(ctx context.Context, req *connect.Request[sandboxv1.DeleteSessionRequest]) (*connect.Response[sandboxv1.DeleteSessionResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.DeleteSession)
}

// GradeFrom checks that the caller may run the grading image, as Create
// does (the node resolves the name but knows nothing of who may see it).
func (p *sandboxProxy) GradeFrom(ctx context.Context, req *connect.Request[sandboxv1.GradeFromRequest]) (*connect.Response[sandboxv1.GradeFromResponse], error) {
	if name := req.Msg.GetImage(); name != "" {
		ref, err := cluster.ParseRef(name)
		if err != nil {
			return nil, err
		}
		img, err := p.s.cfg.Cluster.GetImageCached(ctx, ref)
		if err != nil {
			return nil, err
		}
		if !img.RunnableBy(keyFrom(ctx).Principal()) {
			return nil, hiddenImage(ref)
		}
	}
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.GradeFrom)
}
