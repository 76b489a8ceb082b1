//go:build !linux

package container

import (
	"context"
	"errors"
	"net"
)

// DialPort implements sandbox.PortDialer; only Linux has the container
// backend.
func (b *Backend) DialPort(context.Context, string, int) (net.Conn, error) {
	return nil, errors.ErrUnsupported
}
