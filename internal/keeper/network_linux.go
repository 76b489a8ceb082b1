package keeper

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/netns"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/internal/netproxy"
)

// The vault's entry for the router namespace: not a sandbox ID (those
// hold no dot), so no sandbox's deletion drops it.
const (
	vaultNode   = ".network"
	vaultRouter = "router-netns"
)

// netState is the keeper's part of the sandboxes' network: the
// operator's catalogue, read at start, and the node's router, proxy and
// resolver, opened at the first sandbox given a network (a node with none
// pays nothing).
type netState struct {
	cat *netpolicy.Catalogue // set in setup, not changed after
	// dial, when set (tests), dials the proxy's allowed destinations.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	mu sync.Mutex
	// guarded by mu
	node *netproxy.Node
}

// setupNetwork reads the network config and, when some adopted sandbox
// has a network, opens the node's router and puts every such sandbox's
// policy back in force before the keeper serves anything: until then the
// proxy refuses their connections (fail closed). Links of sandboxes the
// keeper no longer has are swept; with no networked sandbox a router left
// by an earlier keeper is removed.
func (k *Keeper) setupNetwork() error {
	// A keeper replaced by this one handed its router over in the vault:
	// mounted here, it is adopted with its links and addresses, so the
	// sandboxes' network does not go with the old keeper.
	if f := k.vault.get(vaultNode, vaultRouter); f != nil {
		if err := netns.Mount(k.l.NetworkDir(), int(f.Fd())); err != nil {
			k.log.Warn("mount the router namespace handed over", "err", err)
		}
	}
	k.net.cat = netpolicy.Builtin()
	if k.cfg.NetworkConfig != "" {
		cat, err := netpolicy.LoadCatalogue(k.cfg.NetworkConfig)
		if err != nil {
			return err
		}
		k.net.cat = cat
	}
	var networked []*box
	for _, b := range k.allBoxes() {
		b.mu.Lock()
		has := len(b.info.Network) > 0
		b.mu.Unlock()
		if has {
			networked = append(networked, b)
		}
	}
	if len(networked) == 0 {
		if err := netns.Remove(k.l.NetworkDir()); err != nil {
			k.log.Warn("remove the network router of an earlier keeper", "err", err)
		}
		k.vault.drop(vaultNode)
		return nil
	}
	n, err := k.netNode()
	if err != nil {
		// The keeper still serves its sandboxes; the networked ones have
		// no link, so nothing of theirs gets out (fail closed), and a PUT
		// tries again.
		k.log.Error("the sandboxes' network cannot be restored; they have none until it is set again", "err", err)
		return nil
	}
	keep := map[string]bool{}
	for _, b := range networked {
		b.mu.Lock()
		id, doc := b.info.ID, b.info.Network
		b.mu.Unlock()
		keep[id] = true
		if err := k.restoreNetwork(n, b, doc); err != nil {
			// The sandbox stays without network (its connections are
			// refused) until a new PUT; its record keeps the policy.
			k.log.Warn("restore sandbox network", "sandbox", id, "err", err)
		}
	}
	if removed, err := n.Sweep(func(id string) bool { return keep[id] }); err != nil {
		k.log.Warn("sweep network links", "err", err)
	} else if len(removed) > 0 {
		k.log.Info("removed network links of sandboxes this keeper does not have", "sandboxes", removed)
	}
	return nil
}

func (k *Keeper) restoreNetwork(n *netproxy.Node, b *box, doc json.RawMessage) error {
	spec, err := netpolicy.ParsePolicyJSON(doc)
	if err != nil {
		return err
	}
	pol, err := n.Compile(spec)
	if err != nil {
		return err
	}
	fd, err := initNetNS(b)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = n.Attach(b.info.ID, fd, pol)
	return err
}

// catalogue is the services policies name: the operator's network config
// read at start, or the built-in ones.
func (k *Keeper) catalogue() *netpolicy.Catalogue {
	if k.net.cat == nil {
		return netpolicy.Builtin()
	}
	return k.net.cat
}

