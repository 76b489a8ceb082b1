package dsec

import (
	"context"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// Backend is one isolation backend of one node.
type Backend struct {
	Node string
	// Name is what CreateOptions.Backend takes ("container").
	Name string
	// Tier is its isolation tier: "process", "container", "user-kernel",
	// "microvm" or "vm".
	Tier string
	// Capabilities are what it has ("pause", "tty", "disk-limit", ...);
	// an operation needing one it lacks fails with ErrFailedPrecondition.
	Capabilities []string
	// Default: a create that names no backend gets this one on its node.
	Default bool
}

// Backends lists the backends of every node, by node and name.
func (c *Client) Backends(ctx context.Context) ([]Backend, error) {
	resp, err := c.sandboxes.ListBackends(ctx, connect.NewRequest(&sandboxv1.ListBackendsRequest{}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]Backend, 0, len(resp.Msg.GetBackends()))
	for _, b := range resp.Msg.GetBackends() {
		out = append(out, Backend{Node: b.GetNode(), Name: b.GetName(), Tier: b.GetTier(), Capabilities: b.GetCapabilities(), Default: b.GetDefault()})
	}
	return out, nil
}
