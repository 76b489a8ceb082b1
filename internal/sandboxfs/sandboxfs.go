// Package sandboxfs reads and writes files in a running sandbox from outside
// it, as host root, through the sandbox's own view of its file system.
//
// A Root is a directory file descriptor for the sandbox's root as the
// sandbox sees it, normally opened from /proc/<init pid>/root, which follows
// the sandbox's mount namespace. Every path is resolved relative to that
// descriptor with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS).
//
// Invariants, which hold however hostile the sandbox's contents are:
//   - Resolution never leaves the root: "..", absolute symlinks and relative
//     symlinks that climb are all clamped to the root, and procfs magic links
//     (/proc/<pid>/root, /proc/self/cwd, /proc/<pid>/fd/N) are never followed.
//   - A file is opened for reading only after an O_PATH descriptor showed it
//     to be a regular file on a file system that holds data (overlayfs,
//     tmpfs, ext2/3/4, xfs, btrfs, erofs, squashfs, FUSE and virtiofs, 9p):
//     fifos, sockets and devices are never opened, and procfs, sysfs and the
//     other kernel file systems are never read or written. Mounts inside the
//     sandbox are crossed; the check applies to where a path ends up.
//   - A write creates a fresh file with a random name in the resolved parent
//     directory (O_CREAT|O_EXCL|O_NOFOLLOW), and renames it over the target:
//     a symlink at the target is replaced, never followed. On every error the
//     temporary file is removed.
//   - Trees are walked from descriptor to descriptor (openat with
//     O_NOFOLLOW under the resolved start), never by path: WriteTar and
//     Remove never follow a symlink inside the tree. WriteTar leaves out
//     what is on a kernel file system; Remove refuses, before removing
//     anything, a tree with a mount point anywhere in it.
//   - An uploaded archive is spooled and checked whole (ValidateTar) before
//     anything is written: no absolute or ".." names, no devices, no entry
//     under the archive's own symlinks, no symlink that leads out of the
//     destination. Its owners are ignored; setuid and setgid are dropped.
//     Each entry is then created like a WriteFile: parents resolved from
//     the root, a temporary name renamed over the target.
//
// Paths given to this package are sandbox paths: absolute, or relative to
// the sandbox's "/" (Clean). Owners are host ids; mapping them to and from
// the ids the sandbox sees is the caller's job.
package sandboxfs

import (
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// MaxPathLen is the longest sandbox path, in bytes, that Clean accepts.
const MaxPathLen = 4096

// Info describes a file in a sandbox. Owners are host ids.
type Info struct {
	// Path is the cleaned absolute path in the sandbox, as asked for (before
	// symlinks are resolved).
	Path string
	// Name is the last element of Path ("/" for the root): the entry's name
	// in its directory, for ReadDir.
	Name string
	Size int64
	// Mode holds the type and permission bits, with setuid, setgid and
	// sticky as fs.ModeSetuid, fs.ModeSetgid and fs.ModeSticky.
	Mode    fs.FileMode
	ModTime time.Time
	UID     uint32
	GID     uint32
	Ino     uint64
	Dev     uint64
	// LinkTarget is a symlink's target as stored, read without following
	// it, in the Info of ReadDir and Lstat; empty otherwise.
	LinkTarget string
}

// WriteOptions say how (*Root).WriteFile creates a file. The zero value
// writes a 0644 file owned by host root, with no size limit, into an
// existing directory.
type WriteOptions struct {
	// Mode is the file's permission bits, applied exactly (the umask does
	// not apply); zero means 0644. Setuid, setgid and sticky are set only
	// when asked for, either as fs.ModeSetuid, fs.ModeSetgid, fs.ModeSticky
	// or as the Unix bits 04000, 02000, 01000. Type bits are refused.
	Mode fs.FileMode
	// MakeParents creates missing parent directories, one at a time, each
	// 0755 and owned by UID and GID.
	MakeParents bool
	// UID and GID are the HOST ids that own the file (and any directory
	// MakeParents creates). Negative ids are refused.
	UID, GID int
	// MaxBytes is the most data WriteFile accepts; 0 means no limit. More is
	// an InvalidArgument error and leaves nothing behind.
	MaxBytes int64
}

// Clean validates a sandbox path and returns it relative to the sandbox's
// root, in the form openat2 takes: "." for the root itself, otherwise a
// lexically cleaned path with no leading "/", no "." or ".." elements and no
// empty elements. A path is absolute or relative to the sandbox's "/"; ".."
// above "/" stays at "/". An empty path, a path with a NUL byte and a path
// longer than MaxPathLen bytes are InvalidArgument.
func Clean(p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "the path is empty; give an absolute path in the sandbox")
	case len(p) > MaxPathLen:
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "the path is %d bytes long; paths in the sandbox are at most %d bytes", len(p), MaxPathLen)
	case strings.IndexByte(p, 0) >= 0:
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "the path %q contains a NUL byte", p)
	}
	c := path.Clean("/" + p)
	if c == "/" {
		return ".", nil
	}
	return c[1:], nil
}

// display returns the absolute sandbox path for a Clean result, for messages
// and Info.Path.
func display(rel string) string {
	if rel == "." {
		return "/"
	}
	return "/" + rel
}
