package blobsource

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/blobstore"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// newStore returns a blob store holding one blob of n pseudo-random bytes.
func newStore(t *testing.T, n int) (root, digest string, data []byte) {
	t.Helper()
	root = t.TempDir()
	st, err := blobstore.New(root)
	if err != nil {
		t.Fatal(err)
	}
	data = make([]byte, n)
	r := rand.New(rand.NewChaCha8([32]byte{1}))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	desc, err := st.Put(context.Background(), bytes.NewReader(data), "")
	if err != nil {
		t.Fatal(err)
	}
	return root, desc.Digest, data
}

const missing = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

// testSource checks what every Source must do.
func testSource(t *testing.T, src Source, digest string, data []byte) {
	ctx := context.Background()
	size, err := src.Size(ctx, digest)
	if err != nil || size != int64(len(data)) {
		t.Fatalf("Size(%s) = %d, %v, want %d", digest, size, err, len(data))
	}
	tests := []struct {
		name    string
		off     int64
		n       int
		wantN   int
		wantEOF bool
	}{
		{"start", 0, 100, 100, false},
		{"middle", 12345, 70000, 70000, false},
		{"exact end", int64(len(data) - 10), 10, 10, false},
		{"short at end", int64(len(data) - 10), 100, 10, true},
		{"past end", int64(len(data)), 10, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := make([]byte, tt.n)
			n, err := src.ReadAt(ctx, digest, p, tt.off)
			if n != tt.wantN || errors.Is(err, io.EOF) != tt.wantEOF || (err != nil && !errors.Is(err, io.EOF)) {
				t.Fatalf("ReadAt(%d bytes at %d) = %d, %v, want %d (EOF %v)", tt.n, tt.off, n, err, tt.wantN, tt.wantEOF)
			}
			if want := data[tt.off : tt.off+int64(n)]; !bytes.Equal(p[:n], want) {
				t.Errorf("ReadAt(%d bytes at %d) returned other bytes than the blob's", tt.n, tt.off)
			}
		})
	}
	if _, err := src.Size(ctx, missing); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Size(missing) = %v, want NotFound", err)
	}
	if _, err := src.ReadAt(ctx, missing, make([]byte, 10), 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadAt(missing) = %v, want NotFound", err)
	}
	if _, err := src.ReadAt(ctx, "sha256:../../etc/passwd", make([]byte, 10), 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ReadAt(bad digest) = %v, want InvalidArgument", err)
	}
}

func TestDir(t *testing.T) {
	root, digest, data := newStore(t, 300_000)
	src, err := Open("dir:" + root)
	if err != nil {
		t.Fatal(err)
	}
	testSource(t, src, digest, data)
	if _, err := NewDir(t.TempDir()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("NewDir(empty dir) = %v, want NotFound", err)
	}
}

func TestHTTP(t *testing.T) {
	root, digest, data := newStore(t, 300_000)
	srv, err := NewServer(root, ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		srv.ServeHTTP(w, r)
	}))
	defer ts.Close()

	t.Run("blobserver", func(t *testing.T) {
		src, err := Open(ts.URL)
		if err != nil {
			t.Fatal(err)
		}
		testSource(t, src, digest, data)
	})
	t.Run("oci", func(t *testing.T) {
		paths = nil
		src, err := NewHTTP(ts.URL+"/v2/library/layers/", HTTPOptions{})
		if err != nil {
			t.Fatal(err)
		}
		testSource(t, src, digest, data)
		want := "/v2/library/layers/blobs/" + digest
		if len(paths) == 0 || paths[0] != want {
			t.Errorf("OCI source asked for %q, want %q", paths, want)
		}
	})
}

func TestHTTPToken(t *testing.T) {
	root, digest, data := newStore(t, 100_000)
	srv, err := NewServer(root, ServerOptions{Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	anon, _ := NewHTTP(ts.URL, HTTPOptions{})
	if _, err := anon.ReadAt(context.Background(), digest, make([]byte, 10), 0); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("ReadAt without token = %v, want Unauthenticated", err)
	}
	wrong, _ := NewHTTP(ts.URL, HTTPOptions{Token: "guess"})
	if _, err := wrong.Size(context.Background(), digest); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("Size with a wrong token = %v, want Unauthenticated", err)
	}
	src, _ := NewHTTP(ts.URL, HTTPOptions{Token: "s3cret"})
	testSource(t, src, digest, data)
}

