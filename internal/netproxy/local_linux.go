package netproxy

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hostRoutes asks the routing table of the namespace it was made in (the
// host's, where the proxy dials) how the kernel would deliver an address.
// A node's addresses change while it runs (a new interface, a DHCP lease,
// a container bridge); the catalogue's Local is only those it had when
// the node opened, so every connection asks again.
type hostRoutes struct {
	h *netlink.Handle
}

// newHostRoutes opens a netlink socket in the calling thread's network
// namespace, which must be the host's.
func newHostRoutes() (*hostRoutes, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("network node: a netlink socket for the host's routes: %w", err)
	}
	if err := h.SetSocketTimeout(2 * time.Second); err != nil {
		h.Close()
		return nil, fmt.Errorf("network node: a netlink socket for the host's routes: %w", err)
	}
	return &hostRoutes{h: h}, nil
}

// local reports whether the host delivers a to itself: a local address
// (its own, any loopback), a broadcast, anycast or multicast route. An
// address with no route is not (its dial fails on its own); a lookup
// that fails otherwise counts as local, so the connection is refused.
// Safe for concurrent use (the handle locks its socket).
func (r *hostRoutes) local(a netip.Addr) bool {
	rs, err := r.h.RouteGet(a.Unmap().AsSlice())
	if err != nil {
		return !errors.Is(err, unix.ENETUNREACH) && !errors.Is(err, unix.EHOSTUNREACH)
	}
	for _, rt := range rs {
		if rt.Type != unix.RTN_UNICAST {
			return true
		}
	}
	return false
}

func (r *hostRoutes) close() { r.h.Close() }
