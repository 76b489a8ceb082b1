// Package apierr holds the one table that maps error kinds (internal/errdefs)
// to API status codes, and converts errors at the API boundary in both
// directions. Handlers return errors wrapped with kinds; only this package
// turns them into connect errors.
package apierr

import (
	"context"
	"errors"
	"time"

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

// ToConnect converts an error for the wire. Internal errors keep their
// message for logs only: users see a generic text unless keepInternal.
// Errors that already are connect errors pass through.
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	if errors.Is(err, context.Canceled) {
		return connect.NewError(connect.CodeCanceled, err)
	}
	cerr := connect.NewError(Code(err), errors.New(err.Error()))
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
