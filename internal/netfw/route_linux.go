package netfw

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Route makes, in the router namespace nsFd (never the host's), the policy
// routing TPROXY needs: packets marked UDPMark look up table UDPTable,
// whose one route makes every IPv4 address local (on lo), so a marked
// datagram is delivered to the relay's socket instead of forwarded. It is
// idempotent: a restarted keeper finds the rule and the route in place.
func Route(nsFd int) error {
	h, err := netlink.NewHandleAt(vnetns.NsHandle(nsFd))
	if err != nil {
		return fmt.Errorf("router routing: netlink: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("router routing: lo: %w", err)
	}
	rt := &netlink.Route{
		LinkIndex: lo.Attrs().Index, Table: UDPTable, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Family: netlink.FAMILY_V4,
	}
	if err := h.RouteReplace(rt); err != nil {
		return fmt.Errorf("router routing: local route: %w", err)
	}
	rules, err := h.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("router routing: rules: %w", err)
	}
	for _, r := range rules {
		if r.Table == UDPTable && r.Mark == UDPMark {
			return nil
		}
	}
	r := netlink.NewRule()
	r.Family = netlink.FAMILY_V4
	r.Mark = UDPMark
	r.Table = UDPTable
	r.Priority = 100
	if err := h.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("router routing: rule: %w", err)
	}
	return nil
}
