package cluster

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func startEmbedded(t *testing.T, dir string, lg *slog.Logger) *Embedded {
	t.Helper()
	if lg == nil {
		lg = testLogger()
	}
	e, err := StartEmbedded(testCtx(t), EmbedConfig{Dir: dir, Logger: lg})
	if err != nil {
		t.Fatalf("StartEmbedded(%q) = %v", dir, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func TestEmbeddedRestartKeepsData(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "etcd")
	ctx := testCtx(t)

	e := startEmbedded(t, dir, nil)
	if _, err := e.Client().Put(ctx, "/k", "v1"); err != nil {
		t.Fatalf("Put = %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}
	for _, name := range []string{EmbedSocket, EmbedEndpointFile} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after Close, stat %s = %v, want not exist", name, err)
		}
	}
	select {
	case <-e.Done():
	default:
		t.Errorf("Done() not closed after Close")
	}

	e = startEmbedded(t, dir, nil)
	resp, err := e.Client().Get(ctx, "/k")
	if err != nil {
		t.Fatalf("Get after restart = %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
		t.Errorf("Get(/k) after restart = %v, want v1", resp.Kvs)
	}
}

func TestEmbeddedFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir() // created 0755 by the test framework (minus umask)
	e := startEmbedded(t, dir, nil)

	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o700 {
		t.Errorf("mode of %s = %v, want 0700", dir, got)
	}
	fi, err = os.Stat(filepath.Join(dir, EmbedSocket))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode of socket = %v, want socket 0600", fi.Mode())
	}
	b, err := os.ReadFile(filepath.Join(dir, EmbedEndpointFile))
	if err != nil {
		t.Fatal(err)
	}
	want := "unix://" + filepath.Join(dir, EmbedSocket)
	if got := strings.TrimSpace(string(b)); got != want || e.Endpoint() != want {
		t.Errorf("endpoint file = %q, Endpoint() = %q, want %q", got, e.Endpoint(), want)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range entries {
		names = append(names, de.Name())
	}
	if got, want := strings.Join(names, " "), "data endpoint etcd.sock lock"; got != want {
		t.Errorf("files in Dir = %q, want %q", got, want)
	}
}

// TestEmbeddedEndpoint checks that tools outside the process reach etcd
// through the socket the endpoint file names.
func TestEmbeddedEndpoint(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b, err := os.ReadFile(filepath.Join(shared.Dir(), EmbedEndpointFile))
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{strings.TrimSpace(string(b))},
		DialTimeout: 5 * time.Second,
		Logger:      newZapLogger(testLogger(), 0),
	})
	if err != nil {
		t.Fatalf("clientv3.New(%q) = %v", b, err)
	}
	defer c.Close()
	cleanPrefix(t, "/dsec-test/endpoint")
	if _, err := c.Put(ctx, "/dsec-test/endpoint", "through the socket"); err != nil {
		t.Fatalf("Put over %s = %v", b, err)
	}
	resp, err := shared.Client().Get(ctx, "/dsec-test/endpoint")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "through the socket" {
		t.Errorf("in-process Get = %v, want the value put over the socket", resp.Kvs)
	}
}

func TestEmbeddedDirInUse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := startEmbedded(t, dir, nil)

	_, err := StartEmbedded(testCtx(t), EmbedConfig{Dir: dir, Logger: testLogger()})
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("second StartEmbedded(%q) = %v, want FailedPrecondition naming the directory", dir, err)
	}
	// The failed start must not have taken the first one's socket.
	if _, err := os.Stat(filepath.Join(dir, EmbedSocket)); err != nil {
		t.Errorf("socket of the running etcd: %v", err)
	}
	if _, err := first.Client().Put(testCtx(t), "/k", "v"); err != nil {
		t.Errorf("Put on the first etcd = %v", err)
	}
}

func TestEmbeddedStartFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		cfg  EmbedConfig
		kind error
	}{
		{"no dir", context.Background(), EmbedConfig{}, errdefs.ErrInvalidArgument},
		{"canceled", canceled, EmbedConfig{Dir: dir}, errdefs.ErrInternal},
		{"timeout", context.Background(), EmbedConfig{Dir: dir, StartTimeout: time.Nanosecond}, errdefs.ErrDeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Logger = testLogger()
			e, err := StartEmbedded(tt.ctx, tt.cfg)
			if err == nil {
				e.Close()
				t.Fatalf("StartEmbedded(%+v) = nil error, want %v", tt.cfg, tt.kind)
			}
			if errdefs.Kind(err) != tt.kind || !strings.Contains(err.Error(), tt.cfg.Dir) {
				t.Errorf("StartEmbedded(%+v) = %v, want %v naming the directory", tt.cfg, err, tt.kind)
			}
		})
	}
	// A failed start cleans up: the directory can be used at once.
	e := startEmbedded(t, dir, nil)
	if _, err := e.Client().Put(testCtx(t), "/k", "v"); err != nil {
		t.Errorf("Put after failed starts = %v", err)
	}
}

func TestEmbeddedLongDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", maxSocketPath))
	e := startEmbedded(t, dir, nil)
	if e.Endpoint() != "" {
		t.Errorf("Endpoint() = %q, want none for a directory too long for a socket", e.Endpoint())
	}
	if _, err := os.Stat(filepath.Join(dir, EmbedEndpointFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat endpoint file = %v, want not exist", err)
	}
	if _, err := e.Client().Put(testCtx(t), "/k", "v"); err != nil {
		t.Errorf("Put = %v", err)
	}
}

// TestEmbeddedQuiet checks that an ordinary start, restart and stop log
// nothing at Warn or above.
func TestEmbeddedQuiet(t *testing.T) {
	t.Parallel()
	var buf lockedBuffer
	lg := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dir := t.TempDir()
	for range 2 {
		e := startEmbedded(t, dir, lg)
		if _, err := e.Client().Put(testCtx(t), "/k", "v"); err != nil {
			t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if buf.String() != "" {
		t.Errorf("etcd logged at Warn or above:\n%s", buf.String())
	}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
