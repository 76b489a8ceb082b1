package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func digestOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

var created = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func putLayers(t *testing.T, s *Store, names ...string) []string {
	t.Helper()
	var digests []string
	for _, n := range names {
		l := Layer{Digest: digestOf(n), Size: int64(len(n)), MediaType: "application/vnd.dsec.erofs", CreatedAt: created}
		if err := s.PutLayer(testCtx(t), l); err != nil {
			t.Fatalf("PutLayer(%s) = %v", n, err)
		}
		digests = append(digests, l.Digest)
	}
	return digests
}

func TestLayers(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	clock := &fakeClock{t: created}
	s.now = clock.now
	l := Layer{Digest: digestOf("base"), Size: 4, MediaType: "application/vnd.dsec.erofs"}
	if err := s.PutLayer(ctx, l); err != nil {
		t.Fatalf("PutLayer = %v", err)
	}
	want := l
	want.CreatedAt = created

	// Again, later: a no-op that keeps the first record.
	clock.advance(time.Hour)
	if err := s.PutLayer(ctx, l); err != nil {
		t.Errorf("PutLayer again = %v, want nil", err)
	}
	got, err := s.GetLayer(ctx, l.Digest)
	if err != nil || !cmp.Equal(got, want) {
		t.Errorf("GetLayer = %+v, %v, want %+v", got, err, want)
	}
	other := l
	other.Size = 5
	if err := s.PutLayer(ctx, other); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("PutLayer(same digest, other size) = %v, want FailedPrecondition", err)
	}
	if _, err := s.GetLayer(ctx, digestOf("nothing")); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetLayer(unknown) = %v, want NotFound", err)
	}
	for _, d := range []string{"", "sha256:abc", "SHA256:" + strings.Repeat("a", 64), "md5:" + strings.Repeat("a", 32)} {
		if err := s.PutLayer(ctx, Layer{Digest: d}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("PutLayer(%q) = %v, want InvalidArgument", d, err)
		}
	}
	all, err := s.ListLayers(ctx)
	if err != nil || !cmp.Equal(all, []Layer{want}) {
		t.Errorf("ListLayers() = %+v, %v, want [%+v]", all, err, want)
	}
}

func TestPutImageMissingLayer(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	present := putLayers(t, s, "base")
	missing := digestOf("missing")
	img := Image{Name: "app", Tag: "v1", Layers: []string{present[0], missing}}

	err := s.PutImage(ctx, img)
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("PutImage(missing layer) = %v, want FailedPrecondition naming %s", err, missing)
	}
	resp, err := shared.Client().Get(ctx, s.imagesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Errorf("image keys after failed PutImage: %v, %v, want none", resp.Count, err)
	}
	if _, err := s.GetImage(ctx, img.Ref()); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetImage after failed PutImage = %v, want NotFound", err)
	}
}

func TestImages(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	layers := putLayers(t, s, "base", "tools", "task")
	imgs := []Image{
		{Name: "python", Tag: "3.12", Layers: layers[:1], CreatedAt: created, Project: "default"},
		{Name: "python", Tag: "latest", Layers: layers[:2], CreatedAt: created, Project: "team", Public: true, Config: ImageConfig{
			Env: []string{"PATH=/usr/bin:/bin", "EMPTY="}, Workdir: "/work", User: "1000:1000",
			Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"python3"},
		}},
		{Name: "python-slim", Tag: "latest", Layers: layers, CreatedAt: created, Project: "default"},
		{Name: "localhost:5000/team/swe__task", Tag: "v1", Layers: layers[2:], CreatedAt: created, Project: "default"},
	}
	for _, img := range imgs {
		if err := s.PutImage(ctx, img); err != nil {
			t.Fatalf("PutImage(%s) = %v", img.Ref(), err)
		}
	}
	got, err := s.ListImages(ctx)
	if err != nil {
		t.Fatalf("ListImages() = %v", err)
	}
	// By name, then tag: "python" before "python-slim" though its key sorts after.
	want := []Image{imgs[3], imgs[0], imgs[1], imgs[2]}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ListImages() mismatch (-want +got):\n%s", diff)
	}
	one, err := s.GetImage(ctx, Ref{Name: "python", Tag: "latest"})
	if err != nil || !cmp.Equal(one, imgs[1]) {
		t.Errorf("GetImage(python:latest) = %+v, %v, want %+v", one, err, imgs[1])
	}

	// Replacing a tag is allowed.
	moved := imgs[1]
	moved.Layers = layers
	if err := s.PutImage(ctx, moved); err != nil {
		t.Fatalf("PutImage(replace python:latest) = %v", err)
	}
	if one, err := s.GetImage(ctx, moved.Ref()); err != nil || !cmp.Equal(one.Layers, layers) {
		t.Errorf("GetImage(python:latest) after replace = %v, %v, want layers %v", one.Layers, err, layers)
	}

	if _, err := s.DeleteImage(ctx, moved.Ref(), adminP); err != nil {
		t.Fatalf("DeleteImage(python:latest) = %v", err)
	}
	_, err = s.GetImage(ctx, moved.Ref())
	if !errdefs.Is(err, errdefs.ErrNotFound) ||
		err.Error() != "image python:latest not found: build it with `dsec image build` or list images with `dsec image ls`" {
		t.Errorf("GetImage(deleted) = %v, want NotFound telling what to do", err)
	}
	if _, err := s.DeleteImage(ctx, moved.Ref(), adminP); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteImage(deleted) = %v, want NotFound", err)
	}
	// Layers outlive the images that use them.
	if ls, err := s.ListLayers(ctx); err != nil || len(ls) != 3 {
		t.Errorf("ListLayers() after DeleteImage = %d layers, %v, want 3", len(ls), err)
	}
}

