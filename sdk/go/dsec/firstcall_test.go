package dsec

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// shortLived returns a ShortLived client of f's server, with key.
func shortLived(t *testing.T, f *fake, key string) *Client {
	t.Helper()
	srv := f.serve(t, serverOpts{})
	c, err := New(Config{Addr: srv.URL, APIKey: key, ShortLived: true})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestShortLivedFirstCall: a ShortLived client's first call goes over
// HTTP/1.1 (a server stream here, its output and status intact), the later
// ones over the shared HTTP/2 connection.
func TestShortLivedFirstCall(t *testing.T) {
	f := newFake()
	c := shortLived(t, f, testKey)
	f.setExec(func(ctx context.Context, send func(*sandboxv1.ExecResponse) error) error {
		for _, ev := range []*sandboxv1.ExecResponse{startedEvent("e1"), outEvent(sandboxv1.Stream_STREAM_STDOUT, 0, "hi"), exitEvent(3)} {
			if err := send(ev); err != nil {
				return err
			}
		}
		return nil
	})
	ctx := t.Context()
	for i := range 2 {
		res, err := c.Sandbox("sb-a").Exec(ctx, []string{"echo", "hi"})
		if err != nil || string(res.Stdout) != "hi" || res.Code() != 3 {
			t.Fatalf("Exec %d = %+v, %v; want stdout \"hi\", exit 3", i, res, err)
		}
	}
	if _, err := c.WhoAmI(ctx); err != nil {
		t.Fatalf("WhoAmI: %v", err)
	}
	var protos []string
	for _, r := range f.seen() {
		protos = append(protos, r.proto)
	}
	if want := []string{"HTTP/1.1", "HTTP/2.0", "HTTP/2.0"}; !equalStrings(protos, want) {
		t.Errorf("the server saw %v, want %v", protos, want)
	}
}

// TestShortLivedFirstUpload: a client stream as the first call (dsec cp's
// upload) arrives whole over HTTP/1.1.
func TestShortLivedFirstUpload(t *testing.T) {
	f := newFake()
	c := shortLived(t, f, testKey)
	data := bytes.Repeat([]byte("0123456789abcdef"), (3*chunkSize+5)/16)
	if err := c.Sandbox("sb-a").WriteFile(t.Context(), "/big", data); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	f.mu.Lock()
	got := f.files["sb-a/big"]
	f.mu.Unlock()
	if !bytes.Equal(got, data) {
		t.Errorf("the server stored %d bytes, want the %d sent", len(got), len(data))
	}
	if seen := f.seen(); len(seen) != 1 || seen[0].proto != "HTTP/1.1" {
		t.Errorf("the server saw %+v, want one HTTP/1.1 call", seen)
	}
}

// TestShortLivedRefusedUpload: a first call the server refuses before it
// reads the body (a wrong key on a large upload) says why, not that the
// connection broke under the upload.
func TestShortLivedRefusedUpload(t *testing.T) {
	f := newFake()
	c := shortLived(t, f, "someone-elses-key")
	data := make([]byte, 64<<20)
	err := c.Sandbox("sb-a").WriteFile(t.Context(), "/big", data)
	if !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("WriteFile with a wrong key = %v, want ErrUnauthenticated", err)
	}
}

// TestShortLivedCancel: cancelling the first call ends it at once, on
// both sides: the server's handler sees its context end (the connection
// closed).
func TestShortLivedCancel(t *testing.T) {
	f := newFake()
	c := shortLived(t, f, testKey)
	serverDone := make(chan error, 1)
	f.setExec(func(ctx context.Context, send func(*sandboxv1.ExecResponse) error) error {
		if err := send(startedEvent("e1")); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			serverDone <- ctx.Err()
		case <-time.After(10 * time.Second):
			serverDone <- errors.New("the handler's context did not end")
		}
		return ctx.Err()
	})
	ctx, cancel := context.WithCancel(t.Context())
	p, err := c.Sandbox("sb-a").Start(ctx, ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer p.Close()
	time.AfterFunc(50*time.Millisecond, cancel)
	t0 := time.Now()
	_, err = p.Wait(nil, nil)
	if err == nil || time.Since(t0) > 5*time.Second {
		t.Errorf("Wait after cancel = %v after %v; want an error at once", err, time.Since(t0))
	}
	if err := <-serverDone; !errors.Is(err, context.Canceled) {
		t.Errorf("server side: %v, want its context cancelled", err)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
