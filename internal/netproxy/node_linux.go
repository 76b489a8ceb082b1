package netproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/netdns"
	"github.com/dsecproject/dsec/internal/netfw"
	"github.com/dsecproject/dsec/internal/netns"
	"github.com/dsecproject/dsec/internal/netpolicy"
)

// NodeConfig configures a Node. Dir is required; the rest defaults.
type NodeConfig struct {
	// Dir holds the router namespace (netns.Open's dir).
	Dir string
	// Pool is the sandboxes' address pool; zero is netns.DefaultPool.
	Pool netip.Prefix
	// Catalogue is the services and the resolver's settings (the
	// operator's network config); nil is netpolicy.Builtin(). The node
	// compiles against a copy whose Local is the node's own addresses and
	// Pool.
	Catalogue *netpolicy.Catalogue
	// Proxy and DNS configure the proxy and the resolver; the node sets
	// their Resolved, Denied, Upstreams and Hosts.
	Proxy Config
	DNS   netdns.Config
	// UDP bounds the UDP relay (UDP by a CIDR rule); it dials with
	// Proxy.Dial.
	UDP UDPConfig
	// Logger receives warnings. Default: discard.
	Logger *slog.Logger
}

// Node is a node's whole egress: the router namespace, its firewall, the
// proxy and the resolver, serving from Open until Close.
type Node struct {
	router *netns.Router
	routes *hostRoutes // the host's routes: is a destination the node's own
	proxy  *Proxy
	res    *netdns.Resolver
	udp    *udpRelay
	cat    *netpolicy.Catalogue
	log    *slog.Logger
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// OpenNode opens (or reopens, after a restart) the router namespace in
// cfg.Dir, creates the proxy's and the resolver's listeners inside it,
// installs (or replaces) the firewall that redirects the sandboxes' links
// to them, and starts serving. Until Restore or Attach registers a
// sandbox, its connections are reset and its queries unanswered.
func OpenNode(cfg NodeConfig) (n *Node, err error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("network node: no directory: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cat := cfg.Catalogue
	if cat == nil {
		cat = netpolicy.Builtin()
	}
	local, err := hostPrefixes()
	if err != nil {
		return nil, err
	}
	routes, err := newHostRoutes()
	if err != nil {
		return nil, err
	}
	r, err := netns.Open(cfg.Dir, cfg.Pool)
	if err != nil {
		routes.close()
		return nil, err
	}
	defer func() {
		if err != nil {
			r.Close()
			routes.close()
		}
	}()
	c := *cat
	c.Local = append(append(append([]netip.Prefix(nil), cat.Local...), local...), r.Pool())
	n = &Node{router: r, routes: routes, cat: &c, log: cfg.Logger}

	var (
		ln    net.Listener
		dnsPC net.PacketConn
		dnsLn net.Listener
		udpPC *net.UDPConn
	)
	// The listeners are made inside the router namespace, on every
	// router address; the firewall's REDIRECT sends each link's traffic
	// to its own router address.
	if err := r.Do(func() error {
		var err error
		if ln, err = net.Listen("tcp4", "0.0.0.0:0"); err != nil {
			return err
		}
		if dnsPC, err = net.ListenPacket("udp4", "0.0.0.0:0"); err != nil {
			return err
		}
		port := dnsPC.LocalAddr().(*net.UDPAddr).Port
		if dnsLn, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port)); err != nil {
			return err
		}
		udpPC, err = listenUDPRelay()
		return err
	}); err != nil {
		for _, c := range []interface{ Close() error }{ln, dnsPC, dnsLn} {
			if c != nil {
				c.Close()
			}
		}
		if udpPC != nil {
			udpPC.Close()
		}
		return nil, fmt.Errorf("network node: listen in the router namespace: %w", err)
	}
	closeAll := func() { ln.Close(); dnsPC.Close(); dnsLn.Close(); udpPC.Close() }

	dcfg := cfg.DNS
	if len(dcfg.Upstreams) == 0 {
		dcfg.Upstreams = c.Upstreams
	}
	if dcfg.Hosts == nil {
		dcfg.Hosts = c.Hosts
	}
	if dcfg.Internal == nil {
		dcfg.Internal = c.Internal
	}
	if dcfg.Logger == nil {
		dcfg.Logger = cfg.Logger
	}
	var proxy *Proxy
	dcfg.Denied = func(sandbox, name string) { proxy.DeniedName(sandbox, name) }
	res, err := netdns.New(dcfg)
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("network node: resolver: %w", err)
	}
	pcfg := cfg.Proxy
	pcfg.Resolved = res.Resolved
	if pcfg.Local == nil {
		pcfg.Local = routes.local
	}
	if pcfg.Logger == nil {
		pcfg.Logger = cfg.Logger
	}
	proxy = New(pcfg)
	n.proxy, n.res = proxy, res
	n.udp = newUDPRelay(proxy, cfg.UDP, udpPC)

	if err := netfw.Route(r.NSFd()); err != nil {
		res.Close()
		closeAll()
		return nil, err
	}
	if err := netfw.Install(r.NSFd(), netfw.Config{
		ProxyPort: uint16(ln.Addr().(*net.TCPAddr).Port),
		DNSPort:   uint16(dnsPC.LocalAddr().(*net.UDPAddr).Port),
		UDPPort:   n.udp.port(),
	}); err != nil {
		res.Close()
		closeAll()
		return nil, err
	}

	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(4)
	go func() {
		defer n.wg.Done()
		if err := n.udp.serve(ctx); err != nil {
			n.log.Warn("udp relay stopped", "err", err)
		}
	}()
	go func() {
		defer n.wg.Done()
		if err := r.Do(func() error { return serveMaker(ctx, n.udp.mk) }); err != nil && ctx.Err() == nil {
			n.log.Warn("udp relay: reply sockets", "err", err)
		}
	}()
	go func() {
		defer n.wg.Done()
		if err := proxy.Serve(ctx, ln); err != nil {
			n.log.Warn("egress proxy stopped", "err", err)
		}
	}()
	go func() {
		defer n.wg.Done()
		if err := res.Serve(ctx, dnsPC, dnsLn, proxy); err != nil {
			n.log.Warn("node resolver stopped", "err", err)
		}
	}()
	return n, nil
}

