// Package errdefs defines the kinds of error every dsec component returns:
// the API's kinds (github.com/dsecproject/dsec/api/errkind, shared with the
// Go SDK) and the server's helpers around them.
//
// Errors are wrapped with context by the code that meets them
// (fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)) and classified with
// errors.Is. Exactly one table, in internal/apierr, maps kinds to API codes;
// the SDKs hold its inverse. Messages are written for users: they say what
// happened and what to do.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dsecproject/dsec/api/errkind"
)

// The kinds: the API module's sentinels (errkind), so that the server's
// errors and the Go SDK's are the same values. Each is a sentinel; wrap it,
// never compare messages.
var (
	ErrInvalidArgument    = errkind.ErrInvalidArgument
	ErrNotFound           = errkind.ErrNotFound
	ErrAlreadyExists      = errkind.ErrAlreadyExists
	ErrFailedPrecondition = errkind.ErrFailedPrecondition
	ErrResourceExhausted  = errkind.ErrResourceExhausted
	ErrDeadlineExceeded   = errkind.ErrDeadlineExceeded
	ErrUnauthenticated    = errkind.ErrUnauthenticated
	ErrPermissionDenied   = errkind.ErrPermissionDenied
	ErrUnavailable        = errkind.ErrUnavailable
	ErrInternal           = errkind.ErrInternal
)

// Kinds lists every kind, in the order of CONTRACT.md.
var Kinds = errkind.All

// Kind returns the kind err wraps, or ErrInternal when it wraps none.
// A context deadline counts as ErrDeadlineExceeded.
func Kind(err error) error {
	if err == nil {
		return nil
	}
	for _, k := range Kinds {
		if errors.Is(err, k) {
			return k
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ErrDeadlineExceeded
	}
	return ErrInternal
}

// Is reports whether err is of kind k. It is errors.Is with the deadline rule
// of Kind applied.
func Is(err, k error) bool { return err != nil && Kind(err) == k }

// Newf returns an error of kind k with a formatted message. The message is
// what users see; the kind is not repeated in it.
func Newf(k error, format string, args ...any) error {
	return &kindError{kind: k, msg: fmt.Sprintf(format, args...)}
}

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// RetryAfter wraps err (normally ResourceExhausted or Unavailable) with a
// hint of how long the caller should wait before retrying.
func RetryAfter(err error, d time.Duration) error {
	return &retryError{err: err, after: d}
}

type retryError struct {
	err   error
	after time.Duration
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// RetryHint returns the retry hint carried by err, if any.
func RetryHint(err error) (time.Duration, bool) {
	var r *retryError
	if errors.As(err, &r) {
		return r.after, true
	}
	return 0, false
}
