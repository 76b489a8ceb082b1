// Package atomicfile writes files so that readers, and a crash, see the old
// file or the whole new one, never a part.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile writes data to path with mode perm so that readers see the
// old file or the whole new one, never a part.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return installFile(path, data, perm, os.Rename)
}

// Create is WriteFile that fails with an error matching
// fs.ErrExist, and leaves the file alone, when path already exists.
func Create(path string, data []byte, perm fs.FileMode) error {
	return installFile(path, data, perm, os.Link)
}

// installFile writes data to a temporary file beside path, syncs it, puts it
// in place with install (rename or link), and syncs the directory.
func installFile(path string, data []byte, perm fs.FileMode, install func(oldpath, newpath string) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a rename there is nothing left to remove
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := install(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("write %s: %w", path, fs.ErrExist)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return SyncDir(dir)
}

// SyncDir makes the entries of dir durable (a file system that cannot sync
// a directory is no error).
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
