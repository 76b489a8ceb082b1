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

// TestSealedExecNeedsProtocol4: a keeper of protocol 3 would ignore
// ExecSpec.Seal and run the command unsealed, so a sealed exec is refused
// before it reaches one, with what to do; an unsealed exec still goes.
func TestSealedExecNeedsProtocol4(t *testing.T) {
	dir := t.TempDir()
	l := keeper.Layout{StateDir: dir}
	if err := os.MkdirAll(filepath.Dir(l.Socket()), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", l.Socket())
	if err != nil {
		t.Fatal(err)
	}
	var execs atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(keeper.Version{Protocol: 3, MinProtocol: 2, Pid: 42})
	})
	mux.HandleFunc("POST /v1/exec/start", func(w http.ResponseWriter, r *http.Request) {
		execs.Add(1)
		_, _ = w.Write([]byte("{}"))
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	b := &Backend{keeper: keeper.NewClient(dir)}
	t.Cleanup(b.keeper.Close)
	err = b.StartExec(t.Context(), "sb1", sandbox.ExecSpec{ID: "x1", Argv: []string{"true"}, Seal: sandbox.SealFreeze})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "protocol 3") {
		t.Errorf("sealed StartExec against a protocol 3 keeper = %v, want FailedPrecondition naming its protocol", err)
	}
	if n := execs.Load(); n != 0 {
		t.Errorf("the protocol 3 keeper got %d exec starts, want 0", n)
	}
	if !sandbox.Has(b, sandbox.CapSealedExec) {
		t.Errorf("Describe().Features = %v, want %s", b.Describe().Features, sandbox.CapSealedExec)
	}
}
