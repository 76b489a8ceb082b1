package netns

import "net/netip"

// DefaultPool is the address pool when Open is given the zero prefix: the
// shared address space of RFC 6598, which hosts rarely route and which
// never appears in the host's namespace here anyway.
var DefaultPool = netip.MustParsePrefix("100.64.0.0/10")

// SandboxIfName is the name of the link in every sandbox's namespace.
const SandboxIfName = "eth0"

// Link is one sandbox's attachment to the router.
type Link struct {
	// ID is the sandbox's ID, as given to Attach.
	ID string
	// RouterName is the link's name in the router namespace.
	RouterName string
	// RouterAddr is the router end's address: the sandbox's gateway, and
	// the address the node's proxy and resolver answer on for it.
	RouterAddr netip.Addr
	// SandboxAddr is the sandbox end's address (on SandboxIfName).
	SandboxAddr netip.Addr
}