// A server that refuses HEAD and ignores Range still works.
func TestHTTPPlainServer(t *testing.T) {
	root, digest, data := newStore(t, 100_000)
	srv, err := NewServer(root, ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			http.Error(w, "no HEAD", http.StatusMethodNotAllowed)
			return
		}
		r.Header.Del("Range")
		srv.ServeHTTP(w, r)
	}))
	defer ts.Close()
	src, _ := NewHTTP(ts.URL, HTTPOptions{})
	testSource(t, src, digest, data)
}

func TestHTTPUnavailable(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	src, _ := NewHTTP(ts.URL, HTTPOptions{})
	if _, err := src.ReadAt(context.Background(), missing, make([]byte, 10), 0); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("ReadAt from a 503 server = %v, want Unavailable", err)
	}
	ts.Close()
	if _, err := src.ReadAt(context.Background(), missing, make([]byte, 10), 0); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("ReadAt from a closed server = %v, want Unavailable", err)
	}
}

func TestHTTPTimeout(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer ts.Close()
	defer close(release)
	src, _ := NewHTTP(ts.URL, HTTPOptions{Timeout: 100 * time.Millisecond})
	start := time.Now()
	_, err := src.ReadAt(context.Background(), missing, make([]byte, 10), 0)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Errorf("ReadAt from a hanging server = %v after %v, want DeadlineExceeded after 100ms", err, time.Since(start))
	}
}

func TestServerCaps(t *testing.T) {
	root, digest, data := newStore(t, 300<<10)
	srv, err := NewServer(root, ServerOptions{Rate: 1 << 20, Latency: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	src, _ := NewHTTP(ts.URL, HTTPOptions{})
	start := time.Now()
	p := make([]byte, len(data))
	if _, err := src.ReadAt(context.Background(), digest, p, 0); err != nil {
		t.Fatal(err)
	}
	// 300 KiB at 1 MiB/s with a 100 KiB burst: at least 0.19 s, plus 50 ms.
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("300 KiB at 1 MiB/s with 50 ms latency took %v, want >= 240ms", d)
	}
	if !bytes.Equal(p, data) {
		t.Error("rate-limited read returned other bytes")
	}

	resp, err := http.Post(ts.URL+"/blobs/"+digest, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST = %s, want 405", resp.Status)
	}
}

func TestParseContentRange(t *testing.T) {
	tests := []struct {
		in                string
		first, last, size int64
		ok                bool
	}{
		{"bytes 0-9/100", 0, 9, 100, true},
		{"bytes 5-5/*", 5, 5, -1, true},
		{"bytes 0-100/100", 0, 0, 0, false},
		{"bytes 9-0/100", 0, 0, 0, false},
		{"bytes -1-5/100", 0, 0, 0, false},
		{"bytes +1-5/100", 0, 0, 0, false},
		{"items 0-9/100", 0, 0, 0, false},
		{"bytes */100", 0, 0, 0, false},
		{"bytes 0-9", 0, 0, 0, false},
	}
	for _, tt := range tests {
		first, last, size, err := parseContentRange(tt.in)
		if (err == nil) != tt.ok || (tt.ok && (first != tt.first || last != tt.last || size != tt.size)) {
			t.Errorf("parseContentRange(%q) = %d, %d, %d, %v, want %d, %d, %d (ok %v)",
				tt.in, first, last, size, err, tt.first, tt.last, tt.size, tt.ok)
		}
	}
}

func FuzzParseContentRange(f *testing.F) {
	for _, s := range []string{"bytes 0-9/100", "bytes 5-5/*", "bytes 0-100/100", "bytes 9223372036854775807-9223372036854775807/*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		first, last, size, err := parseContentRange(s)
		if err != nil {
			return
		}
		if first < 0 || last < first || (size != -1 && size <= last) {
			t.Errorf("parseContentRange(%q) = %d, %d, %d: inconsistent", s, first, last, size)
		}
	})
}

func FuzzBlobHex(f *testing.F) {
	for _, s := range []string{"/blobs/sha256/" + missing[7:], "/v2/a/b/blobs/" + missing, "/blobs/sha256:../x", "/x/blobs/" + missing} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		h, ok := blobHex(path)
		if !ok {
			return
		}
		if _, err := checkDigest("sha256:" + h); err != nil || strings.ContainsAny(h, "/.") {
			t.Errorf("blobHex(%q) = %q: not a hex digest", path, h)
		}
	})
}
