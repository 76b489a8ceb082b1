//go:build !linux

package main

import "os"

// tempFile is where a download is written before it replaces its
// destination: a .dsec-cp-* file that discard removes.
type tempFile struct {
	f    *os.File
	done bool
}

func newTempFile(dir string) (*tempFile, error) {
	f, err := os.CreateTemp(dir, ".dsec-cp-*")
	if err != nil {
		return nil, err
	}
	return &tempFile{f: f}, nil
}

// commit gives the file the name dst, replacing what is there.
func (t *tempFile) commit(dst string) error {
	if err := t.f.Close(); err != nil {
		return err
	}
	if err := os.Rename(t.f.Name(), dst); err != nil {
		return err
	}
	t.done = true
	return nil
}

// discard removes the file unless it was committed. It is idempotent.
func (t *tempFile) discard() {
	t.f.Close()
	if !t.done {
		os.Remove(t.f.Name())
	}
	t.done = true
}
