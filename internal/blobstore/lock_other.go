//go:build !unix

package blobstore

import (
	"errors"
	"io/fs"
	"os"
	"time"
)

// lockFile does nothing where there is no flock; New then goes by age.
func lockFile(*os.File) error { return nil }

// removeIfAbandoned removes the upload file p when it has not been
// written for a day.
func removeIfAbandoned(p string) error {
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if time.Since(fi.ModTime()) < 24*time.Hour {
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
