package container

import (
	"context"
	"encoding/json"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/sandbox"
)

var (
	_ sandbox.NetworkPolicer = (*Backend)(nil)
	_ sandbox.NetworkTotaler = (*Backend)(nil)
)

// networkProtocol is the first keeper protocol with sandbox networks.
const networkProtocol = 5

// SetNetwork implements sandbox.NetworkPolicer.
func (b *Backend) SetNetwork(ctx context.Context, id string, policy []byte) (sandbox.NetworkInfo, error) {
	if err := b.checkNetworkProtocol(ctx); err != nil {
		return sandbox.NetworkInfo{}, err
	}
	info, err := b.keeper.SetNetwork(ctx, id, keeper.NetworkRequest{Policy: json.RawMessage(policy)})
	return fromKeeperNetwork(info), err
}

// Network implements sandbox.NetworkPolicer.
func (b *Backend) Network(ctx context.Context, id string) (sandbox.NetworkInfo, error) {
	if err := b.checkNetworkProtocol(ctx); err != nil {
		return sandbox.NetworkInfo{}, err
	}
	info, err := b.keeper.Network(ctx, id)
	return fromKeeperNetwork(info), err
}

// NetworkTotals implements sandbox.NetworkTotaler: one keeper call for the
// whole node.
func (b *Backend) NetworkTotals(ctx context.Context) (sandbox.NetworkTotals, error) {
	if err := b.checkNetworkProtocol(ctx); err != nil {
		return sandbox.NetworkTotals{}, err
	}
	n, err := b.keeper.NodeNetwork(ctx)
	if err != nil {
		return sandbox.NetworkTotals{}, err
	}
	return sandbox.NetworkTotals{
		BytesOut: n.BytesOut, BytesIn: n.BytesIn, ConnsOut: n.ConnsOut, ConnsActive: n.ConnsActive,
		Denied: n.Denied, DNSQueries: n.DNSQueries, DNSDenied: n.DNSDenied,
	}, nil
}

// checkNetworkProtocol refuses network calls to a keeper that has none: an
// older keeper would answer 404, which reads as "no such sandbox".
func (b *Backend) checkNetworkProtocol(ctx context.Context) error {
	v, err := b.keeper.Version(ctx)
	if err != nil {
		return err
	}
	if v.Protocol < networkProtocol {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"the node keeper (pid %d) speaks keeper protocol %d, which has no sandbox networks: restart dsec up once the sandboxes on lazy layers it serves are gone, so that a keeper of this dsec replaces it", v.Pid, v.Protocol)
	}
	return nil
}

func fromKeeperNetwork(n keeper.NetworkInfo) sandbox.NetworkInfo {
	out := sandbox.NetworkInfo{
		Policy: []byte(n.Policy), Address: n.Address, Router: n.Router,
		BytesOut: n.BytesOut, BytesIn: n.BytesIn, ConnsOut: n.ConnsOut, ConnsActive: n.ConnsActive,
		Denied: n.Denied, DNSQueries: n.DNSQueries, DNSDenied: n.DNSDenied,
	}
	for _, d := range n.Denials {
		out.Denials = append(out.Denials, sandbox.NetworkDenial{Time: d.Time, Dest: d.Dest, Name: d.Name, Reason: d.Reason})
	}
	return out
}
