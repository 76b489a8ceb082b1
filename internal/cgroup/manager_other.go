//go:build !linux

package cgroup

import (
	"context"
	"errors"
)

// Manager creates and removes the groups under one parent group. Off
// Linux every method reports errors.ErrUnsupported.
type Manager struct{}

// New reports errors.ErrUnsupported: cgroups exist only on Linux.
func New(Config) (*Manager, error) { return nil, errors.ErrUnsupported }

// Layout returns the zero Layout.
func (*Manager) Layout() Layout { return Layout{} }

// Create reports errors.ErrUnsupported.
func (*Manager) Create(string, Resources) error { return errors.ErrUnsupported }

// ProcsFiles reports errors.ErrUnsupported.
func (*Manager) ProcsFiles(string) ([]string, error) { return nil, errors.ErrUnsupported }

// Add reports errors.ErrUnsupported.
func (*Manager) Add(string, int) error { return errors.ErrUnsupported }

// Stats reports errors.ErrUnsupported.
func (*Manager) Stats(string) (Stats, error) { return Stats{}, errors.ErrUnsupported }

// Kill reports errors.ErrUnsupported.
func (*Manager) Kill(context.Context, string) error { return errors.ErrUnsupported }

// Freeze reports errors.ErrUnsupported.
func (*Manager) Freeze(context.Context, string) error { return errors.ErrUnsupported }

// Thaw reports errors.ErrUnsupported.
func (*Manager) Thaw(context.Context, string) error { return errors.ErrUnsupported }

// Delete reports errors.ErrUnsupported.
func (*Manager) Delete(context.Context, string) error { return errors.ErrUnsupported }

// List reports errors.ErrUnsupported.
func (*Manager) List() ([]string, error) { return nil, errors.ErrUnsupported }

// ApplyCeiling reports errors.ErrUnsupported.
func (*Manager) ApplyCeiling() error { return errors.ErrUnsupported }

// Ceiling reports errors.ErrUnsupported.
func (*Manager) Ceiling() (Stats, error) { return Stats{}, errors.ErrUnsupported }

// Procs reports errors.ErrUnsupported.
func (*Manager) Procs(string) ([]int, error) { return nil, errors.ErrUnsupported }

// AllowSwap reports errors.ErrUnsupported.
func (*Manager) AllowSwap(string, bool) error { return errors.ErrUnsupported }

// Reclaim reports errors.ErrUnsupported.
func (*Manager) Reclaim(context.Context, string) error { return errors.ErrUnsupported }

// Memory reports errors.ErrUnsupported.
func (*Manager) Memory(string) (Memory, error) { return Memory{}, errors.ErrUnsupported }

// SetMark reports errors.ErrUnsupported.
func (*Manager) SetMark(string, string, bool) error { return errors.ErrUnsupported }

// HasMark reports errors.ErrUnsupported.
func (*Manager) HasMark(string, string) (bool, error) { return false, errors.ErrUnsupported }
