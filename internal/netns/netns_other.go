//go:build !linux

package netns

import (
	"errors"
	"net/netip"
)

// Router is unsupported off Linux.
type Router struct{}

// Open returns errors.ErrUnsupported off Linux.
func Open(dir string, pool netip.Prefix) (*Router, error) { return nil, errors.ErrUnsupported }

// Attach returns errors.ErrUnsupported off Linux.
func (r *Router) Attach(id, sandboxNS string) (Link, error) { return Link{}, errors.ErrUnsupported }

// AttachFd returns errors.ErrUnsupported off Linux.
func (r *Router) AttachFd(id string, fd int) (Link, error) { return Link{}, errors.ErrUnsupported }

// Detach returns errors.ErrUnsupported off Linux.
func (r *Router) Detach(id string) error { return errors.ErrUnsupported }

// Link returns no link off Linux.
func (r *Router) Link(id string) (Link, bool) { return Link{}, false }

// Count returns 0 off Linux.
func (r *Router) Count() int { return 0 }

// Links returns nil off Linux.
func (r *Router) Links() []Link { return nil }

// Sweep returns errors.ErrUnsupported off Linux.
func (r *Router) Sweep(keep func(id string) bool) ([]string, error) {
	return nil, errors.ErrUnsupported
}

// Close returns errors.ErrUnsupported off Linux.
func (r *Router) Close() error { return errors.ErrUnsupported }

// Destroy returns errors.ErrUnsupported off Linux.
func (r *Router) Destroy() error { return errors.ErrUnsupported }

// Remove returns errors.ErrUnsupported off Linux.
func Remove(dir string) error { return errors.ErrUnsupported }

// Do returns errors.ErrUnsupported off Linux.
func (r *Router) Do(fn func() error) error { return errors.ErrUnsupported }

// NSFd returns -1 off Linux.
func (r *Router) NSFd() int { return -1 }

// Pool returns the zero prefix off Linux.
func (r *Router) Pool() netip.Prefix { return netip.Prefix{} }

// Mount returns errors.ErrUnsupported off Linux.
func Mount(dir string, nsFd int) error { return errors.ErrUnsupported }
