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

// UpdateNetwork goes to the sandbox's edge by ID, or to every edge by
// selector; each edge validates the policy and updates only the sandboxes
// the caller's key sees (its own project's, or every project's for an
// admin key).
func (p *sandboxProxy) UpdateNetwork(ctx context.Context, req *connect.Request[sandboxv1.UpdateNetworkRequest]) (*connect.Response[sandboxv1.UpdateNetworkResponse], error) {
	defer p.s.usage.touched()
	m := req.Msg
	switch {
	case m.GetId() != "" && len(m.GetSelector()) > 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "network update takes a sandbox id or a selector, not both")
	case m.GetId() != "":
		return unary(ctx, p.s, m.GetId(), m, sandboxv1connect.SandboxServiceClient.UpdateNetwork)
	case len(m.GetSelector()) == 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "network update needs a sandbox id or a label selector")
	}
	var mu sync.Mutex
	out := &sandboxv1.UpdateNetworkResponse{}
	err := p.s.fanOut(ctx, func(ctx context.Context, _ string, c *edgeclient.Conn) error {
		resp, err := c.Sandbox.UpdateNetwork(ctx, forward(ctx, m))
		if err != nil {
			return err
		}
		mu.Lock()
		out.Results = append(out.Results, resp.Msg.GetResults()...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out.Results, func(i, j int) bool { return out.Results[i].GetId() < out.Results[j].GetId() })
	return connect.NewResponse(out), nil
}

func (p *sandboxProxy) GetNetwork(ctx context.Context, req *connect.Request[sandboxv1.GetNetworkRequest]) (*connect.Response[sandboxv1.GetNetworkResponse], error) {
	return unary(ctx, p.s, req.Msg.GetId(), req.Msg, sandboxv1connect.SandboxServiceClient.GetNetwork)
}
