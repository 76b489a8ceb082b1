package container

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// fakeKeeperOf serves a keeper of protocol proto on dir's socket that
// counts the pause and resume calls it gets and answers them as a keeper
// of protocol 6 would.
func fakeKeeperOf(t *testing.T, dir string, proto int) *atomic.Int32 {
	t.Helper()
	l := keeper.Layout{StateDir: dir}
	if err := os.MkdirAll(filepath.Dir(l.Socket()), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", l.Socket())
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(keeper.Version{Protocol: proto, MinProtocol: 2, Pid: 42})
	})
	for _, p := range []string{"POST /v1/sandbox/pause", "POST /v1/sandbox/resume"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			_ = json.NewEncoder(w).Encode(keeper.PauseInfo{Paused: strings.HasSuffix(r.URL.Path, "pause"), Resident: 7, Swapped: 9})
		})
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return &calls
}

// TestPauseNeedsProtocol6: a keeper of protocol 5 has no pause endpoints
// (it would answer 404, read as "no such sandbox"), so pause and resume
// are refused before they reach it, with what to do; a keeper of
// protocol 6 gets them, and its answer is passed on.
func TestPauseNeedsProtocol6(t *testing.T) {
	dir := t.TempDir()
	calls := fakeKeeperOf(t, dir, 5)
	b := &Backend{keeper: keeper.NewClient(dir)}
	t.Cleanup(b.keeper.Close)
	for name, call := range map[string]func() (sandbox.PauseInfo, error){
		"Pause":  func() (sandbox.PauseInfo, error) { return b.Pause(t.Context(), "sb1") },
		"Resume": func() (sandbox.PauseInfo, error) { return b.Resume(t.Context(), "sb1") },
	} {
		if _, err := call(); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "protocol 5") {
			t.Errorf("%s against a protocol 5 keeper = %v, want FailedPrecondition naming its protocol", name, err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the protocol 5 keeper got %d pause calls, want 0", n)
	}
	if !sandbox.Has(b, sandbox.CapPause) {
		t.Errorf("the container backend lacks %s", sandbox.CapPause)
	}

	dir6 := t.TempDir()
	calls = fakeKeeperOf(t, dir6, 6)
	b6 := &Backend{keeper: keeper.NewClient(dir6)}
	t.Cleanup(b6.keeper.Close)
	info, err := b6.Pause(t.Context(), "sb1")
	if err != nil || info != (sandbox.PauseInfo{Resident: 7, Swapped: 9}) {
		t.Errorf("Pause against a protocol 6 keeper = %+v, %v", info, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the protocol 6 keeper got %d pause calls, want 1", n)
	}
}
