package apierr

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"sort"
	"strings"
	"unicode/utf8"

	"connectrpc.com/connect"
)

// reply is what the API sends for an error, before it has an id.
type reply struct {
	err  error        // what the call failed with
	code connect.Code // the code sent
	// pass is a connect error that goes on as it is (clipped).
	pass *connect.Error
	// msg is the public message; internal means it is withheld whole.
	msg      string
	internal bool
	// withheld: the message leaves out text that only the log has (all
	// of it when internal, or host paths), so it names an id.
	withheld bool
	// remote: another dsec server converted (and logged) it already.
	remote bool
	// detail is the text of WithDetail's detail, for the log only.
	detail string
}

// classify applies the rule of the package comment to err.
func classify(err error) reply {
	var ce *connect.Error
	if errors.As(err, &ce) {
		wire := connect.IsWireError(ce)
		if wire || !internalCode(ce.Code()) {
			return reply{err: err, code: ce.Code(), pass: ce, remote: wire}
		}
		// A connect error made on this side (a response that could not be
		// decoded, a protocol fault): nothing the caller can act on.
		return reply{err: err, code: connect.CodeInternal, internal: true, withheld: true}
	}
	r := reply{err: err, code: Code(err)}
	if errors.Is(err, context.Canceled) {
		r.code = connect.CodeCanceled
	}
	var re *remoteError
	if errors.As(err, &re) {
		r.msg, r.remote = err.Error(), true
		return r
	}
	if r.code == connect.CodeInternal {
		r.internal, r.withheld = true, true
		return r
	}
	r.msg, r.withheld = cutHostPaths(err.Error(), err)
	var de *detailError
	if errors.As(err, &de) {
		r.detail, r.withheld = de.detail.Error(), true
	}
	return r
}

// WithDetail returns err, whose message is written for users, with detail
// for the log only: users see err's message and an id, under which the
// Reporter logs detail beside it. detail is not in err's chain, so its
// kind and types do not count: use it for what helps an operator and no
// user (a transport error naming a socket, a runtime's output).
func WithDetail(err, detail error) error {
	if err == nil || detail == nil {
		return err
	}
	return &detailError{err: err, detail: detail}
}

type detailError struct{ err, detail error }

func (e *detailError) Error() string { return e.err.Error() }
func (e *detailError) Unwrap() error { return e.err }

// internalCode reports whether a connect error of code c made on this side
// is a fault of the platform rather than of the transport or the call.
func internalCode(c connect.Code) bool {
	return c == connect.CodeInternal || c == connect.CodeUnknown || c == connect.CodeDataLoss
}

// build returns the connect error for r, naming id when it withholds text.
// where names the server for the user ("node n1", "the API server").
func (r reply) build(id string, c Call, where string) *connect.Error {
	if r.pass != nil {
		if len(r.pass.Message()) <= MaxMessageBytes {
			return r.pass
		}
		clipped := connect.NewError(r.pass.Code(), errors.New(Clip(r.pass.Message())))
		for _, d := range r.pass.Details() {
			clipped.AddDetail(d)
		}
		return clipped
	}
	var msg string
	switch {
	case r.internal:
		what := "the call"
		if c.Procedure != "" {
			what = path.Base(c.Procedure)
		}
		msg = fmt.Sprintf("internal error (id %s): %s failed on %s; retry, and if it fails again, %s's log has the details under this id",
			id, what, where, where)
	case r.withheld:
		suffix := fmt.Sprintf(" (host paths left out: %s's log has them under id %s)", where, id)
		if r.detail != "" {
			suffix = fmt.Sprintf(" (%s's log has the details under id %s)", where, id)
		}
		msg = clip(r.msg, MaxMessageBytes-len(suffix)) + suffix
	default:
		msg = Clip(r.msg)
	}
	ce := connect.NewError(r.code, errors.New(msg))
	retryDetail(ce, r.err)
	return ce
}

// clip is Clip to n bytes.
func clip(msg string, n int) string {
	if len(msg) <= n {
		return msg
	}
	const mark = " … (message cut)"
	n -= len(mark)
	for n > 0 && !utf8.RuneStart(msg[n]) {
		n--
	}
	return msg[:max(n, 0)] + mark
}

// cutHostPaths replaces in msg the host paths that err's tree declares by
// type, and reports whether it replaced any.
func cutHostPaths(msg string, err error) (string, bool) {
	paths := hostPaths(err, nil)
	// Longest first, so that a path is not cut inside a longer one.
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	cut := false
	for _, p := range paths {
		if strings.Contains(msg, p) {
			msg = strings.ReplaceAll(msg, p, "…")
			cut = true
		}
	}
	return msg, cut
}

// hostPaths appends to out the host paths and URLs in err's tree: absolute
// paths of path and link errors (an fs.FS path, relative, names no host
// file) and the URLs of HTTP errors.
func hostPaths(err error, out []string) []string {
	abs := func(p string) bool { return len(p) > 1 && p[0] == '/' }
	switch e := err.(type) {
	case *fs.PathError:
		if abs(e.Path) {
			out = append(out, e.Path)
		}
	case *os.LinkError:
		for _, p := range []string{e.Old, e.New} {
			if abs(p) {
				out = append(out, p)
			}
		}
	case *url.Error:
		if e.URL != "" {
			out = append(out, e.URL)
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		if next := u.Unwrap(); next != nil {
			out = hostPaths(next, out)
		}
	case interface{ Unwrap() []error }:
		for _, next := range u.Unwrap() {
			if next != nil {
				out = hostPaths(next, out)
			}
		}
	}
	return out
}

// newID returns a fresh error id: 16 hex digits.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
