package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// writeFileAtomic writes data to path with mode perm so that readers see the
// old file or the whole new one, never a part.
func writeFileAtomic(path string, data []byte, perm fs.FileMode) error {
	return installFile(path, data, perm, os.Rename)
}

// createFileAtomic is writeFileAtomic that fails with an error matching
// fs.ErrExist, and leaves the file alone, when path already exists.
func createFileAtomic(path string, data []byte, perm fs.FileMode) error {
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
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
