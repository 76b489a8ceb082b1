package apiserver

import (
	"context"
	"sort"
	"sync"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/edgeclient"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// selectorCall is a pause or resume: by ID to the sandbox's edge, or by
// selector to every edge, whose results are merged in ID order.
func selectorCall[Req, Resp any](
	ctx context.Context, p *sandboxProxy, what, id string, sel map[string]string, m *Req,
	call func(sandboxv1connect.SandboxServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	results func(*Resp) []*sandboxv1.PauseResult, wrap func([]*sandboxv1.PauseResult) *Resp,
) (*connect.Response[Resp], error) {
	defer p.s.usage.touched()
	switch {
	case id != "" && len(sel) > 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s takes a sandbox id or a selector, not both", what)
	case id != "":
		return unary(ctx, p.s, id, m, call)
	case len(sel) == 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s needs a sandbox id or a label selector", what)
	}
	var mu sync.Mutex
	var out []*sandboxv1.PauseResult
	err := p.s.fanOut(ctx, func(ctx context.Context, _ string, c *edgeclient.Conn) error {
		resp, err := call(c.Sandbox, ctx, forward(ctx, m))
		if err != nil {
			return err
		}
		mu.Lock()
		out = append(out, results(resp.Msg)...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetId() < out[j].GetId() })
	return connect.NewResponse(wrap(out)), nil
}

func (p *sandboxProxy) Pause(ctx context.Context, req *connect.Request[sandboxv1.PauseRequest]) (*connect.Response[sandboxv1.PauseResponse], error) {
	m := req.Msg
	return selectorCall(ctx, p, "pause", m.GetId(), m.GetSelector(), m, sandboxv1connect.SandboxServiceClient.Pause,
		(*sandboxv1.PauseResponse).GetResults,
		func(rs []*sandboxv1.PauseResult) *sandboxv1.PauseResponse {
			return &sandboxv1.PauseResponse{Results: rs}
		})
}

func (p *sandboxProxy) Resume(ctx context.Context, req *connect.Request[sandboxv1.ResumeRequest]) (*connect.Response[sandboxv1.ResumeResponse], error) {
	m := req.Msg
	return selectorCall(ctx, p, "resume", m.GetId(), m.GetSelector(), m, sandboxv1connect.SandboxServiceClient.Resume,
		(*sandboxv1.ResumeResponse).GetResults,
		func(rs []*sandboxv1.PauseResult) *sandboxv1.ResumeResponse {
			return &sandboxv1.ResumeResponse{Results: rs}
		})
}
