package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// shared is one embedded etcd for the whole test binary; tests that need
// their own (restart, locking) start one in t.TempDir().
var shared *Embedded

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dsec-cluster-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shared, err = StartEmbedded(ctx, EmbedConfig{Dir: dir, Logger: testLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if err := shared.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		// Everything etcd and the stores started must be gone once closed.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	return code
}

// testLogger logs warnings and errors to stderr, where `go test` shows them.
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// newTestStore returns a Store on the shared etcd with keys under a prefix of
// its own, removed when the test ends.
func newTestStore(t *testing.T, cfg StoreConfig) *Store {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	s := NewStore(shared.Client(), cfg)
	s.prefix = "/dsec-test/" + strings.ReplaceAll(t.Name(), "/", "_") + KeyPrefix
	cleanPrefix(t, s.prefix)
	return s
}

// cleanPrefix deletes everything under prefix now and when t ends.
func cleanPrefix(t *testing.T, prefix string) {
	t.Helper()
	del := func() {
		if _, err := shared.Client().Delete(context.Background(), prefix, clientv3.WithPrefix()); err != nil {
			t.Errorf("delete %s: %v", prefix, err)
		}
	}
	del()
	t.Cleanup(del)
}

// fakeClock is a settable Store clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
