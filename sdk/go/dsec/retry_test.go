package dsec

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
)

// syncBuffer is a bytes.Buffer for a logger written from the calling
// goroutine and read by the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.FieldsFunc(b.buf.String(), func(r rune) bool { return r == '\n' })
}

// refusal is a server's ResourceExhausted with a retry hint.
func refusal(t *testing.T, msg string, hint time.Duration) *connect.Error {
	t.Helper()
	ce := connect.NewError(connect.CodeResourceExhausted, errors.New(msg))
	d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(hint)})
	if err != nil {
		t.Fatal(err)
	}
	ce.AddDetail(d)
	return ce
}

// retryClient is a client of f with CreateRetries retries whose debug log
// goes to the returned buffer.
func retryClient(t *testing.T, f *fake, retries int) (*Client, *syncBuffer) {
	t.Helper()
	srv := f.serve(t, serverOpts{})
	log := &syncBuffer{}
	c, err := New(Config{Addr: srv.URL, APIKey: testKey, CreateRetries: retries,
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, log
}

func (f *fake) createCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.creates
}

func (f *fake) failCreates(errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.createErrs = errs
}

// A full platform is retried after its hint until the caller's deadline,
// and the caller then gets the server's error, not its own deadline.
func TestCreateRetriesStopAtTheDeadline(t *testing.T) {
	f := newFake()
	c, log := retryClient(t, f, 100)
	full := refusal(t, "no node has room for 64 MiB: retry later", 150*time.Millisecond)
	errs := make([]error, 100)
	for i := range errs {
		errs[i] = full
	}
	f.failCreates(errs...)

	const budget = 800 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), budget)
	defer cancel()
	start := time.Now()
	sb, err := c.Create(ctx, CreateOptions{Image: "busybox"})
	elapsed := time.Since(start)

	var de *Error
	if !errors.As(err, &de) || de.Kind != ErrResourceExhausted || de.Message != "no node has room for 64 MiB: retry later" {
		t.Fatalf("Create on a full platform = %v, %#v; want the server's ResourceExhausted", sb, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Create = %v, want the server's error rather than the deadline", err)
	}
	if elapsed >= budget {
		t.Errorf("Create took %s, want it to stop before the deadline of %s", elapsed, budget)
	}
	calls := f.createCalls()
	if calls < 3 || calls > 6 {
		t.Errorf("Create calls = %d, want 3 to 6 within %s of 150ms hints", calls, budget)
	}
	lines := log.lines()
	if len(lines) != calls-1 {
		t.Fatalf("debug log = %q, want one line per retry (%d)", lines, calls-1)
	}
	for i, l := range lines {
		for _, want := range []string{"level=DEBUG", "attempt=" + string(rune('1'+i)), "wait=", "no node has room for 64 MiB"} {
			if !strings.Contains(l, want) {
				t.Errorf("debug log line %d = %q, want it to contain %q", i, l, want)
			}
		}
	}
}

func TestCreateRetries(t *testing.T) {
	full := func(t *testing.T) error { return refusal(t, "full", 10*time.Millisecond) }
	down := func(*testing.T) error {
		return connect.NewError(connect.CodeUnavailable, errors.New("edge restarting"))
	}
	bad := func(*testing.T) error {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("memory 1 TiB is more than the largest node's 24 GiB"))
	}
	for _, tc := range []struct {
		name    string
		retries int
		key     string
		errs    []func(*testing.T) error
		calls   int
		want    error // nil: created
	}{
		{"refusals then room", 3, "", []func(*testing.T) error{full, full}, 3, nil},
		{"more refusals than retries", 2, "", []func(*testing.T) error{full, full, full}, 3, ErrResourceExhausted},
		{"no retries by default", 0, "", []func(*testing.T) error{full}, 1, ErrResourceExhausted},
		{"never an invalid argument", 3, "", []func(*testing.T) error{bad}, 1, ErrInvalidArgument},
		{"unavailable without a key", 3, "", []func(*testing.T) error{down}, 1, ErrUnavailable},
		{"unavailable with a key", 3, "k1", []func(*testing.T) error{down}, 2, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			c, log := retryClient(t, f, tc.retries)
			errs := make([]error, len(tc.errs))
			for i, e := range tc.errs {
				errs[i] = e(t)
			}
			f.failCreates(errs...)
			sb, err := c.Create(t.Context(), CreateOptions{Image: "busybox", IdempotencyKey: tc.key})
			switch {
			case tc.want == nil && (err != nil || sb == nil):
				t.Errorf("Create = %v, %v; want a sandbox", sb, err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Errorf("Create = %v, %v; want %v", sb, err, tc.want)
			}
			if got := f.createCalls(); got != tc.calls {
				t.Errorf("Create calls = %d, want %d", got, tc.calls)
			}
			if got := len(log.lines()); got != tc.calls-1 {
				t.Errorf("debug log has %d lines, want %d (one per retry): %q", got, tc.calls-1, log.lines())
			}
		})
	}
}
