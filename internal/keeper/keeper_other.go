//go:build !linux

package keeper

import (
	"context"
	"errors"
)

// Run needs Linux.
func Run(ctx context.Context, cfg Config) error { return errors.ErrUnsupported }

// Start needs Linux.
func Start(ctx context.Context, self, stateDir string, s Settings) error {
	return errors.ErrUnsupported
}

// Takeover needs Linux.
func Takeover(ctx context.Context, self, stateDir string, s Settings, old Version) error {
	return errors.ErrUnsupported
}
