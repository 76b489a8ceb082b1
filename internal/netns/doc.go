// Package netns plumbs sandboxes with network into one router network
// namespace per node: a veth pair per sandbox, one end in the sandbox's
// namespace (named eth0, with a point-to-point /31 address and a default
// route), the other in the router namespace (with the pair's other address).
//
// Invariants:
//   - The host's namespace is never touched: no link, address, route or
//     sysctl is made there. The router namespace has forwarding off
//     (net.ipv4.ip_forward=0) and strict reverse-path filtering, so a
//     sandbox reaches only the router's own addresses, never another
//     sandbox, and cannot claim another sandbox's source address.
//   - No bridge: links are independent, so their number is bounded only by
//     the address pool.
//   - Every router-side link carries the sandbox's ID in its alias
//     ("dsec:ID") and its /31 address in the pool; that is the whole
//     allocation state, so Open after a crash adopts what is there and
//     removes what it cannot account for, with no state file.
//   - Namespace switches happen only on a locked OS thread that is thrown
//     away afterwards; netlink work goes through handles bound to a
//     namespace (netlink.NewHandleAt), so no caller's thread changes
//     namespace.
//
// Linux only; elsewhere every function returns errors.ErrUnsupported.
package netns
