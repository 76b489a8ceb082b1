//go:build !linux

package netfw

import (
	"errors"
	"net/netip"
)

// Install returns errors.ErrUnsupported off Linux.
func Install(nsFd int, cfg Config) error { return errors.ErrUnsupported }

// Remove returns errors.ErrUnsupported off Linux.
func Remove(nsFd int) error { return errors.ErrUnsupported }

// Installed returns errors.ErrUnsupported off Linux.
func Installed(nsFd int) (bool, error) { return false, errors.ErrUnsupported }

// Forget is not supported off Linux.
func Forget(nsFd int, a netip.Addr) error { return errors.ErrUnsupported }

// Route returns errors.ErrUnsupported off Linux.
func Route(nsFd int) error { return errors.ErrUnsupported }
