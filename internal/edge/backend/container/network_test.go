package container

import (
	"encoding/json"
	"errors"
	"io"
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

// fakeKeeper serves the version and network endpoints of a keeper of the
// given protocol on dir's socket and counts the network calls it gets.
func fakeKeeper(t *testing.T, dir string, protocol int, calls *atomic.Int32, got *atomic.Value) {
	t.Helper()
	l := keeper.Layout{StateDir: dir}
	if err := os.MkdirAll(filepath.Dir(l.Socket()), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", l.Socket())
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(keeper.Version{Protocol: protocol, MinProtocol: 2, Pid: 42})
	})
	mux.HandleFunc("/v1/network", func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		if len(body) > 0 {
			var req keeper.NetworkRequest
			_ = json.Unmarshal(body, &req)
			got.Store(r.URL.Query().Get("sandbox") + " " + string(req.Policy))
		}
		_ = json.NewEncoder(w).Encode(keeper.NetworkInfo{
			Policy: json.RawMessage(`{"version":1,"mode":"rules","rules":[{"action":"allow","service":"pypi"}]}`), Address: "100.64.0.1", Router: "100.64.0.0",
			BytesOut: 10, Denied: 1, Denials: []keeper.Denial{{Dest: "registry.npmjs.org", Reason: "denied by rule 2 (deny npm)"}},
		})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// TestNetworkNeedsProtocol5: a keeper older than protocol 5 has no
// /v1/network (it would answer 404, read as a missing sandbox), so network
// calls are refused before they reach it, with what to do; a protocol 5
// keeper gets the policy as given and its reply is passed on.
func TestNetworkNeedsProtocol5(t *testing.T) {
	policy := []byte(`{"version":1,"mode":"rules","rules":[{"action":"allow","service":"pypi"}]}`)
	t.Run("protocol 4", func(t *testing.T) {
		dir := t.TempDir()
		var calls atomic.Int32
		var got atomic.Value
		fakeKeeper(t, dir, 4, &calls, &got)
		b := &Backend{keeper: keeper.NewClient(dir)}
		t.Cleanup(b.keeper.Close)
		_, err := b.SetNetwork(t.Context(), "sb1", policy)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "protocol 4") || !strings.Contains(err.Error(), "restart dsec up") {
			t.Errorf("SetNetwork against a protocol 4 keeper = %v, want FailedPrecondition naming its protocol and what to do", err)
		}
		if _, err := b.Network(t.Context(), "sb1"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Network against a protocol 4 keeper = %v, want FailedPrecondition", err)
		}
		if n := calls.Load(); n != 0 {
			t.Errorf("the protocol 4 keeper got %d network calls, want 0", n)
		}
	})
	t.Run("protocol 5", func(t *testing.T) {
		dir := t.TempDir()
		var calls atomic.Int32
		var got atomic.Value
		fakeKeeper(t, dir, 5, &calls, &got)
		b := &Backend{keeper: keeper.NewClient(dir)}
		t.Cleanup(b.keeper.Close)
		info, err := b.SetNetwork(t.Context(), "sb1", policy)
		if err != nil {
			t.Fatalf("SetNetwork = %v", err)
		}
		if s, _ := got.Load().(string); s != "sb1 "+string(policy) {
			t.Errorf("the keeper got %q, want the sandbox and the policy as given", s)
		}
		if info.Address != "100.64.0.1" || info.Router != "100.64.0.0" || info.BytesOut != 10 || len(info.Denials) != 1 || info.Denials[0].Reason != "denied by rule 2 (deny npm)" {
			t.Errorf("SetNetwork = %+v, want the keeper's reply", info)
		}
		if _, err := b.Network(t.Context(), "sb1"); err != nil {
			t.Errorf("Network = %v", err)
		}
		if n := calls.Load(); n != 2 {
			t.Errorf("the keeper got %d network calls, want 2", n)
		}
		if !sandbox.Has(b, sandbox.CapNetworkPolicy) || sandbox.Has(b, sandbox.CapNetwork) {
			t.Errorf("the container backend's capabilities are %v, want %s and not %s (it takes no attachment in a Spec)",
				sandbox.Capabilities(b), sandbox.CapNetworkPolicy, sandbox.CapNetwork)
		}
	})
}
