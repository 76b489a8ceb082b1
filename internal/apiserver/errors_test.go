package apiserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// logBuffer collects a logger's entries as JSON objects.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// failures returns the entries of failed calls, values as strings.
func (b *logBuffer) failures(t *testing.T) []map[string]string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]string
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] != "API call failed" {
			continue
		}
		e := map[string]string{}
		for k, v := range m {
			if k != "time" {
				e[k] = fmt.Sprint(v)
			}
		}
		out = append(out, e)
	}
	return out
}

// TestInternalErrorWithheldAndLogged checks what a user and the log see of
// an error of the platform: a broken layer store fails an upload with an OS
// error that names the store's directory. The user gets an id, not the
// path; the log has the full text under that id, once, with the call and
// the caller.
func TestInternalErrorWithheldAndLogged(t *testing.T) {
	t.Parallel()
	buf := &logBuffer{}
	s := newTenancyServerLog(t, 0, slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ctx := t.Context()
	me, err := s.admin.WhoAmI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The store's directory of blobs becomes a file.
	store := filepath.Join(s.blobs, "sha256")
	if err := os.RemoveAll(store); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(store, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	data := "layer data"
	_, err = s.admin.UploadLayer(ctx, strings.NewReader(data), digestOf([]byte(data)), int64(len(data)))
	var de *dsec.Error
	if !errors.As(err, &de) || !errors.Is(err, dsec.ErrInternal) {
		t.Fatalf("UploadLayer into a broken store = %v, want an Internal *dsec.Error", err)
	}
	re := regexp.MustCompile(`^internal error \(id ([0-9a-f]{16})\): UploadLayer failed on the API server; retry, and if it fails again, the API server's log has the details under this id$`)
	m := re.FindStringSubmatch(de.Message)
	if m == nil || strings.Contains(de.Message, s.blobs) {
		t.Fatalf("UploadLayer into a broken store = %q, want it to match %s (and not name %s)", de.Message, re, s.blobs)
	}
	logged := buf.failures(t)
	if len(logged) != 1 {
		t.Fatalf("log has %d failed calls (%v), want 1", len(logged), logged)
	}
	if !strings.Contains(logged[0]["err"], store) {
		t.Errorf("logged error %q does not name %s", logged[0]["err"], store)
	}
	delete(logged[0], "err")
	want := map[string]string{
		"level": "ERROR", "msg": "API call failed", "id": m[1], "code": "internal",
		"procedure": "/dsec.image.v1.ImageService/UploadLayer", "project": me.Project, "key": me.ID,
	}
	if diff := cmp.Diff(want, logged[0]); diff != "" {
		t.Errorf("log of the failed upload (-want +got):\n%s", diff)
	}
}

// TestUserErrorsKeepTheirText checks that errors written for the user
// reach them as written, and are logged at Debug only.
func TestUserErrorsKeepTheirText(t *testing.T) {
	t.Parallel()
	buf := &logBuffer{}
	s := newTenancyServerLog(t, 0, slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ctx := t.Context()
	me, err := s.admin.WhoAmI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.admin.Get(ctx, "NOT-AN-ID")
	var de *dsec.Error
	want := "\"NOT-AN-ID\" is not a sandbox ID (list sandboxes with `dsec ps`)"
	if !errors.As(err, &de) || !errors.Is(err, dsec.ErrInvalidArgument) || de.Message != want {
		t.Fatalf("Get(NOT-AN-ID) = %v, want InvalidArgument %q", err, want)
	}
	nokey, err := dsec.New(dsec.Config{Addr: s.addr, APIKey: "dsec_wrong"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nokey.Close() })
	_, authErr := nokey.WhoAmI(ctx)
	if !errors.Is(authErr, dsec.ErrUnauthenticated) {
		t.Fatalf("WhoAmI with a wrong key = %v, want Unauthenticated", authErr)
	}
	wantLog := []map[string]string{{
		"level": "DEBUG", "msg": "API call failed", "code": "invalid_argument",
		"procedure": "/dsec.sandbox.v1.SandboxService/Get", "project": me.Project, "key": me.ID, "sandbox": "NOT-AN-ID", "err": want,
	}, {
		"level": "DEBUG", "msg": "API call failed", "code": "unauthenticated",
		"procedure": "/dsec.admin.v1.AdminService/WhoAmI", "err": authErr.(*dsec.Error).Message,
	}}
	if diff := cmp.Diff(wantLog, buf.failures(t)); diff != "" {
		t.Errorf("log (-want +got):\n%s", diff)
	}
}

// TestUnreachableNodeHidesItsAddress checks that a node the API server
// cannot reach is named, not its socket, which goes to the log.
func TestUnreachableNodeHidesItsAddress(t *testing.T) {
	t.Parallel()
	buf := &logBuffer{}
	s := newTenancyServerLog(t, 0, slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	ctx := t.Context()
	sock := filepath.Join(t.TempDir(), "gone", "edge.sock")
	reg, err := s.store.RegisterNode(ctx, cluster.Node{Name: "n2", Addr: "unix://" + sock, Backends: []string{"container"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })

	_, err = s.admin.Get(ctx, "n2-"+fakeID(1))
	var de *dsec.Error
	re := regexp.MustCompile(`^node n2 is unreachable: retry, or check ` + "`dsec up`" + ` on it \(the API server's log has the details under id ([0-9a-f]{16})\)$`)
	if !errors.As(err, &de) || !errors.Is(err, dsec.ErrUnavailable) {
		t.Fatalf("Get on an unreachable node = %v, want Unavailable", err)
	}
	m := re.FindStringSubmatch(de.Message)
	if m == nil {
		t.Fatalf("Get on an unreachable node = %q, want it to match %s", de.Message, re)
	}
	logged := buf.failures(t)
	if len(logged) != 1 || logged[0]["id"] != m[1] || logged[0]["level"] != "WARN" || !strings.Contains(logged[0]["detail"], sock) {
		t.Errorf("log = %v, want one Warn entry with id %s and a detail naming %s", logged, m[1], sock)
	}
}
