package apiserver

import (
	"context"
	"sort"
	"sync"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/edgeclient"
)

// ListBackends lists every healthy node's backends, by node and name.
func (p *sandboxProxy) ListBackends(ctx context.Context, req *connect.Request[sandboxv1.ListBackendsRequest]) (*connect.Response[sandboxv1.ListBackendsResponse], error) {
	var mu sync.Mutex
	out := &sandboxv1.ListBackendsResponse{}
	err := p.s.fanOut(ctx, func(ctx context.Context, _ string, c *edgeclient.Conn) error {
		resp, err := c.Sandbox.ListBackends(ctx, forward(ctx, req.Msg))
		if err != nil {
			return err
		}
		mu.Lock()
		out.Backends = append(out.Backends, resp.Msg.GetBackends()...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out.Backends, func(i, j int) bool {
		a, b := out.Backends[i], out.Backends[j]
		if a.GetNode() != b.GetNode() {
			return a.GetNode() < b.GetNode()
		}
		return a.GetName() < b.GetName()
	})
	return connect.NewResponse(out), nil
}
