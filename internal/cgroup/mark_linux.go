package cgroup

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// markPrefix names the extended attributes of marks: trusted.*, which
// only a process with CAP_SYS_ADMIN of the host may read or write (no
// process in a sandbox).
const markPrefix = "trusted.dsec."

// SetMark sets (on) or clears a named mark of the group: an extended
// attribute of its directory (in cgroup2's hierarchy when there is one),
// which lives in the kernel exactly as long as the group does. Setting it
// writes nothing to disk, so it never waits on a file system's journal
// (a file made in the state dir took up to 27 ms under swap writes). A
// mark is a name of [a-z0-9_-].
func (m *Manager) SetMark(name, mark string, on bool) error {
	dir, attr, err := m.markPath(name, mark)
	if err != nil {
		return err
	}
	if on {
		err = m.fs.Setxattr(dir, attr, []byte("1"))
	} else if err = m.fs.Removexattr(dir, attr); errors.Is(err, unix.ENODATA) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("cgroup %s: mark %s: %w", name, mark, classify(err))
	}
	return nil
}

// HasMark reports whether the group has the mark.
func (m *Manager) HasMark(name, mark string) (bool, error) {
	dir, attr, err := m.markPath(name, mark)
	if err != nil {
		return false, err
	}
	_, err = m.fs.Getxattr(dir, attr)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENODATA):
		return false, nil
	}
	return false, fmt.Errorf("cgroup %s: mark %s: %w", name, mark, classify(err))
}

// markPath is the directory and attribute name of a group's mark.
func (m *Manager) markPath(name, mark string) (dir, attr string, err error) {
	if err := checkName(name); err != nil {
		return "", "", err
	}
	if mark == "" || strings.Trim(mark, "abcdefghijklmnopqrstuvwxyz0123456789_-") != "" {
		return "", "", errdefs.Newf(errdefs.ErrInvalidArgument, "cgroup mark %q: use [a-z0-9_-]", mark)
	}
	if !m.exists(name) {
		return "", "", notFound(name)
	}
	return m.dirs(name)[0], markPrefix + mark, nil
}
