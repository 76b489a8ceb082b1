//go:build !linux

package cgroup

import (
	"errors"
	"fmt"
)

// DetectLayout reports errors.ErrUnsupported: cgroups exist only on Linux.
func DetectLayout() (Layout, error) {
	return Layout{}, fmt.Errorf("detect cgroup layout: %w", errors.ErrUnsupported)
}
