package e2e

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/erofs/go-erofs"

	"github.com/dsecproject/dsec/internal/blobsource"
	"github.com/dsecproject/dsec/internal/blobstore"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/layer"
	"github.com/dsecproject/dsec/internal/lazylayer"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// faultySource is the blob source the node reads lazy layers from: the
// platform's own blob store behind an HTTP server that records what is
// fetched and can fail or corrupt on demand.
type faultySource struct {
	root atomic.Value // the platform's blob store, set before it starts
	srv  atomic.Pointer[blobsource.Server]
	mode atomic.Value // "", "gone" or "corrupt"

	mu sync.Mutex
	// guarded by mu
	fetched map[string][][2]int64 // digest → [off, end) ranges served
}

func (f *faultySource) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := f.srv.Load()
	if s == nil {
		root, _ := f.root.Load().(string)
		var err error
		if s, err = blobsource.NewServer(root, blobsource.ServerOptions{}); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		f.srv.Store(s)
	}
	mode, _ := f.mode.Load().(string)
	if s == nil || mode == "gone" {
		http.Error(w, "gone", http.StatusServiceUnavailable)
		return
	}
	digest := "sha256:" + filepath.Base(r.URL.Path)
	if rg := r.Header.Get("Range"); rg != "" && r.Method == http.MethodGet {
		var off, end int64
		if _, err := fmt.Sscanf(rg, "bytes=%d-%d", &off, &end); err == nil {
			f.mu.Lock()
			f.fetched[digest] = append(f.fetched[digest], [2]int64{off, end + 1})
			f.mu.Unlock()
		}
	}
	if mode == "corrupt" && r.Header.Get("Range") != "" {
		s.ServeHTTP(&corrupter{ResponseWriter: w}, r)
		return
	}
	s.ServeHTTP(w, r)
}

// corrupter flips the first byte of a response body.
type corrupter struct {
	http.ResponseWriter
	done bool
}

func (c *corrupter) Write(p []byte) (int, error) {
	if !c.done && len(p) > 0 {
		q := append([]byte(nil), p...)
		q[0] ^= 0xff
		c.done = true
		return c.ResponseWriter.Write(q)
	}
	return c.ResponseWriter.Write(p)
}

// chunks returns the chunks of digest fetched so far.
func (f *faultySource) chunks(digest string, chunk int64) map[int64]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int64]bool{}
	for _, r := range f.fetched[digest] {
		for c := r[0] / chunk; c*chunk < r[1]; c++ {
			out[c] = true
		}
	}
	return out
}

// dataLayer writes a tree of random files (a few large, many small),
// builds it into a layer image and returns the image, the tree and its
// files.
func dataLayer(t *testing.T, dir string) (img, tree string, files []string) {
	t.Helper()
	tree = filepath.Join(dir, "tree")
	rng := rand.New(rand.NewChaCha8([32]byte{9}))
	write := func(rel string, size int) {
		p := filepath.Join(tree, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, (size+7)&^7)
		for i := 0; i < len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
		}
		if err := os.WriteFile(p, b[:size], 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, "data/"+rel)
	}
	for i := range 4 {
		write(fmt.Sprintf("big/b%d.bin", i), 8<<20)
	}
	for i := range 300 {
		write(fmt.Sprintf("small/d%02d/s%04d.bin", i%16, i), 1+rng.IntN(48<<10))
	}
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tree, filepath.Join(root, "data")); err != nil {
		t.Fatal(err)
	}
	tree = root
	img = filepath.Join(dir, "data.erofs")
	out, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := layer.BuildFromDir(context.Background(), root, out, layer.Options{TempDir: dir}); err != nil {
		t.Fatal(err)
	}
	return img, tree, files
}

func md5File(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := md5.Sum(b)
	return hex.EncodeToString(s[:])
}

