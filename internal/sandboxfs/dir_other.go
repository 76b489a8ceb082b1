//go:build !linux

package sandboxfs

import (
	"errors"
	"io/fs"
)

// ReadDir returns errors.ErrUnsupported.
func (r *Root) ReadDir(p string, limit int) ([]Info, bool, error) {
	return nil, false, errors.ErrUnsupported
}

// Mkdir returns errors.ErrUnsupported.
func (r *Root) Mkdir(p string, mode fs.FileMode, parents bool, uid, gid int) (Info, error) {
	return Info{}, errors.ErrUnsupported
}

// Remove returns errors.ErrUnsupported.
func (r *Root) Remove(p string, recursive bool) error { return errors.ErrUnsupported }

// Rename returns errors.ErrUnsupported.
func (r *Root) Rename(from, to string, overwrite bool) error { return errors.ErrUnsupported }
