package dsec

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

func TestAuthHeaderAndH2C(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	f.setExec(func(ctx context.Context, send func(*sandboxv1.ExecResponse) error) error {
		return send(exitEvent(0))
	})

	if _, err := c.WhoAmI(ctx); err != nil {
		t.Fatalf("WhoAmI: %v", err)
	}
	if _, err := c.Sandbox("sb-a").Exec(ctx, []string{"true"}); err != nil {
		t.Fatalf("Exec: %v", err)
	}
	got := f.seen()
	want := []seenRequest{
		{procedure: "/dsec.admin.v1.AdminService/WhoAmI", auth: "Bearer " + testKey, userAgent: "sdktest/1 dsec-go", proto: "HTTP/2.0"},
		{procedure: "/dsec.sandbox.v1.SandboxService/Exec", auth: "Bearer " + testKey, userAgent: "sdktest/1 dsec-go", proto: "HTTP/2.0"},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(seenRequest{})); diff != "" {
		t.Errorf("requests seen by the server (-want +got):\n%s", diff)
	}
}

func TestWrongKeyIsUnauthenticated(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, "someone-elses-key")
	_, err := c.WhoAmI(t.Context())
	if !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("WhoAmI with a wrong key = %v, want ErrUnauthenticated", err)
	}
}

func TestMissingKey(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, "")
	ctx := t.Context()
	sb := c.Sandbox("sb-a")
	calls := map[string]func() error{
		"Get":    func() error { _, err := c.Get(ctx, "sb-a"); return err },
		"Exec":   func() error { _, err := sb.Exec(ctx, []string{"true"}); return err },
		"Upload": func() error { return sb.WriteFile(ctx, "/x", []byte("x")) },
		"Read":   func() error { _, err := sb.ReadFile(ctx, "/x"); return err },
		"Layer":  func() error { _, err := c.UploadLayer(ctx, strings.NewReader("x"), "sha256:00", 1); return err },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s without a key = %v, want ErrUnauthenticated", name, err)
			continue
		}
		for _, place := range []string{"--api-key", "DSEC_API_KEY", "config.toml", "admin.key"} {
			if !strings.Contains(err.Error(), place) {
				t.Errorf("%s without a key = %q, want it to name %s", name, err, place)
			}
		}
	}
	if got := f.seen(); len(got) != 0 {
		t.Errorf("server saw %d requests without a key, want none: %+v", len(got), got)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Addr: "127.0.0.1:7420"},
		{Addr: "ftp://host"},
		{Addr: "http://"},
		{APIKey: "two words"},
		{APIKey: "line\nbreak"},
		{UserAgent: "a\r\nX-Evil: 1"},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("New(%+v) = %v, want ErrInvalidArgument", cfg, err)
		}
	}
}

func TestHTTP1WithCallerClient(t *testing.T) {
	f := newFake()
	srv := f.serve(t, serverOpts{http1Only: true})
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	c, err := New(Config{Addr: srv.URL + "/", APIKey: testKey, HTTPClient: hc})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer c.Close()
	f.setExec(func(ctx context.Context, send func(*sandboxv1.ExecResponse) error) error {
		for _, ev := range []*sandboxv1.ExecResponse{startedEvent("e1"), outEvent(sandboxv1.Stream_STREAM_STDOUT, 0, "hi"), exitEvent(0)} {
			if err := send(ev); err != nil {
				return err
			}
		}
		return nil
	})
	res, err := c.Sandbox("sb-a").Exec(t.Context(), []string{"echo", "hi"})
	if err != nil || string(res.Stdout) != "hi" {
		t.Fatalf("Exec over HTTP/1.1 = %+v, %v; want stdout \"hi\"", res, err)
	}
	data := make([]byte, 3*chunkSize+5)
	if err := c.Sandbox("sb-a").WriteFile(t.Context(), "/big", data); err != nil {
		t.Fatalf("WriteFile over HTTP/1.1: %v", err)
	}
	got := f.seen()
	if got[0].proto != "HTTP/1.1" {
		t.Errorf("server saw %s, want HTTP/1.1", got[0].proto)
	}
}

