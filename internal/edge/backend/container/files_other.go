//go:build !linux

package container

import (
	"context"
	"errors"
	"io"

	"github.com/dsecproject/dsec/internal/edge/sandbox"
)

// ReadFile needs Linux.
func (b *Backend) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, sandbox.FileInfo, error) {
	return nil, sandbox.FileInfo{}, errors.ErrUnsupported
}

// WriteFile needs Linux.
func (b *Backend) WriteFile(ctx context.Context, id, path string, opts sandbox.WriteOptions, r io.Reader) (sandbox.FileInfo, error) {
	return sandbox.FileInfo{}, errors.ErrUnsupported
}
