package blobsource

import (
	"context"
	"errors"
)

// Dir reads blobs from a directory in internal/blobstore's layout:
// <root>/sha256/<hex>.
type Dir struct {
	dir string // <root>/sha256, absolute
}

var _ Source = (*Dir)(nil)

// NewDir returns a Source reading the blob store at root. The store must
// exist; NewDir never writes to it.
func NewDir(root string) (Source, error) {
	return nil, errors.ErrUnsupported
}

// ReadAt implements Source.
func (d *Dir) ReadAt(ctx context.Context, digest string, p []byte, off int64) (int, error) {
	return 0, errors.ErrUnsupported
}

// Size implements Source.
func (d *Dir) Size(ctx context.Context, digest string) (int64, error) {
	return 0, errors.ErrUnsupported
}
