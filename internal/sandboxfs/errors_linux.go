package sandboxfs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// pathError is a failed operation on a sandbox path. Its message is written
// for users; it unwraps to its kind (when it has one) and to the errno that
// caused it (when there is one), so errors.Is works for both.
type pathError struct {
	kind  error // an errdefs kind, or nil for an internal error
	cause error // the errno or other cause, or nil
	msg   string
}

func (e *pathError) Error() string { return e.msg }

func (e *pathError) Unwrap() []error {
	var errs []error
	if e.kind != nil {
		errs = append(errs, e.kind)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

func newError(kind, cause error, format string, args ...any) error {
	return &pathError{kind: kind, cause: cause, msg: fmt.Sprintf(format, args...)}
}

// fsError turns err, met doing op ("read", "write", "stat") on the sandbox
// path p, into an error of the right kind with a message that says what to
// do.
func fsError(op, p string, err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s %s in the sandbox: %w", op, p, err)
	}
	switch errno {
	case unix.ENOENT:
		return newError(errdefs.ErrNotFound, errno, "no such file or directory: %s in the sandbox", p)
	case unix.ENOTDIR:
		return newError(errdefs.ErrNotFound, errno, "no such file or directory: %s in the sandbox (a parent is not a directory)", p)
	case unix.EACCES, unix.EPERM:
		return newError(errdefs.ErrPermissionDenied, errno, "permission denied: %s in the sandbox", p)
	case unix.ELOOP:
		return newError(errdefs.ErrPermissionDenied, errno,
			"%s %s in the sandbox: the path goes through a symbolic link that is not followed "+
				"(a link into /proc such as /proc/self/root, or more than 40 links in a row); "+
				"use the resolved path, or exec a command in the sandbox", op, p)
	case unix.ENAMETOOLONG:
		return newError(errdefs.ErrInvalidArgument, errno, "file name too long: %s in the sandbox (names are at most 255 bytes)", p)
	case unix.EISDIR:
		return newError(errdefs.ErrInvalidArgument, errno, "%s in the sandbox is a directory; use `dsec cp` for directories", p)
	case unix.ENOSPC, unix.EDQUOT:
		return newError(errdefs.ErrResourceExhausted, errno, "%s %s in the sandbox: no space left on the sandbox's disk; delete files in it or give it a larger disk", op, p)
	case unix.EROFS:
		return newError(errdefs.ErrFailedPrecondition, errno, "%s %s in the sandbox: it is on a read-only file system", op, p)
	case unix.EBUSY:
		return newError(errdefs.ErrFailedPrecondition, errno, "%s %s in the sandbox: it is busy (a mount point?)", op, p)
	case unix.ENOTEMPTY:
		return newError(errdefs.ErrFailedPrecondition, errno, "%s %s in the sandbox: the directory is not empty", op, p)
	case unix.EXDEV:
		return newError(errdefs.ErrFailedPrecondition, errno, "%s %s in the sandbox: it would cross from one mount to another; copy instead", op, p)
	case unix.EEXIST:
		return newError(errdefs.ErrAlreadyExists, errno, "%s already exists in the sandbox", p)
	case unix.EAGAIN:
		return newError(errdefs.ErrUnavailable, errno,
			"%s %s in the sandbox: it kept changing while being opened, or a process in the sandbox holds a lease on it; try again", op, p)
	case unix.ENOSYS:
		return newError(errdefs.ErrFailedPrecondition, errno, "%s %s in the sandbox: the host kernel lacks openat2 (Linux 5.6 or later is needed)", op, p)
	}
	return newError(nil, errno, "%s %s in the sandbox: %v", op, p, errno)
}

// ignoringEINTR calls fn until it returns something other than EINTR.
func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}

// ignoringEINTR2 is ignoringEINTR for calls that return a value.
func ignoringEINTR2[T any](fn func() (T, error)) (T, error) {
	for {
		v, err := fn()
		if err != unix.EINTR {
			return v, err
		}
	}
}
