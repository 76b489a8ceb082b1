// Package netproxy is the node's transparent egress proxy: the router
// namespace's firewall (internal/netfw) redirects every TCP connection a
// sandbox makes to one listener here, which judges it by the sandbox's
// policy (internal/netpolicy) and, when allowed, dials the original
// destination from the host's namespace and copies both ways. Its UDP
// relay (udp_linux.go) does the same for the sandboxes' UDP other than DNS,
// which the firewall gives by TPROXY to one transparent socket: a flow per
// (source, original destination), allowed by CIDR rules only.
//
// Invariants:
//   - Fail closed: a connection from a source address that is no
//     registered sandbox's is reset at once; until the keeper registers a
//     sandbox (at a restart, before it restored the policies), every
//     connection is.
//   - A source address names its sandbox (the router's strict rp_filter
//     makes sure of it); the address a connection reached is never used
//     to tell sandboxes apart.
//   - Every connection is judged once, on its original destination and
//     the name its first bytes give (TLS SNI or HTTP Host), read within a
//     short bounded time and size; a policy update judges every
//     established connection of the sandbox again and cuts the ones it no
//     longer allows.
//   - UDP replies reach the sandbox from the original destination's
//     address and port (a transparent socket bound there); only the
//     destination's replies are relayed (a connected host-side socket).
//   - One sandbox's connections and UDP flows are bounded (at once and per second), and
//     so are the node's, so a flood from one cannot starve the others.
//
// The listener is created by the caller inside the router namespace; the
// proxy's own dials run on ordinary goroutines, in the keeper's (host's)
// namespace.
package netproxy
