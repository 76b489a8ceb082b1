//go:build unix

package blobstore

import (
	"errors"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// lockFile takes the lock that marks an upload as alive.
func lockFile(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// staleAfter protects the moment between the creation of an upload's
// file and its lock.
const staleAfter = time.Minute

// removeIfAbandoned removes the upload file p unless its lock is held or
// it is very new.
func removeIfAbandoned(p string) error {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if time.Since(fi.ModTime()) < staleAfter {
		return nil
	}
	if err := lockFile(f); errors.Is(err, unix.EWOULDBLOCK) {
		return nil // a Put is writing it
	} else if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