// netNode returns the node's network, opening it the first time.
func (k *Keeper) netNode() (*netproxy.Node, error) {
	k.net.mu.Lock()
	defer k.net.mu.Unlock()
	if k.net.node != nil {
		return k.net.node, nil
	}
	n, err := netproxy.OpenNode(netproxy.NodeConfig{
		Dir: k.l.NetworkDir(), Pool: k.cfg.NetworkPool, Catalogue: k.catalogue(), Logger: k.log,
		Proxy: netproxy.Config{Dial: k.net.dial, API: k.dialSandboxAPI},
	})
	if err != nil {
		return nil, fmt.Errorf("open the node's network router: %w", err)
	}
	k.net.node = n
	// The vault keeps the namespace for the keeper that replaces this
	// one (a kill -9 loses it: the sandboxes are attached again).
	if f, err := os.Open(filepath.Join(k.l.NetworkDir(), "router")); err == nil {
		if err := k.vault.put(vaultNode, vaultRouter, f); err != nil {
			k.log.Warn("keep the router namespace in the vault", "err", err)
		}
		f.Close()
	}
	return n, nil
}

// dialSandboxAPI connects to dsec up's API for sandboxes (a socket only
// root can open) and says which sandbox the connection is from, in the
// preamble netpolicy.SandboxAPIPreamble writes.
func (k *Keeper) dialSandboxAPI(ctx context.Context, sandbox string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", k.l.SandboxAPISocket())
	if err != nil {
		return nil, fmt.Errorf("the platform's API for sandboxes: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetWriteDeadline(dl)
	}
	if _, err := c.Write(netpolicy.SandboxAPIPreamble(sandbox)); err != nil {
		c.Close()
		return nil, fmt.Errorf("the platform's API for sandboxes: %w", err)
	}
	_ = c.SetWriteDeadline(time.Time{})
	return c, nil
}

// openedNode returns the node's network if it is open.
func (k *Keeper) openedNode() *netproxy.Node {
	k.net.mu.Lock()
	defer k.net.mu.Unlock()
	return k.net.node
}

// closeNetwork stops the proxy and the resolver; the router namespace
// stays for the next keeper (when it outlives this one).
func (k *Keeper) closeNetwork() {
	k.net.mu.Lock()
	n := k.net.node
	k.net.node = nil
	k.net.mu.Unlock()
	if n != nil {
		if err := n.Close(); err != nil {
			k.log.Warn("close the node's network", "err", err)
		}
	}
}

// initNetNS opens the network namespace of b's init, checked against the
// namespace recorded when it started, so that a reused pid cannot give
// another process's namespace a link.
func initNetNS(b *box) (int, error) {
	b.mu.Lock()
	pid, start, want, state := b.info.Pid, b.info.StartTime, b.info.NS, b.info.State
	b.mu.Unlock()
	if state != StateRunning || pid <= 0 {
		return -1, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is not running: a network is given only to a running sandbox", b.info.ID)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s: its init is gone: delete it", b.info.ID)
	}
	// The start time is read after the open: the descriptor is of the
	// process that has that start time.
	if st, err := ProcStartTime(pid); err != nil || st != start {
		unix.Close(fd)
		return -1, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s: its init is gone: delete it", b.info.ID)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("stat the network namespace of sandbox %s: %w", b.info.ID, err)
	}
	if w, ok := want["net"]; ok && (w.Dev != uint64(st.Dev) || w.Ino != st.Ino) {
		unix.Close(fd)
		return -1, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"the sandbox's init is no longer in the net namespace it was started in: the sandbox was tampered with; delete it")
	}
	return fd, nil
}