func TestPutImageInvalid(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, StoreConfig{})
	layers := putLayers(t, s, "base")
	many := make([]string, MaxImageLayers+1)
	for i := range many {
		many[i] = digestOf(strings.Repeat("x", i))
	}
	tests := []struct {
		name string
		img  Image
	}{
		{"bad name", Image{Name: "App", Tag: "v1", Layers: layers}},
		{"empty tag", Image{Name: "app", Layers: layers}},
		{"no layers", Image{Name: "app", Tag: "v1"}},
		{"bad digest", Image{Name: "app", Tag: "v1", Layers: []string{"sha256:1"}}},
		{"layer twice", Image{Name: "app", Tag: "v1", Layers: []string{layers[0], layers[0]}}},
		{"too many layers", Image{Name: "app", Tag: "v1", Layers: many}},
		{"bad env", Image{Name: "app", Tag: "v1", Layers: layers, Config: ImageConfig{Env: []string{"NOEQUALS"}}}},
		{"relative workdir", Image{Name: "app", Tag: "v1", Layers: layers, Config: ImageConfig{Workdir: "work"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.PutImage(testCtx(t), tt.img); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("PutImage(%+v) = %v, want InvalidArgument", tt.img, err)
			}
		})
	}
}

// TestKeyLayout checks the documented layout: keys under /dsec/v1/, values
// JSON with a version field; and that a newer version is refused.
func TestKeyLayout(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := NewStore(shared.Client(), StoreConfig{})
	cleanPrefix(t, KeyPrefix)
	layers := putLayers(t, s, "base")
	if err := s.PutImage(ctx, Image{Name: "app", Tag: "v1", Layers: layers, CreatedAt: created}); err != nil {
		t.Fatal(err)
	}
	resp, err := shared.Client().Get(ctx, KeyPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	want := map[string]string{
		"/dsec/v1/layers/" + layers[0]: `{"version":1,"digest":"` + layers[0] + `","size":4,"media_type":"application/vnd.dsec.erofs","created_at":"2026-03-04T05:06:07Z"}`,
		"/dsec/v1/images/app:v1":       `{"version":1,"name":"app","tag":"v1","layers":["` + layers[0] + `"],"created_at":"2026-03-04T05:06:07Z","project":"default"}`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stored keys and values mismatch (-want +got):\n%s", diff)
	}

	newer := strings.Replace(want["/dsec/v1/images/app:v1"], `"version":1`, `"version":2`, 1)
	if _, err := shared.Client().Put(ctx, "/dsec/v1/images/app:v1", newer); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetImage(ctx, Ref{Name: "app", Tag: "v1"}); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("GetImage(value of schema version 2) = %v, want FailedPrecondition", err)
	}
	if _, err := shared.Client().Put(ctx, "/dsec/v1/images/app:v1", `{"name":"app"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ListImages(ctx); !errdefs.Is(err, errdefs.ErrInternal) {
		t.Errorf("ListImages(value without version) = %v, want Internal", err)
	}
}

func TestPutImageMaxLayers(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, StoreConfig{})
	names := make([]string, MaxImageLayers)
	for i := range names {
		names[i] = strings.Repeat("l", i+1)
	}
	layers := putLayers(t, s, names...)
	img := Image{Name: "tall", Tag: "v1", Layers: layers}
	if err := s.PutImage(testCtx(t), img); err != nil {
		t.Fatalf("PutImage(%d layers) = %v", len(layers), err)
	}
	img.Layers = append(slices.Clone(layers[:MaxImageLayers-1]), digestOf("missing"))
	if err := s.PutImage(testCtx(t), img); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("PutImage(%d layers, last missing) = %v, want FailedPrecondition", len(img.Layers), err)
	}
}
