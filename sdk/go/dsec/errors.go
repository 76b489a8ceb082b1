package dsec

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/dsecproject/dsec/api/errkind"
)

// The error kinds of CONTRACT.md. Every error this package returns for a
// failed call wraps exactly one of them (or is context.Canceled); classify
// with errors.Is, never by message. They are the API module's kinds
// (github.com/dsecproject/dsec/api/errkind), the same values the dsec server
// components use, so code that mixes both can compare freely.
var (
	ErrInvalidArgument    = errkind.ErrInvalidArgument
	ErrNotFound           = errkind.ErrNotFound
	ErrAlreadyExists      = errkind.ErrAlreadyExists
	ErrFailedPrecondition = errkind.ErrFailedPrecondition
	// ErrResourceExhausted: the platform is full or a quota is reached; the
	// Error usually carries a RetryAfter hint.
	ErrResourceExhausted = errkind.ErrResourceExhausted
	ErrDeadlineExceeded  = errkind.ErrDeadlineExceeded
	ErrUnauthenticated   = errkind.ErrUnauthenticated
	ErrPermissionDenied  = errkind.ErrPermissionDenied
	// ErrUnavailable: the server could not be reached or dropped the call;
	// the call may be retried (creates with an idempotency key).
	ErrUnavailable = errkind.ErrUnavailable
	ErrInternal    = errkind.ErrInternal
)

// Error is the error of a failed call: its kind, the message for people
// (it says what to do), and how long to wait before retrying when the server
// gave a hint.
type Error struct {
	// Kind is one of the Err* sentinels.
	Kind error
	// Message is the server's (or this package's) explanation.
	Message string
	// RetryAfter is the server's retry hint; zero when there is none.
	RetryAfter time.Duration
}

// Error returns the message, followed by the retry hint if there is one.
func (e *Error) Error() string {
	msg := e.Message
	if msg == "" && e.Kind != nil {
		msg = e.Kind.Error()
	}
	if e.RetryAfter > 0 {
		msg = fmt.Sprintf("%s (retry after %s)", msg, e.RetryAfter)
	}
	return msg
}

// Unwrap returns the kind, so errors.Is(err, ErrNotFound) works.
func (e *Error) Unwrap() error { return e.Kind }

// Is reports that a DeadlineExceeded error also is context.DeadlineExceeded,
// whichever side's deadline ran out.
func (e *Error) Is(target error) bool {
	return target == context.DeadlineExceeded && e.Kind == ErrDeadlineExceeded
}

func newError(kind error, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// codes is the one table from API codes to kinds: the inverse of the
// server's (its internal/apierr; a test of the server's module checks that
// the two agree). Codes not listed here map to ErrInternal,
// except Canceled (context.Canceled) and Aborted (ErrFailedPrecondition),
// which the server never sends for a kind but proxies and runtimes might.
var codes = map[connect.Code]error{
	connect.CodeInvalidArgument:    ErrInvalidArgument,
	connect.CodeNotFound:           ErrNotFound,
	connect.CodeAlreadyExists:      ErrAlreadyExists,
	connect.CodeFailedPrecondition: ErrFailedPrecondition,
	connect.CodeAborted:            ErrFailedPrecondition,
	connect.CodeResourceExhausted:  ErrResourceExhausted,
	connect.CodeDeadlineExceeded:   ErrDeadlineExceeded,
	connect.CodeUnauthenticated:    ErrUnauthenticated,
	connect.CodePermissionDenied:   ErrPermissionDenied,
	connect.CodeUnavailable:        ErrUnavailable,
	connect.CodeInternal:           ErrInternal,
	connect.CodeUnknown:            ErrInternal,
	connect.CodeDataLoss:           ErrInternal,
	connect.CodeUnimplemented:      ErrInternal,
	connect.CodeOutOfRange:         ErrInvalidArgument,
}

// kindOf returns the kind for an API code.
func kindOf(c connect.Code) error {
	if k, ok := codes[c]; ok {
		return k
	}
	return ErrInternal
}

// convertError turns an error from the connect client into an *Error (or
// context.Canceled). addr names the server in messages about reaching it.
// Errors that are not connect errors are returned unchanged.
func convertError(err error, addr string) error {
	if err == nil {
		return nil
	}
	var de *Error
	if errors.As(err, &de) {
		return err
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		if errors.Is(err, context.Canceled) {
			return context.Canceled
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return &Error{Kind: ErrDeadlineExceeded, Message: "deadline exceeded: " + err.Error()}
		}
		return err
	}
	if ce.Code() == connect.CodeCanceled {
		return context.Canceled
	}
	out := &Error{Kind: kindOf(ce.Code()), Message: ce.Message()}
	if out.Message == "" {
		out.Message = out.Kind.Error()
	}
	if !connect.IsWireError(ce) {
		// The call never got an answer from the server.
		switch ce.Code() {
		case connect.CodeUnavailable:
			out.Message = fmt.Sprintf("cannot reach the dsec API at %s: %s (is the server running? `dsec up` starts one; DSEC_ADDR selects another)", addr, ce.Message())
		case connect.CodeDeadlineExceeded:
			out.Message = "deadline exceeded: " + ce.Message()
		}
	}
	switch ce.Code() {
	case connect.CodeUnknown, connect.CodeDataLoss, connect.CodeUnimplemented:
		// Keep what the code said: a proxy or an older server answered.
		out.Message = fmt.Sprintf("%s (%s)", out.Message, ce.Code())
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if ri, ok := v.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			if delay := ri.GetRetryDelay().AsDuration(); delay > 0 {
				out.RetryAfter = delay
			}
		}
	}
	return out
}
