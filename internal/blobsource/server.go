package blobsource

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// ServerOptions configures NewServer. The zero value serves without
// authentication, rate cap or added latency.
type ServerOptions struct {
	// Token, when set, is required as "Authorization: Bearer <Token>".
	Token string
	// Rate caps the bytes per second sent, shared by all requests (one
	// token bucket); 0 means no cap.
	Rate int64
	// Latency is added before each response, to simulate remote storage.
	Latency time.Duration
}

// Server serves a blob store directory read-only over HTTP: GET and HEAD
// of /blobs/sha256/<hex> and /blobs/sha256:<hex> (also under any
// /v2/<repo> prefix), with Range requests, ETags and
// immutable caching headers. It is the handler of dsec blobserver.
type Server struct {
	dir     string // <root>/sha256, absolute
	opts    ServerOptions
	limiter *bucket // nil without a rate cap
}

var _ http.Handler = (*Server)(nil)

// NewServer returns a Server for the blob store at root.
func NewServer(root string, opts ServerOptions) (*Server, error) {
	src, err := NewDir(root)
	if err != nil {
		return nil, err
	}
	s := &Server{dir: src.(*Dir).dir, opts: opts}
	if opts.Rate > 0 {
		s.limiter = newBucket(opts.Rate)
	}
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "blobserver is read-only: use GET or HEAD", http.StatusMethodNotAllowed)
		return
	}
	if s.opts.Token != "" {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(s.opts.Token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="dsec blobserver"`)
			http.Error(w, "blobserver needs the bearer token it was started with", http.StatusUnauthorized)
			return
		}
	}
	hx, ok := blobHex(r.URL.Path)
	if !ok {
		http.Error(w, "want /blobs/sha256/<hex> or /blobs/sha256:<hex>", http.StatusNotFound)
		return
	}
	if s.opts.Latency > 0 {
		t := time.NewTimer(s.opts.Latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	f, err := os.Open(filepath.Join(s.dir, hx))
	if errors.Is(err, fs.ErrNotExist) {
		http.Error(w, "no such blob", http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, "cannot open blob", http.StatusInternalServerError)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		http.Error(w, "no such blob", http.StatusNotFound)
		return
	}
	w.Header().Set("ETag", `"sha256:`+hx+`"`)
	w.Header().Set("Docker-Content-Digest", "sha256:"+hx)
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	w.Header().Set("Content-Type", "application/octet-stream")
	if s.limiter != nil {
		w = &limitedWriter{ResponseWriter: w, ctx: r.Context(), b: s.limiter}
	}
	http.ServeContent(w, r, "", time.Time{}, f)
}

// blobHex returns the hex digest a path names.
func blobHex(path string) (string, bool) {
	i := strings.LastIndex(path, "/blobs/")
	if i < 0 || (i > 0 && !strings.HasPrefix(path, "/v2/")) {
		return "", false
	}
	rest := path[i+len("/blobs/"):]
	var h string
	switch {
	case strings.HasPrefix(rest, "sha256/"):
		h = rest[len("sha256/"):]
	case strings.HasPrefix(rest, "sha256:"):
		h = rest[len("sha256:"):]
	default:
		return "", false
	}
	if _, err := checkDigest("sha256:" + h); err != nil {
		return "", false
	}
	return h, true
}

// limitedWriter writes through the shared token bucket.
type limitedWriter struct {
	http.ResponseWriter
	ctx context.Context
	b   *bucket
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n := min(len(p), 32<<10)
		if err := l.b.wait(l.ctx, int64(n)); err != nil {
			return written, err
		}
		m, err := l.ResponseWriter.Write(p[:n])
		written += m
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (l *limitedWriter) Unwrap() http.ResponseWriter { return l.ResponseWriter }

// bucket is a token bucket of bytes, refilled at rate per second, holding
// at most a tenth of a second's worth (at least 32 KiB). Waiters take
// tokens in turn, so the rate is shared fairly enough by all requests.
type bucket struct {
	rate  float64 // bytes per second
	burst float64

	mu     sync.Mutex
	tokens float64   // guarded by mu; negative when reserved ahead
	last   time.Time // guarded by mu
}

func newBucket(rate int64) *bucket {
	burst := max(float64(rate)/10, 32<<10)
	return &bucket{rate: float64(rate), burst: burst, tokens: burst, last: time.Now()}
}

// wait takes n tokens, sleeping until the bucket has had them.
func (b *bucket) wait(ctx context.Context, n int64) error {
	b.mu.Lock()
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens -= float64(n) // reserve, possibly going negative
	deficit := -b.tokens
	b.mu.Unlock()
	if deficit <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(deficit / b.rate * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rate-limited write: %w", ctx.Err())
	}
}
