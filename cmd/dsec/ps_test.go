package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// listAPI answers List with its sandboxes.
type listAPI struct {
	*fakeAPI
	sbs []*sandboxv1.Sandbox
}

func (a listAPI) List(context.Context, *connect.Request[sandboxv1.ListRequest]) (*connect.Response[sandboxv1.ListResponse], error) {
	return connect.NewResponse(&sandboxv1.ListResponse{Sandboxes: a.sbs}), nil
}

func TestPsTTLLeftAndJSON(t *testing.T) {
	now := time.Now()
	hard := &sandboxv1.Sandbox{Id: "node1-aaaaaaaaaaaa", Image: "base", State: sandboxv1.State_STATE_RUNNING,
		CreatedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(30 * time.Minute)),
		IdleTtl: durationpb.New(time.Hour), IdleExpiresAt: timestamppb.New(now.Add(time.Hour))}
	idle := &sandboxv1.Sandbox{Id: "node1-bbbbbbbbbbbb", Image: "base", State: sandboxv1.State_STATE_RUNNING,
		CreatedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(time.Hour)),
		IdleTtl: durationpb.New(900 * time.Second), IdleExpiresAt: timestamppb.New(now.Add(42500 * time.Millisecond))}
	streaming := &sandboxv1.Sandbox{Id: "node1-cccccccccccc", Image: "base", State: sandboxv1.State_STATE_RUNNING,
		CreatedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(50 * time.Minute)), IdleTtl: durationpb.New(time.Second)}
	addr := startFakeHandler(t, listAPI{newFakeAPI(), []*sandboxv1.Sandbox{hard, idle, streaming}})

	out, errOut, code := dsecRun(t, addr, "", "ps")
	if code != 0 {
		t.Fatalf("ps exits %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("ps printed:\n%s\nwant a header and 3 lines", out)
	}
	for i, want := range []string{" 29m ", " 42s idle ", " 49m "} {
		if !strings.Contains(lines[i+1], want) || (i != 1 && strings.Contains(lines[i+1], "idle")) {
			t.Errorf("ps line %q, want TTL LEFT %q", lines[i+1], strings.TrimSpace(want))
		}
	}

	out, errOut, code = dsecRun(t, addr, "", "ps", "-o", "json")
	if code != 0 {
		t.Fatalf("ps -o json exits %d: %s", code, errOut)
	}
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 3 {
		t.Fatalf("ps -o json = %s, %v; want 3 objects", out, err)
	}
	sb := got[1]
	created, err := time.Parse(time.RFC3339, fmtString(sb["createdAt"]))
	if sb["id"] != idle.Id || sb["idleTtl"] != "900s" || sb["state"] != "STATE_RUNNING" || err != nil || !created.Equal(now) {
		t.Errorf("ps -o json sandbox = %v, want the API's names, idleTtl \"900s\", RFC 3339 times", sb)
	}
	for k := range sb {
		if strings.ToLower(k[:1]) != k[:1] || strings.Contains(k, "_") {
			t.Errorf("ps -o json has field %q, want the API's lowerCamelCase names", k)
		}
	}
	if _, ok := sb["IdleTTL"]; ok {
		t.Errorf("ps -o json has Go field names: %v", sb)
	}
}

func fmtString(v any) string {
	s, _ := v.(string)
	return s
}

func TestFsLsJSON(t *testing.T) {
	addr := startFake(t, newFakeAPI())
	out, errOut, code := dsecRun(t, addr, "", "fs", "ls", "-o", "json", sbID+":/w")
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 || len(got) != 2 {
		t.Fatalf("fs ls -o json = %q, %q, exit %d, %v", out, errOut, code, err)
	}
	want := map[string]any{"path": "/w/z", "name": "z", "type": "file", "mode": float64(0o644), "size": "12", "modTime": "2026-01-02T03:04:05Z"}
	for k, v := range want {
		if got[1][k] != v {
			t.Errorf("fs ls -o json %s = %v, want %v (the API's FileInfo)", k, got[1][k], v)
		}
	}
	if _, ok := got[0]["ModTime"]; ok {
		t.Errorf("fs ls -o json has Go field names: %v", got[0])
	}
}

// TestImageJSON checks image inspect's and image du's JSON: the API's names
// and RFC 3339 times, never Go's.
func TestImageJSON(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d := &dsec.ImageDetails{
		Image:  &dsec.Image{Name: "base/py:3", Layers: []dsec.Layer{{Digest: "sha256:ab", Size: 10}}, CreatedAt: created, Config: dsec.ImageConfig{Workdir: "/w"}},
		Layers: []dsec.LayerUsage{{Layer: dsec.Layer{Digest: "sha256:ab", Size: 10}, CreatedAt: created, Images: []string{"base/py:3"}}},
	}
	var b strings.Builder
	if err := encodeProto(&b, inspectProto(d)); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(b.String()), &got); err != nil {
		t.Fatal(err)
	}
	im, _ := got["image"].(map[string]any)
	layers, _ := got["layers"].([]any)
	if im == nil || im["name"] != "base/py:3" || im["createdAt"] != "2026-01-02T03:04:05Z" || len(layers) != 1 ||
		im["config"].(map[string]any)["workdir"] != "/w" || strings.Contains(b.String(), "CreatedAt") {
		t.Errorf("image inspect -o json = %s, want the API's InspectImageResponse", b.String())
	}
	b.Reset()
	if err := encodeProto(&b, diskUsageProto(&dsec.DiskUsage{LayerCount: 3, Images: 2})); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); !strings.Contains(s, `"layerCount": "3"`) || !strings.Contains(s, `"imageCount": "2"`) {
		t.Errorf("image du -o json = %s, want the API's DiskUsageResponse", s)
	}
}

// TestPackJSON checks pack's JSON: the API's names, durations as strings.
func TestPackJSON(t *testing.T) {
	var b strings.Builder
	if err := encodeProto(&b, packProto(&dsec.Pack{Image: "x:1", LayerDigest: "sha256:ab", Files: 3, Frozen: 250 * time.Millisecond, Duration: 2 * time.Second})); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for _, want := range []string{`"layerDigest": "sha256:ab"`, `"frozen": "0.250s"`, `"duration": "2s"`, `"files": "3"`} {
		if !strings.Contains(s, want) {
			t.Errorf("pack -o json = %s, want %s", s, want)
		}
	}
}
