//go:build !linux

package netproxy

import (
	"errors"
	"net"
	"net/netip"
)

func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.ErrUnsupported
}