// TestLazyLayers starts sandboxes from layers the node has never
// downloaded: only the chunks their reads touch are fetched, a second
// sandbox fetches nothing, and a failing blob source fails the sandboxes
// of that layer (EIO, state failed with the reason) while the node keeps
// working.
func TestLazyLayers(t *testing.T) {
	src := &faultySource{fetched: map[string][][2]int64{}}
	hs := httptest.NewServer(src)
	defer hs.Close()
	p := newPlatform(t, func(p *platform) {
		// A chunk size other than the default: the layers' chunk digests
		// and the keeper's cache must agree, or every read fails.
		p.Extra = append(p.Extra, "--lazy-layers", "--blob-source", hs.URL, "--warm-pool", "0", "--chunk-size", "512K")
		src.root.Store(filepath.Join(p.StateDir, "store"))
	})
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)

	dir := t.TempDir()
	img, tree, files := dataLayer(t, dir)
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	up, err := c.UploadLayer(ctx, f, "sha256:"+hex.EncodeToString(h.Sum(nil)), st.Size())
	f.Close()
	if err != nil {
		t.Fatalf("UploadLayer: %v", err)
	}
	bb, err := c.GetImage(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateImage(ctx, "lazydata", []string{bb.Layers[0].Digest, up.Digest}, dsec.ImageConfig{}); err != nil {
		t.Fatalf("CreateImage: %v", err)
	}
	// The same split here tells which blob holds the data and where the
	// files' extents are.
	local, err := blobstore.New(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	if f, err = os.Open(img); err != nil {
		t.Fatal(err)
	}
	if _, err := local.Put(ctx, f, up.Digest); err != nil {
		t.Fatal(err)
	}
	f.Close()
	form, err := lazylayer.Make(ctx, local, up.Digest, 512<<10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p.StateDir, "store", "sha256", strings.TrimPrefix(form.Data, "sha256:"))); err != nil {
		t.Fatalf("the platform did not store the layer's data blob %s: %v", form.Data, err)
	}
	touched := func(paths []string) map[int64]bool {
		m, _ := local.Open(form.Meta)
		defer m.Close()
		d, _ := local.Open(form.Data)
		defer d.Close()
		fsys, err := erofs.Open(m, erofs.WithExtraDevices(d))
		if err != nil {
			t.Fatal(err)
		}
		out := map[int64]bool{}
		for _, p := range paths {
			fi, err := fs.Stat(fsys, p)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range fi.(interface{ DataRange() []erofs.DataRange }).DataRange() {
				if r.Offset < 0 || r.Size == 0 {
					continue
				}
				for c := r.Offset / form.ChunkSize; c*form.ChunkSize < r.Offset+r.Size; c++ {
					out[c] = true
				}
			}
		}
		return out
	}

	picks := []string{files[5], files[60], files[120], files[200], files[303]}
	readCmd := func(paths []string) string {
		return "md5sum /" + strings.Join(paths, " /")
	}
	wantSums := func(paths []string) string {
		var b strings.Builder
		for _, p := range paths {
			fmt.Fprintf(&b, "%s  /%s\n", md5File(t, filepath.Join(tree, p)), p)
		}
		return b.String()
	}

	start := time.Now()
	a, err := c.Create(ctx, dsec.CreateOptions{Image: "lazydata", Memory: 64 << 20})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Logf("first sandbox on the lazy layer started in %v", time.Since(start).Round(time.Millisecond))
	if got := src.chunks(form.Data, form.ChunkSize); len(got) != 0 {
		t.Errorf("starting the sandbox fetched %d chunks of the data layer, want none", len(got))
	}
	res, err := a.Shell(ctx, readCmd(picks))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("read 5 files: %v %+v %s", err, res, res.Stderr)
	}
	if got, want := string(res.Stdout), wantSums(picks); got != want {
		t.Fatalf("sums in the sandbox:\n%s\nwant:\n%s", got, want)
	}
	// The reads return before their readahead ends: count the fetches
	// once none is in flight, or the second sandbox would be blamed for
	// the end of the first's readahead.
	settled(t, p)
	want, got := touched(picks), src.chunks(form.Data, form.ChunkSize)
	for c := range want {
		if !got[c] {
			t.Errorf("chunk %d holds a file read but was not fetched", c)
		}
	}
	// The chunk cache may read ahead up to 4 chunks after a sequential
	// read; nothing else may be fetched.
	if len(got) > len(want)+4*len(picks) {
		t.Errorf("fetched %d chunks of the data layer for 5 files in %d chunks", len(got), len(want))
	}
	t.Logf("5 files: %d chunks touched, %d fetched, of %d in the layer", len(want), len(got), (form.DataSize+form.ChunkSize-1)/form.ChunkSize)

	b, err := c.Create(ctx, dsec.CreateOptions{Image: "lazydata", Memory: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := b.Shell(ctx, readCmd(picks)); err != nil || string(res.Stdout) != wantSums(picks) {
		t.Fatalf("second sandbox: %v %s %s", err, res.Stdout, res.Stderr)
	}
	settled(t, p)
	if again := src.chunks(form.Data, form.ChunkSize); len(again) != len(got) {
		var extra []int64
		for c := range again {
			if !got[c] {
				extra = append(extra, c)
			}
		}
		slices.Sort(extra)
		t.Errorf("second sandbox fetched %d chunks (%v), want 0", len(extra), extra)
	}
	// dsec up's /metrics shows the keeper's chunk cache: every byte the
	// source served for the data blob, and the second sandbox's hits.
	// (The base layer's data comes through the cache too; metadata images
	// are fetched whole, beside it.)
	src.mu.Lock()
	var served, all int64
	for d, rs := range src.fetched {
		for _, r := range rs {
			all += r[1] - r[0]
			if d == form.Data {
				served += r[1] - r[0]
			}
		}
	}
	src.mu.Unlock()
	mets := scrapeAll(t, p)
	if v := mets["dsec_chunkcache_fetched_bytes_total"]; v < float64(served) || v > float64(all) {
		t.Errorf("dsec_chunkcache_fetched_bytes_total = %v, want between the %d bytes of the data layer and the %d of all blobs the source served", v, served, all)
	}
	if v := mets["dsec_chunkcache_hits_total"]; v < float64(len(want)) {
		t.Errorf("dsec_chunkcache_hits_total = %v after a second sandbox read %d cached chunks", v, len(want))
	}

	// A sandbox that does not use the data layer, to show the node and
	// its other sandboxes keep working.
	other, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}

	// Corrupt chunks: EIO, and the cache keeps nothing of them.
	// uncached returns a file none of whose chunks was fetched yet.
	uncached := func(skip string) string {
		t.Helper()
		have := src.chunks(form.Data, form.ChunkSize)
		for i := len(files) - 1; i >= 0; i-- {
			if files[i] == skip {
				continue
			}
			clear := true
			for c := range touched([]string{files[i]}) {
				clear = clear && !have[c]
			}
			if clear {
				return files[i]
			}
		}
		t.Fatal("every file of the layer is cached")
		return ""
	}
	src.mode.Store("corrupt")
	victim := uncached("")
	res, err = a.Shell(ctx, "cat /"+victim+" >/dev/null")
	if err != nil || res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "Input/output error") {
		t.Errorf("read of corrupt chunks: err %v, exit %d, stderr %q; want an I/O error", err, res.ExitCode, res.Stderr)
	}
	src.mode.Store("")
	// Only the sandbox that read is failed; another one on the layer
	// reads the same file once the source is healthy again.
	if res, err := b.Shell(ctx, readCmd([]string{victim})); err != nil || string(res.Stdout) != wantSums([]string{victim}) {
		t.Fatalf("read after the source is healthy again: %v %+v (the cache kept a corrupt chunk?)", err, res)
	}
	waitFailed := func(sb *dsec.Sandbox) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if err := sb.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			if sb.State == dsec.StateFailed {
				if !strings.Contains(sb.Reason, up.Digest) {
					t.Errorf("sandbox %s failed with reason %q, want one naming layer %s", sb.ID, sb.Reason, up.Digest)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s is %s (%q), want failed after its layer's read failed", sb.ID, sb.State, sb.Reason)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFailed(a)

	// The source goes away mid-read: EIO within the deadline.
	src.mode.Store("gone")
	start = time.Now()
	res, err = b.Shell(ctx, "cat /"+uncached(victim)+" >/dev/null")
	took := time.Since(start)
	if err != nil || res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "Input/output error") {
		t.Errorf("read with the source gone: err %v, exit %d, stderr %q; want an I/O error", err, res.ExitCode, res.Stderr)
	}
	if took > 45*time.Second {
		t.Errorf("EIO after %v, want within the 30s read deadline", took)
	}
	t.Logf("source gone: EIO after %v", took.Round(time.Millisecond))
	waitFailed(b)
	if res, err := other.Shell(ctx, "echo ok"); err != nil || strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Errorf("a sandbox on other layers: %v %q", err, res.Stdout)
	}
	if _, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20}); err != nil {
		t.Errorf("the node refuses new sandboxes after a layer failed: %v", err)
	}

	// Deleting everything leaves no layer mount or FUSE server behind.
	sbs, err := c.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if err := sb.Delete(ctx); err != nil {
			t.Errorf("Delete(%s): %v", sb.ID, err)
		}
	}
	kc := keeper.NewClient(p.StateDir)
	defer kc.Close()
	v, err := kc.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mi, _ := os.ReadFile("/proc/" + strconv.Itoa(v.Pid) + "/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, "fuse.dsec-lazy") || strings.Contains(l, p.StateDir+"/run/layers/") {
			t.Errorf("left mounted after deleting every sandbox: %s", l)
		}
	}
}

// scrape reads dsec up's /metrics into sample name → value, for samples
// without labels.
// settled waits until the node's chunk cache has no fetch in flight.
func settled(t *testing.T, p *platform) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, ok := scrapeAll(t, p)["dsec_chunkcache_fetches_in_flight"]
		if !ok {
			t.Fatal("/metrics has no dsec_chunkcache_fetches_in_flight")
		}
		if v == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v chunk cache fetches still in flight after 30s", v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
