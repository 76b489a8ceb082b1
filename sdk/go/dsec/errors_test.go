package dsec

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dsecproject/dsec/api/errkind"
)

// kindCodes gives the code the server sends for each kind. The server's
// own table (its internal/apierr) is checked against this package's
// inverse by a test in the server's module, which sends every kind through
// it to this client.
var kindCodes = map[error]connect.Code{
	ErrInvalidArgument:    connect.CodeInvalidArgument,
	ErrNotFound:           connect.CodeNotFound,
	ErrAlreadyExists:      connect.CodeAlreadyExists,
	ErrFailedPrecondition: connect.CodeFailedPrecondition,
	ErrResourceExhausted:  connect.CodeResourceExhausted,
	ErrDeadlineExceeded:   connect.CodeDeadlineExceeded,
	ErrUnauthenticated:    connect.CodeUnauthenticated,
	ErrPermissionDenied:   connect.CodePermissionDenied,
	ErrUnavailable:        connect.CodeUnavailable,
	ErrInternal:           connect.CodeInternal,
}

// TestErrorKinds sends every kind of the API as its code and checks that
// the client maps it back, on a unary call, a server stream and a client
// stream.
func TestErrorKinds(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	sb := c.Sandbox("sb-a")
	for _, kind := range errkind.All {
		t.Run(kind.Error(), func(t *testing.T) {
			code, ok := kindCodes[kind]
			if !ok {
				t.Fatalf("kind %v has no code in kindCodes", kind)
			}
			msg := "sandbox sb-a: " + kind.Error() + ": do something about it"
			f.setFail(connect.NewError(code, errors.New(msg)))

			_, unaryErr := c.Get(ctx, "sb-a")
			_, streamErr := sb.Exec(ctx, []string{"true"})
			_, uploadErr := sb.Upload(ctx, "/f", strings.NewReader("x"))
			for name, err := range map[string]error{"Get": unaryErr, "Exec": streamErr, "Upload": uploadErr} {
				var de *Error
				if !errors.As(err, &de) {
					t.Errorf("%s = %T %v, want *Error", name, err, err)
					continue
				}
				if !errors.Is(err, kind) || de.Kind != kind {
					t.Errorf("%s = kind %v, want %v", name, de.Kind, kind)
				}
				if de.Message != msg {
					t.Errorf("%s message = %q, want %q", name, de.Message, msg)
				}
			}
		})
	}
}

func TestErrorCodes(t *testing.T) {
	tests := []struct {
		code connect.Code
		want error
	}{
		{connect.CodeInvalidArgument, ErrInvalidArgument},
		{connect.CodeNotFound, ErrNotFound},
		{connect.CodeAlreadyExists, ErrAlreadyExists},
		{connect.CodeFailedPrecondition, ErrFailedPrecondition},
		{connect.CodeResourceExhausted, ErrResourceExhausted},
		{connect.CodeDeadlineExceeded, ErrDeadlineExceeded},
		{connect.CodeUnauthenticated, ErrUnauthenticated},
		{connect.CodePermissionDenied, ErrPermissionDenied},
		{connect.CodeUnavailable, ErrUnavailable},
		{connect.CodeInternal, ErrInternal},
		{connect.CodeUnknown, ErrInternal},
		{connect.CodeDataLoss, ErrInternal},
		{connect.CodeUnimplemented, ErrInternal},
		{connect.CodeAborted, ErrFailedPrecondition},
		{connect.CodeOutOfRange, ErrInvalidArgument},
		{connect.CodeCanceled, context.Canceled},
	}
	f := newFake()
	c, _ := f.start(t, testKey)
	for _, tt := range tests {
		f.setFail(connect.NewError(tt.code, errors.New("the message")))
		_, err := c.WhoAmI(t.Context())
		if !errors.Is(err, tt.want) {
			t.Errorf("WhoAmI failing with %v = %v, want %v", tt.code, err, tt.want)
		}
		if tt.code != connect.CodeCanceled && !strings.Contains(err.Error(), "the message") {
			t.Errorf("WhoAmI failing with %v = %q, want the server's message", tt.code, err)
		}
		// The same mapping on a server stream.
		f.setExec(play(connect.NewError(tt.code, errors.New("the message"))))
		_, err = c.Sandbox("sb-a").Exec(t.Context(), []string{"true"})
		if !errors.Is(err, tt.want) {
			t.Errorf("Exec failing with %v = %v, want %v", tt.code, err, tt.want)
		}
	}
	// A kind of its own, so that nothing matches the wrong sentinel.
	for _, k := range errkind.All {
		if k == ErrNotFound {
			continue
		}
		if errors.Is(&Error{Kind: ErrNotFound}, k) {
			t.Errorf("an ErrNotFound error also is %v", k)
		}
	}
}

func TestRetryHint(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)

	// A unary call, as the server sends it (its own conversion is checked
	// by the server's module).
	full := connect.NewError(connect.CodeResourceExhausted, errors.New("node full: try again later"))
	hint, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)})
	if derr != nil {
		t.Fatal(derr)
	}
	full.AddDetail(hint)
	f.setFail(full)
	_, err := c.Create(t.Context(), CreateOptions{Image: "debian"})
	var de *Error
	if !errors.As(err, &de) || de.Kind != ErrResourceExhausted || de.RetryAfter != 1500*time.Millisecond {
		t.Fatalf("Create on a full node = %#v, want ResourceExhausted with RetryAfter 1.5s", err)
	}
	if want := "node full: try again later (retry after 1.5s)"; err.Error() != want {
		t.Errorf("Create on a full node = %q, want %q", err, want)
	}

	// A hand-made detail on a stream.
	ce := connect.NewError(connect.CodeUnavailable, errors.New("edge draining"))
	detail, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(3 * time.Second)})
	if derr != nil {
		t.Fatal(derr)
	}
	ce.AddDetail(detail)
	f.setFail(nil)
	f.setExec(play(ce))
	_, err = c.Sandbox("sb-a").Exec(t.Context(), []string{"true"})
	if !errors.As(err, &de) || de.Kind != ErrUnavailable || de.RetryAfter != 3*time.Second {
		t.Errorf("Exec on a draining edge = %#v, want Unavailable with RetryAfter 3s", err)
	}

	// No detail, no hint.
	f.setFail(connect.NewError(connect.CodeResourceExhausted, errors.New("quota")))
	_, err = c.WhoAmI(t.Context())
	if !errors.As(err, &de) || de.RetryAfter != 0 {
		t.Errorf("WhoAmI without a retry detail = %#v, want RetryAfter 0", err)
	}
}

func TestServerDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "http://" + l.Addr().String()
	l.Close()
	c, err := New(Config{Addr: addr, APIKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.WhoAmI(t.Context())
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "dsec up") {
		t.Errorf("WhoAmI on a closed port = %v, want ErrUnavailable naming %s and `dsec up`", err, addr)
	}
}

func TestErrorString(t *testing.T) {
	tests := []struct {
		err  *Error
		want string
	}{
		{&Error{Kind: ErrNotFound, Message: "sandbox x: not found"}, "sandbox x: not found"},
		{&Error{Kind: ErrNotFound}, "not found"},
		{&Error{Kind: ErrResourceExhausted, Message: "full", RetryAfter: 2 * time.Second}, "full (retry after 2s)"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("%#v.Error() = %q, want %q", tt.err, got, tt.want)
		}
	}
}
