//go:build !linux

package diskquota

import (
	"context"
	"errors"
	"syscall"
)

// FS is the set of limited directories under one mount point. Off Linux
// every method reports errors.ErrUnsupported.
type FS struct{}

// Open reports errors.ErrUnsupported: loop devices and quotas exist only on
// Linux.
func Open(context.Context, Config) (*FS, error) { return nil, errors.ErrUnsupported }

// Mode returns ModeAuto.
func (*FS) Mode() Mode { return ModeAuto }

// Create reports errors.ErrUnsupported.
func (*FS) Create(context.Context, string, int64, int64) (Dir, error) {
	return Dir{}, errors.ErrUnsupported
}

// Usage reports errors.ErrUnsupported.
func (*FS) Usage(string) (int64, int64, error) { return 0, 0, errors.ErrUnsupported }

// SetLimit reports errors.ErrUnsupported.
func (*FS) SetLimit(context.Context, string, int64, int64) error { return errors.ErrUnsupported }

// Remove reports errors.ErrUnsupported.
func (*FS) Remove(context.Context, string) error { return errors.ErrUnsupported }

// List reports errors.ErrUnsupported.
func (*FS) List() ([]Dir, error) { return nil, errors.ErrUnsupported }

// Close reports errors.ErrUnsupported.
func (*FS) Close() error { return errors.ErrUnsupported }

// IsFull reports whether err is ENOSPC.
func IsFull(err error) bool { return errors.Is(err, syscall.ENOSPC) }

// FullError returns err.
func FullError(_ string, err error) error { return err }