// hostPrefixes are the host's own addresses, as /32 and /128 networks.
func hostPrefixes() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("network node: the host's addresses: %w", err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out, nil
}

// Compile compiles a policy against the node's catalogue.
func (n *Node) Compile(spec netpolicy.Spec) (*netpolicy.Policy, error) {
	return netpolicy.Compile(spec, n.cat)
}

// Attach gives sandbox id (whose network namespace nsFd is) a link, or
// keeps the one it has, and puts pol in force for it; for a sandbox that
// has one, it replaces the policy and cuts the connections pol no longer
// allows.
func (n *Node) Attach(id string, nsFd int, pol *netpolicy.Policy) (netns.Link, error) {
	l, ok := n.Link(id)
	if !ok {
		var err error
		if l, err = n.router.AttachFd(id, nsFd); err != nil {
			return netns.Link{}, err
		}
	}
	if _, err := n.proxy.Set(id, l.SandboxAddr, l.RouterAddr, pol); err != nil {
		if !ok {
			n.router.Detach(id)
		}
		return netns.Link{}, err
	}
	n.udp.rejudge(id, pol)
	return l, nil
}

// Restore puts pol in force for sandbox id's existing link (after a
// restart); false when it has none.
func (n *Node) Restore(id string, pol *netpolicy.Policy) (netns.Link, bool, error) {
	l, ok := n.Link(id)
	if !ok {
		return netns.Link{}, false, nil
	}
	_, err := n.proxy.Set(id, l.SandboxAddr, l.RouterAddr, pol)
	if err == nil {
		n.udp.rejudge(id, pol)
	}
	return l, err == nil, err
}

// SetPolicy replaces the policy of sandbox id, which has a link, and
// returns how many established connections it cut.
func (n *Node) SetPolicy(id string, pol *netpolicy.Policy) (int, error) {
	l, ok := n.Link(id)
	if !ok {
		return 0, fmt.Errorf("sandbox %s has no network: %w", id, errdefs.ErrNotFound)
	}
	cut, err := n.proxy.Set(id, l.SandboxAddr, l.RouterAddr, pol)
	if err != nil {
		return cut, err
	}
	return cut + n.udp.rejudge(id, pol), nil
}

// Link returns sandbox id's link.
func (n *Node) Link(id string) (netns.Link, bool) { return n.router.Link(id) }

// Totals are the node's network counters (netproxy's Totals) and what it
// holds: links, sandboxes in the proxy and in the resolver.
type Totals struct {
	Stats
	Links, ProxySandboxes, ResolverSandboxes int
}

// Totals returns the node's counters, added up over every sandbox since
// the node opened, and what it holds now.
func (n *Node) Totals() Totals {
	st, sbs := n.proxy.Totals()
	return Totals{Stats: st, Links: n.router.Count(), ProxySandboxes: sbs, ResolverSandboxes: n.res.Sandboxes()}
}

// Stats returns sandbox id's counters.
func (n *Node) Stats(id string) (Stats, bool) { return n.proxy.Stats(id) }

// UDPStats returns sandbox id's UDP relay counters (false before its
// first datagram).
func (n *Node) UDPStats(id string) (UDPStats, bool) { return n.udp.stats(id) }

// Detach removes sandbox id's link, cuts its connections and forgets what
// it resolved. A sandbox without a link is no error.
func (n *Node) Detach(id string) error {
	n.proxy.Remove(id)
	n.udp.remove(id)
	n.res.Forget(id)
	l, ok := n.Link(id)
	if !ok {
		return nil
	}
	err := n.router.Detach(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	// After the link: no packet from the address can meter it again.
	if err := netfw.Forget(n.router.NSFd(), l.SandboxAddr); err != nil {
		n.log.Warn("forget a deleted link's address in the firewall's meters", "sandbox", id, "err", err)
	}
	return nil
}

// Sweep removes the links (and the proxy's state) of sandboxes keep does
// not keep. keep must not call n.
func (n *Node) Sweep(keep func(id string) bool) ([]string, error) {
	removed, err := n.router.Sweep(keep)
	for _, id := range removed {
		n.proxy.Remove(id)
		n.udp.remove(id)
		n.res.Forget(id)
	}
	return removed, err
}

// Close stops serving and releases the router; the namespace, its links
// and its firewall stay for the next OpenNode (a restarted keeper), which
// replaces the firewall. Connections in progress are cut.
func (n *Node) Close() error {
	n.cancel()
	n.wg.Wait()
	n.res.Close()
	n.routes.close()
	return n.router.Close()
}

// Destroy stops serving and removes the router namespace with every link
// and the firewall (the table goes with its namespace).
func (n *Node) Destroy() error {
	n.cancel()
	n.wg.Wait()
	n.res.Close()
	n.routes.close()
	if err := netfw.Remove(n.router.NSFd()); err != nil {
		n.log.Warn("remove router firewall", "err", err)
	}
	return n.router.Destroy()
}
