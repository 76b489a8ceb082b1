// Package apierr holds the one table that maps error kinds (internal/errdefs)
// to API status codes, and converts errors at the API boundary in both
// directions. Handlers return errors wrapped with kinds; only this package
// turns them into connect errors.
package apierr

import (
	"context"
	"errors"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// table maps every kind to its code. The SDKs hold the inverse.
var table = []struct {
	kind error
	code connect.Code
}{
	{errdefs.ErrInvalidArgument, connect.CodeInvalidArgument},
	{errdefs.ErrNotFound, connect.CodeNotFound},
	{errdefs.ErrAlreadyExists, connect.CodeAlreadyExists},
	{errdefs.ErrFailedPrecondition, connect.CodeFailedPrecondition},
	{errdefs.ErrResourceExhausted, connect.CodeResourceExhausted},
	{errdefs.ErrDeadlineExceeded, connect.CodeDeadlineExceeded},
	{errdefs.ErrUnauthenticated, connect.CodeUnauthenticated},
	{errdefs.ErrPermissionDenied, connect.CodePermissionDenied},
	{errdefs.ErrUnavailable, connect.CodeUnavailable},
	{errdefs.ErrInternal, connect.CodeInternal},
}

// Code returns the API code for an error's kind.
func Code(err error) connect.Code {
	k := errdefs.Kind(err)
	for _, e := range table {
		if e.kind == k {
			return e.code
		}
	}
	return connect.CodeInternal
}

// KindOf returns the kind for an API code; unknown codes are Internal.
func KindOf(c connect.Code) error {
	for _, e := range table {
		if e.code == c {
			return e.kind
		}
	}
	switch c {
	case connect.CodeCanceled:
		return context.Canceled
	case connect.CodeAborted:
		return errdefs.ErrFailedPrecondition
	}
	return errdefs.ErrInternal
}

// MaxMessageBytes bounds the message of an error on the wire. Messages
// quote request values only in short prefixes (%.80q); this is the backstop
// that keeps an error from ever echoing a request body whole.
const MaxMessageBytes = 1024

// Clip returns msg cut to at most MaxMessageBytes bytes, at a character
// boundary, marked as cut.
func Clip(msg string) string {
	if len(msg) <= MaxMessageBytes {
		return msg
	}
	const mark = " … (message cut)"
	n := MaxMessageBytes - len(mark)
	for n > 0 && !utf8.RuneStart(msg[n]) {
		n--
	}
	return msg[:n] + mark
}

// ToConnect converts an error for the wire, its message clipped to
// MaxMessageBytes. Errors that already are connect errors pass through.
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		if len(ce.Message()) <= MaxMessageBytes {
			return ce
		}
		clipped := connect.NewError(ce.Code(), errors.New(Clip(ce.Message())))
		for _, d := range ce.Details() {
			clipped.AddDetail(d)
		}
		return clipped
	}
	if errors.Is(err, context.Canceled) {
		return connect.NewError(connect.CodeCanceled, err)
	}
	cerr := connect.NewError(Code(err), errors.New(Clip(err.Error())))
	if d, ok := errdefs.RetryHint(err); ok {
		if detail, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)}); derr == nil {
			cerr.AddDetail(detail)
		}
	}
	return cerr
}

// FromConnect converts an error received from another dsec component back
// into a kind-wrapped error, keeping the message and the retry hint.
func FromConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	if ce.Code() == connect.CodeCanceled {
		return context.Canceled
	}
	out := errdefs.Newf(KindOf(ce.Code()), "%s", ce.Message())
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if ri, ok := v.(*errdetails.RetryInfo); ok && ri.RetryDelay != nil {
			out = errdefs.RetryAfter(out, ri.RetryDelay.AsDuration())
		}
	}
	return out
}

// RetryDelay is a convenience for tests and clients.
func RetryDelay(err error) time.Duration {
	d, _ := errdefs.RetryHint(FromConnect(err))
	return d
}
