package blobsource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/dsecproject/dsec/internal/errdefs"
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
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("blob source %s: %w", root, err)
	}
	d := filepath.Join(abs, "sha256")
	fi, err := os.Stat(d)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.Newf(errdefs.ErrNotFound,
			"blob source %s: no blob store there (want a directory with a sha256/ subdirectory)", root)
	}
	if err != nil {
		return nil, fmt.Errorf("blob source %s: %w", root, err)
	}
	if !fi.IsDir() {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "blob source %s: sha256 is not a directory", root)
	}
	return &Dir{dir: d}, nil
}

func (d *Dir) open(digest string) (*os.File, error) {
	h, err := checkDigest(digest)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(d.dir, h))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("blob %s: %w", digest, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", digest, err)
	}
	return f, nil
}

// ReadAt implements Source.
func (d *Dir) ReadAt(ctx context.Context, digest string, p []byte, off int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, errdefs.Newf(errdefs.ErrInvalidArgument, "blob %s: negative offset %d", digest, off)
	}
	f, err := d.open(digest)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := f.ReadAt(p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return n, fmt.Errorf("read blob %s: %w", digest, err)
	}
	return n, err
}

// Size implements Source.
func (d *Dir) Size(ctx context.Context, digest string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	f, err := d.open(digest)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("blob %s: %w", digest, err)
	}
	return fi.Size(), nil
}
