//go:build !linux

package purge

import (
	"context"
	"errors"
)

// Run needs Linux.
func Run(ctx context.Context, cfg Config) error { return errors.ErrUnsupported }