// setNetwork gives sandbox id a network under req's policy, or replaces
// its policy (PUT /v1/network).
func (k *Keeper) setNetwork(ctx context.Context, id string, req NetworkRequest) (NetworkInfo, error) {
	if err := validID(id); err != nil {
		return NetworkInfo{}, err
	}
	spec, err := netpolicy.ParsePolicyJSON(req.Policy)
	if err != nil {
		return NetworkInfo{}, err
	}
	// Checked before the router is opened for it.
	if _, err := netpolicy.Compile(spec, k.catalogue()); err != nil {
		return NetworkInfo{}, err
	}
	b, err := k.lookup(id)
	if err != nil {
		return NetworkInfo{}, err
	}
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	deleting := b.deleting
	b.mu.Unlock()
	if deleting {
		return NetworkInfo{}, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", id)
	}
	n, err := k.netNode()
	if err != nil {
		return NetworkInfo{}, err
	}
	pol, err := n.Compile(spec)
	if err != nil {
		return NetworkInfo{}, err
	}
	if _, ok := n.Link(id); ok {
		if _, err := n.SetPolicy(id, pol); err != nil {
			return NetworkInfo{}, err
		}
	} else {
		fd, err := initNetNS(b)
		if err != nil {
			return NetworkInfo{}, err
		}
		_, err = n.Attach(id, fd, pol)
		unix.Close(fd)
		if err != nil {
			return NetworkInfo{}, err
		}
	}
	if err := k.recordNetwork(b, netpolicy.MarshalPolicyJSON(spec)); err != nil {
		return NetworkInfo{}, err
	}
	return k.network(id)
}

// recordNetwork stores doc as b's network in its record (keeper.json),
// which a restarted keeper enforces again.
func (k *Keeper) recordNetwork(b *box, doc json.RawMessage) error {
	b.mu.Lock()
	b.info.Network = doc
	rec := b.info
	b.mu.Unlock()
	if err := writeJSON(filepath.Join(k.l.SandboxDir(rec.ID), "keeper.json"), rec); err != nil {
		return fmt.Errorf("record the network of sandbox %s: %w", rec.ID, err)
	}
	return nil
}

// network reports sandbox id's network (GET /v1/network).
func (k *Keeper) network(id string) (NetworkInfo, error) {
	b, err := k.lookup(id)
	if err != nil {
		return NetworkInfo{}, err
	}
	b.mu.Lock()
	info := NetworkInfo{Policy: b.info.Network}
	b.mu.Unlock()
	n := k.openedNode()
	if n == nil || len(info.Policy) == 0 {
		return info, nil
	}
	if l, ok := n.Link(id); ok {
		info.Address, info.Router = l.SandboxAddr.String(), l.RouterAddr.String()
	}
	if st, ok := n.Stats(id); ok {
		info.BytesOut, info.BytesIn = st.BytesOut, st.BytesIn
		info.ConnsOut, info.ConnsActive = st.ConnsOut, st.ConnsActive
		info.Denied, info.DNSQueries, info.DNSDenied = st.Denied, st.DNSQueries, st.DNSDenied
		for _, d := range st.Denials {
			info.Denials = append(info.Denials, Denial{Time: d.Time.UTC(), Dest: d.Dest, Name: d.Name, Reason: d.Reason})
		}
	}
	return info, nil
}

// nodeNetwork reports the node's network totals (GET /v1/network/node).
func (k *Keeper) nodeNetwork() NodeNetwork {
	n := k.openedNode()
	if n == nil {
		return NodeNetwork{}
	}
	t := n.Totals()
	return NodeNetwork{
		BytesOut: t.BytesOut, BytesIn: t.BytesIn, ConnsOut: t.ConnsOut, ConnsActive: t.ConnsActive,
		Denied: t.Denied, DNSQueries: t.DNSQueries, DNSDenied: t.DNSDenied,
		Links: t.Links, ProxySandboxes: t.ProxySandboxes, ResolverSandboxes: t.ResolverSandboxes,
	}
}

// deleteNetwork removes sandbox id's link (DELETE /v1/network): it keeps
// loopback only.
func (k *Keeper) deleteNetwork(id string) error {
	b, err := k.lookup(id)
	if err != nil {
		return err
	}
	b.op.Lock()
	defer b.op.Unlock()
	if n := k.openedNode(); n != nil {
		if err := n.Detach(id); err != nil {
			return err
		}
	}
	b.mu.Lock()
	had := len(b.info.Network) > 0
	b.mu.Unlock()
	if !had {
		return nil
	}
	return k.recordNetwork(b, nil)
}

// dropNetwork forgets a deleted sandbox's link, resolver records and
// proxy state.
func (k *Keeper) dropNetwork(id string) {
	if n := k.openedNode(); n != nil {
		if err := n.Detach(id); err != nil {
			k.log.Warn("remove the network link of a deleted sandbox", "sandbox", id, "err", err)
		}
	}
}
