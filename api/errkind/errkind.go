// Package errkind defines the kinds of error of the dsec API, one sentinel
// per kind of the user-facing contract.
//
// They are shared by both ends: the server's errors wrap them (its
// internal/errdefs re-exports these values) and the Go SDK returns them
// (dsec.ErrNotFound is ErrNotFound), so code on either side classifies an
// error with errors.Is, never by its message. The table from kinds to API
// codes is the server's; the SDKs hold its inverse.
package errkind

import "errors"

// The kinds. Each is a sentinel: wrap it, never compare messages.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrUnavailable        = errors.New("unavailable")
	ErrInternal           = errors.New("internal error")
)

// All lists every kind, in the order of the contract. Callers must not
// modify it.
var All = []error{
	ErrInvalidArgument, ErrNotFound, ErrAlreadyExists, ErrFailedPrecondition,
	ErrResourceExhausted, ErrDeadlineExceeded, ErrUnauthenticated,
	ErrPermissionDenied, ErrUnavailable, ErrInternal,
}
