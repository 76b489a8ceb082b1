// Package netfw installs the node's firewall in the router network
// namespace (internal/netns): one nftables table, "inet dsec", that sends
// every connection a sandbox makes to the node's egress proxy, every DNS
// query to the node resolver and (with a UDP port) its other UDP by TPROXY
// to the proxy's UDP relay, and drops everything else the sandboxes' links
// carry. Route adds the policy routing TPROXY needs, in the router
// namespace too.
//
// Invariants:
//   - The table lives in the router namespace only: the netlink socket is
//     bound to the namespace's fd (nftables.WithNetNSFd), so the host's
//     own rules are never read or changed.
//   - Install replaces the whole table in one netlink batch, which the
//     kernel applies atomically: a restarted keeper never leaves a moment
//     without rules, and never two copies.
//   - The rules match the router ends of the sandboxes' links by name
//     ("dsr*", netns's prefix), so a link attached later is covered with
//     no rule change.
//
// Linux only; elsewhere every function returns errors.ErrUnsupported.
package netfw

// TableName is the table's name in the router namespace (family inet).
const TableName = "dsec"

// LinkPrefix is the prefix of the router ends' names (netns's "dsr").
const LinkPrefix = "dsr"

// UDPMark is the packet mark the firewall gives the UDP it sends to the
// relay, and UDPTable the routing table Route makes for it (a local route
// for every address, so the kernel delivers those datagrams to the
// relay's socket instead of forwarding them). Both exist in the router
// namespace only.
const (
	UDPMark  = 0xd5ec
	UDPTable = 0xd5ec
)

// Config says where the redirected traffic goes and how fast a sandbox may
// open it. The zero rates take the defaults.
type Config struct {
	// ProxyPort is the egress proxy's TCP port in the router namespace
	// (listening on every router address). Required.
	ProxyPort uint16
	// DNSPort is the node resolver's UDP and TCP port there. Required.
	DNSPort uint16
	// UDPPort is the UDP relay's port there (a transparent socket, on
	// every address): the sandboxes' UDP other than DNS goes to it by
	// TPROXY, marked UDPMark, which Route sends to the local table. Zero:
	// no relay, all UDP other than DNS is dropped.
	UDPPort uint16
	// UDPRate and UDPBurst bound each source address's UDP datagrams
	// (other than DNS) a second, before they reach the relay's shared
	// socket. Defaults 1000 and 2000: a flooding sandbox queues at most
	// that many ahead of another's datagram.
	UDPRate, UDPBurst uint32
	// DNSRate and DNSBurst bound each source address's DNS packets a
	// second, before they reach the resolver's shared socket (the
	// resolver has its own per-sandbox budget behind it). Defaults 200
	// and 400.
	DNSRate, DNSBurst uint32
	// ConnRate and ConnBurst bound each source address's new TCP
	// connections a second; beyond, SYNs are dropped (the client retries)
	// before they reach the proxy's accept queue. Defaults 200 and 400.
	ConnRate, ConnBurst uint32
}

func (c *Config) setDefaults() {
	def := func(v *uint32, d uint32) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.DNSRate, 200)
	def(&c.DNSBurst, 400)
	def(&c.ConnRate, 200)
	def(&c.ConnBurst, 400)
	def(&c.UDPRate, 1000)
	def(&c.UDPBurst, 2000)
}
