//go:build !linux

package sandboxfs

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// Root is a sandbox's root directory. Only Linux has sandboxes to open.
type Root struct{}

// OpenRoot returns errors.ErrUnsupported: sandboxes run on Linux only.
func OpenRoot(name string) (*Root, error) {
	return nil, fmt.Errorf("open sandbox root %s: %w", name, errors.ErrUnsupported)
}

// Close does nothing.
func (r *Root) Close() error { return nil }

// Stat returns errors.ErrUnsupported.
func (r *Root) Stat(p string) (Info, error) { return Info{}, errors.ErrUnsupported }

// Lstat returns errors.ErrUnsupported.
func (r *Root) Lstat(p string) (Info, error) { return Info{}, errors.ErrUnsupported }

// OpenRead returns errors.ErrUnsupported.
func (r *Root) OpenRead(p string) (*os.File, Info, error) {
	return nil, Info{}, errors.ErrUnsupported
}

// WriteFile returns errors.ErrUnsupported.
func (r *Root) WriteFile(p string, opts WriteOptions, src io.Reader) (Info, error) {
	return Info{}, errors.ErrUnsupported
}
