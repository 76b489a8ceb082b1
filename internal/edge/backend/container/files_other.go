//go:build !linux

package container

import (
	"context"
	"errors"
	"io"
	"io/fs"

	"github.com/dsecproject/dsec/internal/sandbox"
)

// ReadFile needs Linux.
func (b *Backend) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, sandbox.FileInfo, error) {
	return nil, sandbox.FileInfo{}, errors.ErrUnsupported
}

// WriteFile needs Linux.
func (b *Backend) WriteFile(ctx context.Context, id, path string, opts sandbox.WriteOptions, r io.Reader) (sandbox.FileInfo, error) {
	return sandbox.FileInfo{}, errors.ErrUnsupported
}

func (b *Backend) Stat(ctx context.Context, id, path string) (sandbox.FileInfo, error) {
	return sandbox.FileInfo{}, errors.ErrUnsupported
}

func (b *Backend) ReadDir(ctx context.Context, id, path string, limit int) ([]sandbox.FileInfo, bool, error) {
	return nil, false, errors.ErrUnsupported
}

func (b *Backend) Mkdir(ctx context.Context, id, path string, mode fs.FileMode, parents bool, uid, gid uint32) (sandbox.FileInfo, error) {
	return sandbox.FileInfo{}, errors.ErrUnsupported
}

func (b *Backend) Remove(ctx context.Context, id, path string, recursive bool) error {
	return errors.ErrUnsupported
}

func (b *Backend) Rename(ctx context.Context, id, from, to string, overwrite bool) error {
	return errors.ErrUnsupported
}

func (b *Backend) DownloadTar(ctx context.Context, id, path string, w io.Writer) error {
	return errors.ErrUnsupported
}

func (b *Backend) DownloadTarStats(ctx context.Context, id, path string, w io.Writer, maxBytes int64) (sandbox.TarStats, error) {
	return sandbox.TarStats{}, errors.ErrUnsupported
}

func (b *Backend) UploadTarLinks(ctx context.Context, id, dir string, r io.Reader, opts sandbox.TarOptions) (sandbox.TarStats, error) {
	return sandbox.TarStats{}, errors.ErrUnsupported
}

func (b *Backend) UploadTar(ctx context.Context, id, dir string, r io.Reader, opts sandbox.TarOptions) (sandbox.TarStats, error) {
	return sandbox.TarStats{}, errors.ErrUnsupported
}
