package apiserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
	"github.com/dsecproject/dsec/api/dsec/image/v1/imagev1connect"
	"github.com/dsecproject/dsec/internal/blobstore"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/edgeclient"
	"github.com/dsecproject/dsec/internal/watcher"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// layerUseEdge is an edge that reports the layer use it is told to.
type layerUseEdge struct {
	mu sync.Mutex
	// guarded by mu
	sandboxes []*imagev1.SandboxLayers
}

func (e *layerUseEdge) ListLayerUse(context.Context, *connect.Request[imagev1.ListLayerUseRequest]) (*connect.Response[imagev1.ListLayerUseResponse], error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return connect.NewResponse(&imagev1.ListLayerUseResponse{Sandboxes: e.sandboxes}), nil
}

func (e *layerUseEdge) set(sbs ...*imagev1.SandboxLayers) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sandboxes = sbs
}

// imageServer is an API server with its own etcd and blob store, and one
// node whose edge reports layer use.
type imageServer struct {
	c     *dsec.Client
	store *cluster.Store
	blobs string // the blob store's sha256 directory
	edge  *layerUseEdge
	dir   string
}

func newImageServer(t *testing.T) *imageServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dir, err := os.MkdirTemp("", "dsec-images-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	etcd, err := cluster.StartEmbedded(ctx, cluster.EmbedConfig{Dir: filepath.Join(dir, "etcd"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	store := cluster.NewStore(etcd.Client(), cluster.StoreConfig{Logger: log})
	key, err := store.EnsureAdminKey(ctx, filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := blobstore.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	fe := &layerUseEdge{}
	edgeSock := filepath.Join(dir, "edge.sock")
	edgeLn, err := net.Listen("unix", edgeSock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(imagev1connect.NewLayerUseServiceHandler(fe))
	serve(t, &http.Server{Handler: mux, Protocols: &protos}, edgeLn)
	reg, err := store.RegisterNode(ctx, cluster.Node{Name: "n1", Addr: "unix://" + edgeSock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	pool := edgeclient.NewPool("token")
	t.Cleanup(pool.Close)
	w := watcher.New(ctx, watcher.Config{Nodes: store, Pool: pool, Logger: log})
	t.Cleanup(w.Close)
	api := New(Config{Cluster: store, Blobs: blobs, Watcher: w, Pool: pool, Logger: log})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, &http.Server{Handler: api.Handler(), Protocols: &protos}, ln)
	c, err := dsec.New(dsec.Config{Addr: "http://" + ln.Addr().String(), APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &imageServer{c: c, store: store, blobs: filepath.Join(dir, "blobs", "sha256"), edge: fe, dir: dir}
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// layer uploads data as a layer and returns its digest.
func (s *imageServer) layer(t *testing.T, data string) string {
	t.Helper()
	d := digestOf([]byte(data))
	if _, err := s.c.UploadLayer(t.Context(), strings.NewReader(data), d, int64(len(data))); err != nil {
		t.Fatalf("UploadLayer = %v", err)
	}
	return d
}

func (s *imageServer) image(t *testing.T, name string, layers ...string) {
	t.Helper()
	if _, err := s.c.CreateImage(t.Context(), name, layers, dsec.ImageConfig{Env: []string{"A=1"}, Workdir: "/w"}); err != nil {
		t.Fatalf("CreateImage(%s) = %v", name, err)
	}
}

func (s *imageServer) hasBlob(d string) bool {
	_, err := os.Stat(filepath.Join(s.blobs, strings.TrimPrefix(d, "sha256:")))
	return err == nil
}

func removedDigests(r *dsec.GCResult) []string {
	var out []string
	for _, l := range r.Removed {
		out = append(out, l.Digest)
	}
	return out
}

func TestImageHousekeepingAPI(t *testing.T) {
	t.Parallel()
	s := newImageServer(t)
	ctx := t.Context()
	base := s.layer(t, "base layer bytes")
	ws := s.layer(t, "workspace layer")
	tk := s.layer(t, "toolkit")
	orphan := s.layer(t, "nobody names me")
	s.image(t, "base/py310:3", base)
	s.image(t, "ws/sphinx-9658:1", base, ws)
	s.image(t, "tk/harness:12", base, tk)
	// A sandbox of project p1 runs from ws/sphinx-9658:1.
	s.edge.set(&imagev1.SandboxLayers{SandboxId: "sb-1", Project: "p1", LayerDigests: []string{base, ws}})

	du, err := s.c.DiskUsage(ctx)
	if err != nil {
		t.Fatalf("DiskUsage() = %v", err)
	}
	size := func(ds ...string) int64 {
		var n int64
		for _, l := range du.Layers {
			for _, d := range ds {
				if l.Digest == d {
					n += l.Size
				}
			}
		}
		return n
	}
	got := [][2]int64{
		{du.LayerCount, du.TotalBytes}, {du.SharedCount, du.SharedBytes}, {du.UniqueCount, du.UniqueBytes},
		{du.UnreferencedInUseCount, du.UnreferencedInUseBytes}, {du.ReclaimableCount, du.ReclaimableBytes},
		{du.Images, du.Sandboxes},
	}
	want := [][2]int64{
		{4, size(base, ws, tk, orphan)}, {1, size(base)}, {2, size(ws, tk)}, {0, 0}, {1, size(orphan)}, {3, 1},
	}
	if !cmp.Equal(got, want) {
		t.Errorf("DiskUsage() counts and bytes = %v, want %v", got, want)
	}

	d, err := s.c.InspectImage(ctx, "ws/sphinx-9658:1")
	if err != nil {
		t.Fatalf("InspectImage() = %v", err)
	}
	if len(d.Layers) != 2 || d.Layers[0].Digest != base || d.Layers[1].Digest != ws ||
		!cmp.Equal(d.Layers[0].Images, []string{"base/py310:3", "tk/harness:12", "ws/sphinx-9658:1"}) {
		t.Errorf("InspectImage().Layers = %+v, want base (in three images), then ws", d.Layers)
	}
	// The admin key sees the sandbox using the layer.
	if !cmp.Equal(d.Layers[1].Sandboxes, []string{"sb-1"}) {
		t.Errorf("InspectImage().Layers[1].Sandboxes = %v, want [sb-1]", d.Layers[1].Sandboxes)
	}
	if _, err := s.c.InspectImage(ctx, "Ws/Bad"); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("InspectImage(Ws/Bad) = %v, want InvalidArgument", err)
	}

	// Remove the image the sandbox runs from: its layer ws stays, and GC
	// keeps it while the sandbox uses it.
	if _, err := s.c.DeleteImage(ctx, "ws/sphinx-9658:1"); err != nil {
		t.Fatalf("DeleteImage() = %v", err)
	}
	if _, err := s.c.DeleteImage(ctx, "ws/sphinx-9658:1"); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("DeleteImage(again) = %v, want NotFound", err)
	}
	zero := time.Duration(0)
	dry, err := s.c.GarbageCollect(ctx, dsec.GCOptions{DryRun: true, Grace: &zero})
	if err != nil {
		t.Fatalf("GarbageCollect(dry run) = %v", err)
	}
	if !cmp.Equal(removedDigests(dry), []string{orphan}) {
		t.Errorf("GarbageCollect(dry run) would remove %v, want only the orphan", removedDigests(dry))
	}
	if _, err := s.c.GetLayer(ctx, orphan); err != nil || !s.hasBlob(orphan) {
		t.Errorf("after a dry run: GetLayer(orphan) = %v, blob present %v, want both kept", err, s.hasBlob(orphan))
	}
	// The default grace period keeps everything just made.
	res, err := s.c.GarbageCollect(ctx, dsec.GCOptions{})
	if err != nil || len(res.Removed) != 0 || len(res.Kept) != 2 {
		t.Errorf("GarbageCollect(default grace) = %+v, %v, want nothing removed, orphan and ws kept", res, err)
	}
	res, err = s.c.GarbageCollect(ctx, dsec.GCOptions{Grace: &zero})
	if err != nil {
		t.Fatalf("GarbageCollect() = %v", err)
	}
	if !cmp.Equal(removedDigests(res), []string{orphan}) || len(res.Kept) != 1 || res.Kept[0].Digest != ws ||
		!strings.Contains(res.Kept[0].Reason, "in use by 1 sandbox") {
		t.Errorf("GarbageCollect() = %+v, want orphan removed and ws kept in use", res)
	}
	if _, err := s.c.GetLayer(ctx, orphan); !errors.Is(err, dsec.ErrNotFound) || s.hasBlob(orphan) {
		t.Errorf("after GC: GetLayer(orphan) = %v, blob present %v, want both gone", err, s.hasBlob(orphan))
	}

	// The sandbox is gone: ws goes too, base (still referenced) stays.
	s.edge.set()
	res, err = s.c.GarbageCollect(ctx, dsec.GCOptions{Grace: &zero})
	if err != nil || !cmp.Equal(removedDigests(res), []string{ws}) {
		t.Errorf("GarbageCollect() after the sandbox left = %+v, %v, want ws removed", res, err)
	}
	if !s.hasBlob(base) || !s.hasBlob(tk) || s.hasBlob(ws) {
		t.Errorf("blobs after GC: base %v tk %v ws %v, want base and tk only", s.hasBlob(base), s.hasBlob(tk), s.hasBlob(ws))
	}

	// Only admin keys collect.
	secret, _, err := s.store.CreateKey(ctx, cluster.KeySpec{Name: "user", Project: "p2"})
	if err != nil {
		t.Fatal(err)
	}
	uc, err := dsec.New(dsec.Config{Addr: s.c.Addr(), APIKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	if _, err := uc.GarbageCollect(ctx, dsec.GCOptions{DryRun: true}); !errors.Is(err, dsec.ErrPermissionDenied) {
		t.Errorf("GarbageCollect(user key) = %v, want PermissionDenied", err)
	}
	// A user of another project sees that a layer of a public image is
	// used, not by what.
	if _, err := s.c.SetImagePublic(ctx, "tk/harness:12", true); err != nil {
		t.Fatal(err)
	}
	s.edge.set(&imagev1.SandboxLayers{SandboxId: "sb-2", Project: "p1", LayerDigests: []string{tk}})
	if d, err := uc.InspectImage(ctx, "tk/harness:12"); err != nil || len(d.Layers[1].Sandboxes) != 0 {
		t.Errorf("InspectImage(other project's key) = %+v, %v, want no sandbox IDs", d, err)
	}
}

func TestGarbageCollectNeedsEveryNode(t *testing.T) {
	t.Parallel()
	s := newImageServer(t)
	ctx := t.Context()
	orphan := s.layer(t, "orphan")
	// A node that does not answer may use any layer.
	reg, err := s.store.RegisterNode(ctx, cluster.Node{Name: "gone", Addr: "unix://" + filepath.Join(s.dir, "nothing.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	zero := time.Duration(0)
	if _, err := s.c.GarbageCollect(ctx, dsec.GCOptions{Grace: &zero}); !errors.Is(err, dsec.ErrUnavailable) || !strings.Contains(err.Error(), "gone") {
		t.Errorf("GarbageCollect(a node down) = %v, want Unavailable naming the node", err)
	}
	if !s.hasBlob(orphan) {
		t.Error("GarbageCollect with a node down removed a blob")
	}
}

func TestCopyImage(t *testing.T) {
	t.Parallel()
	src, dst := newImageServer(t), newImageServer(t)
	ctx := t.Context()
	big := bytes.Repeat([]byte("0123456789abcdef"), 300_000) // several chunks
	base := src.layer(t, string(big))
	ws := src.layer(t, "workspace")
	src.image(t, "ws/sphinx-9658:1", base, ws)
	dst.layer(t, "workspace") // the target has one layer already

	var skipped []string
	img, err := dsec.CopyImage(ctx, src.c, dst.c, "ws/sphinx-9658:1", func(_, _ int, l dsec.Layer, _ int64, skip bool) {
		if skip {
			skipped = append(skipped, l.Digest)
		}
	})
	if err != nil {
		t.Fatalf("CopyImage() = %v", err)
	}
	if !cmp.Equal(skipped, []string{ws}) || img.Name != "ws/sphinx-9658:1" || len(img.Layers) != 2 || img.Config.Workdir != "/w" {
		t.Errorf("CopyImage() = %+v, skipped %v, want the image with its config, ws skipped", img, skipped)
	}
	_, rc, err := dst.c.DownloadLayer(ctx, base)
	if err != nil {
		t.Fatalf("DownloadLayer() = %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, big) {
		t.Errorf("DownloadLayer() from the target = %d bytes, %v, want the %d bytes copied", len(got), err, len(big))
	}

	// A source whose blob is corrupt: the copy fails with a digest error
	// and the target registers neither the layer nor the image.
	bad := src.layer(t, "to be corrupted")
	src.image(t, "tk/harness:12", bad)
	p := filepath.Join(src.blobs, strings.TrimPrefix(bad, "sha256:"))
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("To be corrupted"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = dsec.CopyImage(ctx, src.c, dst.c, "tk/harness:12", nil)
	if !errors.Is(err, dsec.ErrDigestMismatch) || !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("CopyImage(corrupt layer) = %v, want a digest mismatch", err)
	}
	if _, err := dst.c.GetLayer(ctx, bad); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("target GetLayer(corrupt layer) = %v, want NotFound", err)
	}
	if _, err := dst.c.GetImage(ctx, "tk/harness:12"); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("target GetImage(tk/harness:12) = %v, want NotFound", err)
	}
	if dst.hasBlob(bad) {
		t.Error("the target kept the corrupt layer's blob")
	}
}

func TestGarbageCollectOrphanBlobs(t *testing.T) {
	t.Parallel()
	s := newImageServer(t)
	ctx := t.Context()
	// Blobs an upload stored and never recorded as layers: one old, one
	// fresh (its upload may be recording it right now).
	store, err := blobstore.New(filepath.Join(s.dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	old, err := store.Put(ctx, strings.NewReader("old orphan"), "")
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := store.Put(ctx, strings.NewReader("fresh orphan"), "")
	if err != nil {
		t.Fatal(err)
	}
	long := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(s.blobs, strings.TrimPrefix(old.Digest, "sha256:")), long, long); err != nil {
		t.Fatal(err)
	}
	kept := s.layer(t, "a recorded layer") // recorded, unreferenced, fresh

	orphans := func(r *dsec.GCResult) []string {
		var out []string
		for _, b := range r.OrphanBlobs {
			out = append(out, b.Digest)
		}
		return out
	}
	res, err := s.c.GarbageCollect(ctx, dsec.GCOptions{DryRun: true})
	if err != nil || !cmp.Equal(orphans(res), []string{old.Digest}) || !s.hasBlob(old.Digest) {
		t.Errorf("GarbageCollect(dry run) = %+v, %v, want the old orphan reported and kept", res, err)
	}
	res, err = s.c.GarbageCollect(ctx, dsec.GCOptions{})
	if err != nil || !cmp.Equal(orphans(res), []string{old.Digest}) || len(res.Removed) != 0 {
		t.Errorf("GarbageCollect() = %+v, %v, want only the old orphan blob removed", res, err)
	}
	if s.hasBlob(old.Digest) || !s.hasBlob(fresh.Digest) || !s.hasBlob(kept) {
		t.Errorf("blobs after GC: old %v fresh %v recorded %v, want only the old orphan gone",
			s.hasBlob(old.Digest), s.hasBlob(fresh.Digest), s.hasBlob(kept))
	}
}
