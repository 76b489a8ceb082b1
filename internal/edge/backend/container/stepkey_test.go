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

// TestStepKeyNeedsProtocol6: a keeper of protocol 5 would ignore
// ExecSpec.StepKey (the step would run again, unrecorded), so an exec
// with a step key is refused before it reaches one, saying what to do;
// from protocol 6 the key goes on the wire.
func TestStepKeyNeedsProtocol6(t *testing.T) {
	for _, proto := range []int{5, 6} {
		dir := t.TempDir()
		l := keeper.Layout{StateDir: dir}
		if err := os.MkdirAll(filepath.Dir(l.Socket()), 0o700); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("unix", l.Socket())
		if err != nil {
			t.Fatal(err)
		}
		var starts atomic.Int32
		var got atomic.Value
		mux := http.NewServeMux()
		mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewEncoder(w).Encode(keeper.Version{Protocol: proto, MinProtocol: 2, Pid: 42})
		})
		mux.HandleFunc("POST /v1/exec/start", func(w http.ResponseWriter, r *http.Request) {
			starts.Add(1)
			var req keeper.ExecRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			got.Store(req.Spec.StepKey)
			_, _ = w.Write([]byte("{}"))
		})
		srv := &http.Server{Handler: mux}
		go srv.Serve(ln)

		b := &Backend{keeper: keeper.NewClient(dir)}
		err = b.StartExec(t.Context(), "sb1", sandbox.ExecSpec{ID: "x1", Argv: []string{"true"}, StepKey: "step-1"})
		switch proto {
		case 5:
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "protocol 5") || !strings.Contains(err.Error(), "without a step key") {
				t.Errorf("StartExec(step key) against a protocol 5 keeper = %v, want FailedPrecondition naming its protocol and what to do", err)
			}
			if n := starts.Load(); n != 0 {
				t.Errorf("the protocol 5 keeper got %d exec starts, want 0", n)
			}
			// Without a step key the exec goes.
			if err := b.StartExec(t.Context(), "sb1", sandbox.ExecSpec{ID: "x2", Argv: []string{"true"}}); err != nil || starts.Load() != 1 {
				t.Errorf("StartExec(no step key) against a protocol 5 keeper = %v with %d starts, want it sent", err, starts.Load())
			}
		case 6:
			if err != nil || got.Load() != "step-1" {
				t.Errorf("StartExec(step key) against a protocol 6 keeper = %v, the keeper got step key %v; want step-1 sent", err, got.Load())
			}
		}
		b.keeper.Close()
		srv.Close()
	}
	if !sandbox.Has(&Backend{}, sandbox.CapStepKeys) {
		t.Errorf("Describe().Features = %v, want %s", (&Backend{}).Describe().Features, sandbox.CapStepKeys)
	}
}
