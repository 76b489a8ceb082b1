// Package apierr holds the one table that maps error kinds (internal/errdefs)
// to API status codes, and converts errors at the API boundary in both
// directions. Handlers return errors wrapped with kinds; only this package
// turns them into connect errors, and its Reporter logs each one.
//
// # What users see
//
// A message of a user-facing kind (every kind but Internal: InvalidArgument,
// NotFound, ResourceExhausted, FailedPrecondition, …) reaches the user as
// written. Such messages are written to be shown (errdefs.Newf, or a kind
// wrapped with context): they say what happened and what to do, and name
// only what the caller knows or chose (sandbox IDs, paths inside the
// sandbox, images, nodes, flags). They never carry a host path, a host PID,
// runtime output or the text of an OS error; that detail goes to the log,
// where the error is handled.
//
// An Internal error, and any error that wraps no kind (a wrapped OS error,
// runtime stderr, an etcd error), is a fault of the platform that the caller
// cannot act on. Its text is withheld: the user gets
//
//	internal error (id 7f3a9c01b2d4e5f6): Create failed on node n1; retry, and if it fails again, node n1's log has the details under this id
//
// and the Reporter logs the full text once, with the same id, the procedure,
// the caller's project and key ID, and the sandbox the call named.
//
// A backstop for user-facing kinds: host paths an error declares by its type
// (the absolute paths of a *fs.PathError or *os.LinkError, the URL of a
// *url.Error) wrapped with %w are cut from the message, which then names an
// id under which the log has them. Text flattened with %v or %s cannot be
// seen here; keep OS errors out of user-facing messages, or wrap them with
// %w.
//
// An error that another dsec server sent (FromConnect: an edge's reply to
// the API server) was converted and logged there; its message is already
// public and passes on as it is, logged here only at Debug.
//
// # Logging
//
// Each failed call is logged once, by the server that converts it first:
// Internal at Error, Unavailable at Warn, the client's errors (every other
// kind, cancellations, deadlines) at Debug, and any error whose text was
// withheld at least at Info, so that the id a user reports is in the log.
// Identical errors of one caller and procedure are logged once per
// RepeatWindow; the next entry after a window counts the ones left out, and
// a user whose error was left out gets the id of the entry that was logged.
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

// MaxMessageBytes bounds the message of an error on the wire. Messages
// quote request values only in short prefixes (%.80q); this is the backstop
// that keeps an error from ever echoing a request body whole.
const MaxMessageBytes = 1024

// Clip returns msg cut to at most MaxMessageBytes bytes, at a character
// boundary, marked as cut.
func Clip(msg string) string { return clip(msg, MaxMessageBytes) }

// ToConnect converts an error for the wire by the rule of the package
// comment, without logging it: the text it withholds is lost, and the id
// it names is in no log. Servers convert with a Reporter, which logs; this
// is for tests and for errors whose text is public.
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	r := classify(err)
	id := ""
	if r.withheld {
		id = newID()
	}
	return r.build(id, Call{}, "the server")
}

// FromConnect converts an error received from another dsec component back
// into a kind-wrapped error, keeping the message and the retry hint. An
// error the other server sent (not one of the transport) is marked as
// converted already: ToConnect and Reporters pass its message on as it is.
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
	if connect.IsWireError(ce) {
		out = &remoteError{err: out}
	}
	return out
}

// remoteError is an error another dsec server sent, its message public.
type remoteError struct{ err error }

func (e *remoteError) Error() string { return e.err.Error() }
func (e *remoteError) Unwrap() error { return e.err }

// RetryDelay is a convenience for tests and clients.
func RetryDelay(err error) time.Duration {
	d, _ := errdefs.RetryHint(FromConnect(err))
	return d
}

// retryDetail adds err's retry hint, if any, to ce.
func retryDetail(ce *connect.Error, err error) {
	if d, ok := errdefs.RetryHint(err); ok {
		if detail, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)}); derr == nil {
			ce.AddDetail(detail)
		}
	}
}

// Public returns what users may be shown of err outside a call's reply (a
// sandbox's failure reason, an event), by the rule of the package comment,
// and false when that is nothing: an internal error's text is the log's,
// which the Reporter of the call that returns err writes.
func Public(err error) (string, bool) {
	r := classify(err)
	switch {
	case r.internal:
		return "", false
	case r.pass != nil:
		return Clip(r.pass.Message()), true
	}
	return Clip(r.msg), true
}