func TestSandboxLifecycle(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()

	sb, err := c.Create(ctx, CreateOptions{
		Image:          "debian:12",
		Labels:         map[string]string{"job": "j1"},
		Env:            map[string]string{"A": "1"},
		Memory:         1 << 30,
		CPUs:           0.5,
		Pids:           100,
		Disk:           2 << 30,
		Workdir:        "/work",
		User:           "1000:1000",
		TTL:            2 * time.Hour,
		IdleTTL:        5 * time.Minute,
		Backend:        "container",
		IdempotencyKey: "k1",
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	wantReq := &sandboxv1.CreateRequest{
		Image:          "debian:12",
		Labels:         map[string]string{"job": "j1"},
		Resources:      &sandboxv1.Resources{MemoryBytes: 1 << 30, Cpus: 0.5, Pids: 100, DiskBytes: 2 << 30},
		Env:            map[string]string{"A": "1"},
		Workdir:        "/work",
		User:           "1000:1000",
		Ttl:            durationpb.New(2 * time.Hour),
		IdleTtl:        durationpb.New(5 * time.Minute),
		Backend:        "container",
		IdempotencyKey: "k1",
	}
	if diff := cmp.Diff(wantReq, f.lastCreate(), protocmp.Transform()); diff != "" {
		t.Errorf("CreateRequest (-want +got):\n%s", diff)
	}
	want := &Sandbox{
		ID:        "sb-a",
		Image:     "debian:12",
		Labels:    map[string]string{"job": "j1"},
		State:     StateRunning,
		Resources: Resources{Memory: 1 << 30, CPUs: 0.5, Pids: 100, Disk: 2 << 30},
		Node:      "node-1",
		Backend:   "container",
		Project:   "default",
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		ExpiresAt: time.Date(2026, 1, 2, 4, 4, 5, 0, time.UTC),
		IdleTTL:   5 * time.Minute,
		User:      "1000:1000",
		Workdir:   "/work",
		Env:       map[string]string{"A": "1"},
	}
	ignoreClient := cmpopts.IgnoreUnexported(Sandbox{})
	if diff := cmp.Diff(want, sb, ignoreClient); diff != "" {
		t.Errorf("Create = (-want +got):\n%s", diff)
	}

	got, err := c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatalf("Get(%q): %v", sb.ID, err)
	}
	if diff := cmp.Diff(want, got, ignoreClient); diff != "" {
		t.Errorf("Get(%q) = (-want +got):\n%s", sb.ID, diff)
	}

	other, err := c.Create(ctx, CreateOptions{Image: "alpine", Labels: map[string]string{"job": "j2"}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if f.lastCreate().GetTtl() != nil || f.lastCreate().GetIdleTtl() != nil {
		t.Errorf("Create without TTLs sent ttl=%v idle_ttl=%v, want both unset", f.lastCreate().GetTtl(), f.lastCreate().GetIdleTtl())
	}
	list, err := c.List(ctx, map[string]string{"job": "j2"})
	if err != nil || len(list) != 1 || list[0].ID != other.ID {
		t.Errorf("List(job=j2) = %v, %v; want [%s]", list, err, other.ID)
	}
	all, err := c.List(ctx, nil)
	if err != nil || len(all) != 2 {
		t.Errorf("List(nil) = %d sandboxes, %v; want 2", len(all), err)
	}

	// Refresh sees a change made on the server.
	f.mu.Lock()
	f.sandboxes[sb.ID].State = sandboxv1.State_STATE_FAILED
	f.sandboxes[sb.ID].Reason = "init died"
	f.mu.Unlock()
	h := c.Sandbox(sb.ID)
	if err := h.Refresh(ctx); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if h.State != StateFailed || h.Reason != "init died" || h.Image != "debian:12" {
		t.Errorf("after Refresh: state %q reason %q image %q, want failed, init died, debian:12", h.State, h.Reason, h.Image)
	}

	if _, err := c.DeleteSelector(ctx, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("DeleteSelector(nil) = %v, want ErrInvalidArgument", err)
	}
	deleted, err := c.DeleteSelector(ctx, map[string]string{"job": "j2"})
	if err != nil || !cmp.Equal(deleted, []string{other.ID}) {
		t.Errorf("DeleteSelector(job=j2) = %v, %v; want [%s]", deleted, err, other.ID)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if sb.State != StateDeleted {
		t.Errorf("State after Delete = %q, want %q", sb.State, StateDeleted)
	}
	if err := sb.Delete(ctx); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Delete = %v, want ErrNotFound", err)
	}
	if _, err := c.Get(ctx, sb.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Delete = %v, want ErrNotFound", err)
	}
	var orphan Sandbox
	if _, err := orphan.Exec(ctx, []string{"true"}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Exec on a Sandbox without client = %v, want ErrInvalidArgument", err)
	}
}

func TestImagesAndKeys(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()

	data := strings.Repeat("e", 3*chunkSize+chunkSize/2)
	layer, err := c.UploadLayer(ctx, strings.NewReader(data), "sha256:abc", int64(len(data)))
	if err != nil {
		t.Fatalf("UploadLayer: %v", err)
	}
	wantLayer := Layer{Digest: "sha256:abc", Size: int64(len(data)), MediaType: "application/vnd.dsec.layer.v1.erofs"}
	if layer != wantLayer {
		t.Errorf("UploadLayer = %+v, want %+v", layer, wantLayer)
	}
	if diff := cmp.Diff([]int{chunkSize, chunkSize, chunkSize, chunkSize / 2}, f.chunks()); diff != "" {
		t.Errorf("layer chunks (-want +got):\n%s", diff)
	}
	if f.lastLayerHeader().GetDigest() != "sha256:abc" || f.lastLayerHeader().GetSize() != int64(len(data)) {
		t.Errorf("layer header = %v", f.lastLayerHeader())
	}

	cfg := ImageConfig{Env: []string{"PATH=/bin"}, Workdir: "/w", User: "u", Entrypoint: []string{"/init"}, Cmd: []string{"sh"}}
	im, err := c.CreateImage(ctx, "py:3", []string{"sha256:abc"}, cfg)
	if err != nil {
		t.Fatalf("CreateImage: %v", err)
	}
	want := &Image{Name: "py:3", Layers: []Layer{wantLayer}, Config: cfg,
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Size: int64(len(data))}
	if diff := cmp.Diff(want, im); diff != "" {
		t.Errorf("CreateImage (-want +got):\n%s", diff)
	}
	if got, err := c.GetImage(ctx, "py:3"); err != nil || !cmp.Equal(want, got) {
		t.Errorf("GetImage = %+v, %v; want %+v", got, err, want)
	}
	if got, err := c.ListImages(ctx); err != nil || !cmp.Equal([]*Image{want}, got) {
		t.Errorf("ListImages = %+v, %v; want [%+v]", got, err, want)
	}
	if _, err := c.CreateImage(ctx, "x", []string{"sha256:missing"}, ImageConfig{}); !errors.Is(err, ErrFailedPrecondition) {
		t.Errorf("CreateImage with a missing layer = %v, want ErrFailedPrecondition", err)
	}
	if _, err := c.UploadLayer(ctx, strings.NewReader("xy"), "sha256:short", 3); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("UploadLayer with a wrong size = %v, want ErrInvalidArgument", err)
	}

	secret, key, err := c.CreateKey(ctx, KeyOptions{Name: "alice", Project: "p1"})
	wantKey := Key{ID: "dsec_new", Name: "alice", Project: "p1", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if err != nil || secret != "dsec_new_secret" || key != wantKey {
		t.Errorf("CreateKey = %q, %+v, %v; want dsec_new_secret, %+v", secret, key, err, wantKey)
	}
	me, err := c.WhoAmI(ctx)
	if err != nil || me.ID != "dsec_test" || !me.Admin {
		t.Errorf("WhoAmI = %+v, %v; want the admin key dsec_test", me, err)
	}
}
