//go:build !linux

package pageout

import (
	"context"
	"errors"
)

// Process is a process whose memory is advised; Linux only.
type Process struct{}

// Open reports errors.ErrUnsupported.
func Open(int) (*Process, error) { return nil, errors.ErrUnsupported }

// Close does nothing.
func (*Process) Close() error { return nil }

// Pid is 0.
func (*Process) Pid() int { return 0 }

// Mappings reports errors.ErrUnsupported.
func (*Process) Mappings() ([]Range, error) { return nil, errors.ErrUnsupported }

// Resident reports errors.ErrUnsupported.
func (*Process) Resident() ([]Range, error) { return nil, errors.ErrUnsupported }

// Advise reports errors.ErrUnsupported.
func (*Process) Advise(context.Context, []Range, Advice) (uint64, error) {
	return 0, errors.ErrUnsupported
}
