package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

// lockedBuffer is a log's output.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// failures returns the log's entries of failed calls.
func (b *lockedBuffer) failures(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(b.buf.String(), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "API call failed" {
			out = append(out, m)
		}
	}
	return out
}

// TestAPIErrors calls an edge's API as the control plane does, on a node
// whose backend fails creates with an OS error naming a host path: the
// caller gets an id and no path, in the reply and in the events; the
// node's log has the full text under that id with the call and the
// caller. An error written for users keeps its text.
func TestAPIErrors(t *testing.T) {
	node := sandboxtest.NewFakeNode()
	const hostDir = "/var/lib/dsec/sandboxes"
	node.CreateErr = func(spec sandbox.Spec) error {
		return fmt.Errorf("start: %w", &fs.PathError{Op: "mkdir", Path: hostDir + "/" + spec.ID + "/upper", Err: syscall.EACCES})
	}
	buf := &lockedBuffer{}
	e, err := New(context.Background(), Config{
		Node: "n", StateDir: t.TempDir(),
		Backends: map[string]sandbox.Backend{"fake": node.Open()},
		Images:   fakeImages{}, MemoryBytes: 1 << 30, MemoryOvercommit: 1, MemoryReserve: 1, CPUs: 2,
		Defaults:    Defaults{MemoryBytes: 64 * testMiB, DiskBytes: 16 * testMiB},
		OutputQuota: 16 * testMiB, StateSync: -1,
		Logger: slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.diskSpace = func() (ceiling.Space, error) { return ceiling.Space{Free: 1 << 40, Size: 1 << 41}, nil }
	w := e.events.subscribe(Caller{Admin: true}, nil)
	defer e.events.unsubscribe(w)
	srv := httptest.NewServer(e.Handler("token"))
	defer srv.Close()
	client := sandboxv1connect.NewSandboxServiceClient(srv.Client(), srv.URL)
	create := func(image string) error {
		req := connect.NewRequest(&sandboxv1.CreateRequest{Image: image})
		req.Header().Set(caller.HeaderNodeToken, "token")
		req.Header().Set(caller.HeaderProject, "p1")
		req.Header().Set(caller.HeaderKeyID, "k1")
		_, err := client.Create(t.Context(), req)
		return err
	}

	err = create("busybox")
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeInternal {
		t.Fatalf("Create on a failing node = %v, want Internal", err)
	}
	re := regexp.MustCompile(`^internal error \(id ([0-9a-f]{16})\): Create failed on node n; retry, and if it fails again, node n's log has the details under this id$`)
	m := re.FindStringSubmatch(ce.Message())
	if m == nil {
		t.Fatalf("Create on a failing node = %q, want it to match %s", ce.Message(), re)
	}
	var logged map[string]any
	for _, l := range buf.failures(t) {
		if l["id"] == m[1] {
			logged = l
		}
	}
	if logged == nil || logged["level"] != "ERROR" || logged["procedure"] != sandboxv1connect.SandboxServiceCreateProcedure ||
		logged["project"] != "p1" || logged["key"] != "k1" || !strings.Contains(fmt.Sprint(logged["err"]), hostDir) {
		t.Errorf("log of the failed create = %v, want an Error entry with id %s, the procedure, project p1, key k1 and the full text", logged, m[1])
	}
	for done := false; !done; {
		select {
		case ev := <-w.ch:
			if strings.Contains(ev.Reason, hostDir) || strings.Contains(ev.Record.Reason, hostDir) {
				t.Errorf("event %s of the failed create: reason %q, record's %q, want no host path", ev.Type, ev.Reason, ev.Record.Reason)
			}
		case <-time.After(200 * time.Millisecond):
			done = true
		}
	}

	err = create("missing")
	if !errors.As(err, &ce) || ce.Code() != connect.CodeNotFound || ce.Message() != "image missing not found" {
		t.Errorf("Create(missing) = %v, want NotFound %q", err, "image missing not found")
	}
}
