package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// tempFile is where a download is written before it replaces its
// destination. On Linux it is an O_TMPFILE file: it has no name until
// commit, so a copy that ends in any way, a SIGKILL included, leaves
// nothing; where the file system has no O_TMPFILE it is a .dsec-cp-* file
// that discard removes.
type tempFile struct {
	f    *os.File
	dir  string
	name string // the named file's path; "" for an O_TMPFILE file
	done bool
}

func newTempFile(dir string) (*tempFile, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil {
		return &tempFile{f: os.NewFile(uintptr(fd), filepath.Join(dir, ".dsec-cp-(unnamed)")), dir: dir}, nil
	}
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EROFS) {
		return nil, &os.PathError{Op: "create a file in", Path: dir, Err: err}
	}
	// EOPNOTSUPP, EISDIR (an old kernel), EINVAL: a named file.
	f, err := os.CreateTemp(dir, ".dsec-cp-*")
	if err != nil {
		return nil, err
	}
	return &tempFile{f: f, dir: dir, name: f.Name()}, nil
}

// commit gives the file the name dst, replacing what is there.
func (t *tempFile) commit(dst string) error {
	if err := t.f.Sync(); err != nil {
		return err
	}
	if t.name == "" {
		// Link the unnamed file in under a temporary name, then rename it
		// over dst: only between the two does a name exist.
		var b [8]byte
		rand.Read(b[:])
		name := filepath.Join(t.dir, ".dsec-cp-"+hex.EncodeToString(b[:]))
		err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(t.f.Fd())), unix.AT_FDCWD, name, unix.AT_SYMLINK_FOLLOW)
		if err != nil {
			// No /proc: AT_EMPTY_PATH, which needs CAP_DAC_READ_SEARCH.
			err = unix.Linkat(int(t.f.Fd()), "", unix.AT_FDCWD, name, unix.AT_EMPTY_PATH)
		}
		if err != nil {
			return &os.LinkError{Op: "link", Old: t.f.Name(), New: name, Err: err}
		}
		t.name = name
	}
	if err := t.f.Close(); err != nil {
		return err
	}
	if err := os.Rename(t.name, dst); err != nil {
		return err
	}
	t.done = true
	return nil
}

// discard removes the file unless it was committed. It is idempotent.
func (t *tempFile) discard() {
	t.f.Close()
	if !t.done && t.name != "" {
		os.Remove(t.name)
	}
	t.done = true
}
