// Package reqlimit bounds what a client may send to dsec's HTTP servers, so
// that no request makes a server read, parse or echo more than it needs.
//
// Three bounds apply, from the largest:
//   - MaxBytes (dsec up --max-request-size, default 64 MiB) caps the body of
//     every request that is not a client stream, and every message of a
//     stream (Connect's ReadMaxBytes), compressed or not.
//   - Unary and server-streaming calls that only name things and set
//     options (every one but Exec and WriteStdin, which carry stdin) are held to
//     SmallBytes (1 MiB), or MaxBytes if that is smaller: a Create request
//     that is larger is not a Create request.
//   - Client streams (file, tar and layer uploads) have no cap on their body
//     here: their handlers bound the total they accept.
//
// A body whose declared length is over its bound is refused before a byte
// of it is read, with ResourceExhausted in the protocol of the request
// (Connect, gRPC or gRPC-Web); one without a declared length is cut at the
// bound, with the same error. Other handlers (/healthz, /metrics) get
// http.MaxBytesReader and 413.
package reqlimit

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	adminv1 "github.com/dsecproject/dsec/api/dsec/admin/v1"
	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
	nodev1 "github.com/dsecproject/dsec/api/dsec/node/v1"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// DefaultMaxBytes is the default of MaxBytes (dsec up --max-request-size).
const DefaultMaxBytes = 64 << 20

// SmallBytes bounds the calls that carry no data.
const SmallBytes = 1 << 20

// bulk are the unary calls that carry data, by procedure: they get MaxBytes.
var bulk = map[string]bool{
	"/dsec.sandbox.v1.SandboxService/Exec":       true, // stdin
	"/dsec.sandbox.v1.SandboxService/WriteStdin": true,
}

// Limits holds the bound of every procedure of dsec's APIs.
type Limits struct {
	max   int64
	procs map[string]int64 // procedure → bound of its body; absent: max; -1: a client stream
}

// New returns the limits for maxBytes (0: DefaultMaxBytes).
func New(maxBytes int64) *Limits {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	l := &Limits{max: maxBytes, procs: map[string]int64{}}
	for _, fd := range []protoreflect.FileDescriptor{
		sandboxv1.File_dsec_sandbox_v1_sandbox_proto,
		imagev1.File_dsec_image_v1_image_proto,
		adminv1.File_dsec_admin_v1_admin_proto,
		nodev1.File_dsec_node_v1_node_proto,
	} {
		svcs := fd.Services()
		for i := range svcs.Len() {
			ms := svcs.Get(i).Methods()
			for j := range ms.Len() {
				m := ms.Get(j)
				proc := "/" + string(svcs.Get(i).FullName()) + "/" + string(m.Name())
				switch {
				case m.IsStreamingClient():
					l.procs[proc] = -1
				case bulk[proc]:
					l.procs[proc] = maxBytes
				default:
					l.procs[proc] = min(SmallBytes, maxBytes)
				}
			}
		}
	}
	return l
}

// MaxBytes returns the largest body or stream message accepted.
func (l *Limits) MaxBytes() int64 { return l.max }

// ConnectOption caps every message a Connect handler reads at MaxBytes.
func (l *Limits) ConnectOption() connect.HandlerOption {
	return connect.WithReadMaxBytes(int(min(l.max, int64(^uint(0)>>1))))
}

// Bound returns the most body bytes a request to path may carry, and
// whether its body is a client stream (no bound on the whole).
func (l *Limits) Bound(path string) (n int64, stream bool) {
	b, ok := l.procs[path]
	switch {
	case !ok:
		return l.max, false
	case b < 0:
		return 0, true
	}
	return b, false
}

// errorWriter writes errors in the protocol of the request.
var errorWriter = connect.NewErrorWriter()

// Handler wraps h so that every request body is bounded (see the package
// doc). Paths that are not procedures (/healthz, /metrics, …) get MaxBytes.
func (l *Limits) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit, stream := l.Bound(r.URL.Path)
		if stream {
			h.ServeHTTP(w, r)
			return
		}
		if r.ContentLength > limit {
			msg := l.message(r.URL.Path, r.ContentLength, limit)
			if _, proc := l.procs[r.URL.Path]; proc && errorWriter.IsSupported(r) {
				_ = errorWriter.Write(w, r, connect.NewError(connect.CodeResourceExhausted, errors.New(msg)))
			} else {
				http.Error(w, "dsec: "+msg, http.StatusRequestEntityTooLarge)
			}
			return
		}
		if _, proc := l.procs[r.URL.Path]; proc {
			// Connect passes a *connect.Error of the body on as it is.
			r.Body = &body{ReadCloser: r.Body, left: limit, err: connect.NewError(connect.CodeResourceExhausted,
				errors.New(l.message(r.URL.Path, -1, limit)))}
		} else {
			r.Body = http.MaxBytesReader(w, r.Body, limit)
		}
		h.ServeHTTP(w, r)
	})
}

// body is a request body of a procedure cut at a bound: past it, reads
// fail with err, a ResourceExhausted that says what to do.
type body struct {
	io.ReadCloser
	left int64
	err  error
}

func (b *body) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.err
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return 0, b.err
	}
	return n, err
}

// message says why a body of n bytes (-1: more than limit) to path is
// refused and what to do.
func (l *Limits) message(path string, n, limit int64) string {
	size := "the request is more than that"
	if n >= 0 {
		size = fmt.Sprintf("the request is %d bytes", n)
	}
	if _, known := l.procs[path]; known && limit < l.max {
		return fmt.Sprintf("%s takes at most %d bytes (it names things and sets options, it does not carry data) and %s: "+
			"send files with the file API or dsec cp", path, limit, size)
	}
	return fmt.Sprintf("this server takes requests of at most %d bytes (dsec up --max-request-size) and %s: send less at a time", limit, size)
}
