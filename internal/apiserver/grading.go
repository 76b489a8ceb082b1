package apiserver

import (
	"context"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// Sessions and grading are answered by the sandbox's node.

func (p *sandboxProxy) ListSessions(ctx context.Context, req *connect.Request[sandboxv1.ListSessionsRequest]) (*connect.Response[sandboxv1.ListSessionsResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.ListSessions)
}

func (p *sandboxProxy) DeleteSession(ctx context.Context, req *connect.Request[sandboxv1.DeleteSessionRequest]) (*connect.Response[sandboxv1.DeleteSessionResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.DeleteSession)
}

func (p *sandboxProxy) GradeFrom(ctx context.Context, req *connect.Request[sandboxv1.GradeFromRequest]) (*connect.Response[sandboxv1.GradeFromResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.GradeFrom)
}
