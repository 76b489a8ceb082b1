//go:build !linux

package sandboxfs

import (
	"context"
	"errors"
	"io"
)

// WriteTar returns errors.ErrUnsupported.
func (r *Root) WriteTar(ctx context.Context, p string, w io.Writer, opts TarOptions) (TarStats, error) {
	return TarStats{}, errors.ErrUnsupported
}

// ExtractTar returns errors.ErrUnsupported.
func (r *Root) ExtractTar(ctx context.Context, dest string, src io.Reader, opts ExtractOptions) (TarStats, error) {
	return TarStats{}, errors.ErrUnsupported
}
