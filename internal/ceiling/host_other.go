//go:build !linux

package ceiling

import (
	"errors"
	"fmt"
)

// ReadHost is Linux-only.
func ReadHost() (Host, error) {
	return Host{}, fmt.Errorf("read host limits: %w", errors.ErrUnsupported)
}

// DiskSpace is Linux-only.
func DiskSpace(path string) (Space, error) {
	return Space{}, fmt.Errorf("measure the file system of %s: %w", path, errors.ErrUnsupported)
}
