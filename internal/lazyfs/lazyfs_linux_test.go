package lazyfs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/erofs/go-erofs"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/layer"
	"github.com/dsecproject/dsec/internal/lazyfs"
	"github.com/dsecproject/dsec/internal/testenv"
)

const chunkSize = 1 << 20

// split is a layer in its lazy form.
type split struct {
	tree  string   // the source tree
	files []string // regular files, relative
	meta  string   // metadata-only image
	data  string   // data blob
	size  int64    // of data
}

// makeSplit writes a tree of `large` random files of largeSize and `small`
// random files of sizes up to 64 KiB, builds the layer and splits it.
func makeSplit(t testing.TB, dir string, large int, largeSize int64, small int) *split {
	t.Helper()
	s := &split{tree: filepath.Join(dir, "tree"), meta: filepath.Join(dir, "meta.erofs"), data: filepath.Join(dir, "data.blob")}
	rng := rand.New(rand.NewChaCha8([32]byte{7}))
	buf := make([]byte, 8<<20)
	fill := func(b []byte) {
		for i := 0; i+8 <= len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
		}
	}
	write := func(rel string, size int64) {
		p := filepath.Join(s.tree, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		for left := size; left > 0; {
			n := min(left, int64(len(buf)))
			fill(buf[:n])
			if _, err := f.Write(buf[:n]); err != nil {
				t.Fatal(err)
			}
			left -= n
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		s.files = append(s.files, rel)
	}
	for i := range large {
		write(fmt.Sprintf("big/b%02d.bin", i), largeSize)
	}
	for i := range small {
		write(fmt.Sprintf("small/d%02d/s%05d.bin", i%32, i), 1+rng.Int64N(64<<10))
	}
	img, err := os.Create(filepath.Join(dir, "layer.erofs"))
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if _, err := layer.BuildFromDir(context.Background(), s.tree, img, layer.Options{TempDir: dir}); err != nil {
		t.Fatalf("BuildFromDir: %v", err)
	}
	meta, err := os.Create(s.meta)
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	data, err := os.Create(s.data)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	if err := layer.SplitLazy(img, meta, data); err != nil {
		t.Fatalf("SplitLazy: %v", err)
	}
	_ = os.Remove(img.Name())
	st, err := data.Stat()
	if err != nil {
		t.Fatal(err)
	}
	s.size = st.Size()
	return s
}

// chunksOf returns the data blob's chunks that hold the files' data, read
// from the images' extents.
func (s *split) chunksOf(t testing.TB, files []string) []int64 {
	t.Helper()
	m, err := os.Open(s.meta)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	d, err := os.Open(s.data)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fsys, err := erofs.Open(m, erofs.WithExtraDevices(d))
	if err != nil {
		t.Fatal(err)
	}
	set := map[int64]bool{}
	for _, p := range files {
		fi, err := fs.Stat(fsys, p)
		if err != nil {
			t.Fatal(err)
		}
		dr, ok := fi.(interface{ DataRange() []erofs.DataRange })
		if !ok {
			t.Fatalf("%s: no data ranges", p)
		}
		for _, r := range dr.DataRange() {
			if r.Offset < 0 || r.Size == 0 {
				continue
			}
			for c := r.Offset / chunkSize; c*chunkSize < r.Offset+r.Size; c++ {
				set[c] = true
			}
		}
	}
	out := make([]int64, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// memCache is a chunk cache for tests: whole chunks fetched from src on
// first use and kept, with fault switches.
type memCache struct {
	src  io.ReaderAt
	size int64

	fail   atomic.Bool   // fetches fail
	hang   atomic.Bool   // fetches wait for ctx
	stuck  chan struct{} // when non-nil, fetches wait for it, ignoring ctx
	served atomic.Int64

	mu sync.Mutex
	// guarded by mu
	chunks  map[int64][]byte
	fetched []int64
}

func newMemCache(t testing.TB, path string) *memCache {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	st, _ := f.Stat()
	return &memCache{src: f, size: st.Size(), chunks: map[int64][]byte{}}
}

func (c *memCache) chunk(ctx context.Context, i int64) ([]byte, error) {
	c.mu.Lock()
	b, ok := c.chunks[i]
	c.mu.Unlock()
	if ok {
		return b, nil
	}
	c.mu.Lock()
	stuck := c.stuck
	c.mu.Unlock()
	switch {
	case stuck != nil:
		<-stuck
		return nil, errors.New("stuck source released")
	case c.hang.Load():
		<-ctx.Done()
		return nil, ctx.Err()
	case c.fail.Load():
		return nil, errors.New("source gone")
	}
	b = make([]byte, min(chunkSize, c.size-i*chunkSize))
	if _, err := c.src.ReadAt(b, i*chunkSize); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.chunks[i]; !ok {
		c.chunks[i] = b
		c.fetched = append(c.fetched, i)
	}
	return b, nil
}

func (c *memCache) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		o := off + int64(n)
		b, err := c.chunk(ctx, o/chunkSize)
		if err != nil {
			return n, err
		}
		n += copy(p[n:], b[o%chunkSize:])
	}
	c.served.Add(int64(n))
	return n, nil
}

func (c *memCache) fetchedChunks() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.fetched)
	slices.Sort(out)
	return out
}

// mounted is a lazily mounted layer.
type mounted struct {
	conn *lazyfs.Conn
	root string
}

func mountLazy(t testing.TB, dir string, s *split, blob lazyfs.Blob, cfg lazyfs.Config) *mounted {
	t.Helper()
	cfg.Dir, cfg.Size = filepath.Join(dir, "fuse"), s.size
	if cfg.Fusectl == "" {
		cfg.Fusectl = filepath.Join(dir, "fusectl")
		if err := lazyfs.MountControl(cfg.Fusectl); err != nil {
			t.Fatalf("MountControl: %v", err)
		}
		t.Cleanup(func() { _ = lazyfs.UnmountControl(cfg.Fusectl) })
	}
	conn, err := lazyfs.Mount(cfg, blob)
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(s.meta, root, "erofs", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, "device="+conn.Path()); err != nil {
		conn.Close()
		t.Fatalf("mount EROFS with device=%s: %v", conn.Path(), err)
	}
	m := &mounted{conn: conn, root: root}
	t.Cleanup(m.unmount)
	return m
}

func (m *mounted) unmount() {
	_ = unix.Unmount(m.root, unix.MNT_DETACH)
	_ = m.conn.Close()
}

func sameFile(t testing.TB, got, want string) {
	t.Helper()
	g, err := os.ReadFile(got)
	if err != nil {
		t.Fatalf("read %s: %v", got, err)
	}
	w, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g, w) {
		t.Fatalf("%s: %d bytes differ from the source's %d", got, len(g), len(w))
	}
}

func notMounted(t testing.TB, dirs ...string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if strings.Contains(string(b), " "+d+" ") {
			t.Errorf("%s is still mounted", d)
		}
	}
}

// TestFiveFilesOf500MB is issue 7's check: a sandbox reads 5 files of a
// 500 MB layer and only the chunks holding them are fetched; a second
// mount of the layer over the same chunk cache fetches nothing.
func TestFiveFilesOf500MB(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	start := time.Now()
	s := makeSplit(t, dir, 4, 108<<20, 1600)
	t.Logf("built and split a %d MiB layer (%d files) in %v", s.size>>20, len(s.files), time.Since(start).Round(time.Millisecond))
	if s.size < 500e6 {
		t.Fatalf("data blob is %d MiB, want about 500", s.size>>20)
	}
	picks := []string{s.files[4], s.files[400], s.files[800], s.files[1200], s.files[1603]}
	want := s.chunksOf(t, picks)
	var read int64
	cache := newMemCache(t, s.data)
	m := mountLazy(t, dir, s, cache, lazyfs.Config{})
	for _, p := range picks {
		sameFile(t, filepath.Join(m.root, p), filepath.Join(s.tree, p))
		st, _ := os.Stat(filepath.Join(s.tree, p))
		read += st.Size()
	}
	got := cache.fetchedChunks()
	if !slices.Equal(got, want) {
		t.Errorf("chunks fetched = %v, want exactly the %d chunks the files' extents touch: %v", got, len(want), want)
	}
	t.Logf("5 files, %d KiB read: %d chunks fetched (%d MiB of %d MiB)", read>>10, len(got), int64(len(got))*chunkSize>>20, s.size>>20)

	// A second sandbox on the same mount shares the page cache; a new
	// mount (another node process, or after the last user left) finds
	// the chunks in the cache.
	m.unmount()
	notMounted(t, m.root, filepath.Join(dir, "fuse"))
	m2 := mountLazy(t, dir, s, cache, lazyfs.Config{})
	for _, p := range picks {
		sameFile(t, filepath.Join(m2.root, p), filepath.Join(s.tree, p))
	}
	if again := cache.fetchedChunks(); len(again) != len(got) {
		t.Errorf("second mount fetched %d more chunks, want 0", len(again)-len(got))
	}
	if st := m2.conn.Stats(); st.Reads == 0 || st.ReadErrors != 0 {
		t.Errorf("second mount Stats = %+v, want reads served from the cache and no errors", st)
	}
}

// smallSplit is a layer for the fault tests.
func smallSplit(t testing.TB, dir string) *split { return makeSplit(t, dir, 2, 4<<20, 40) }

func readErr(path string) error {
	_, err := os.ReadFile(path)
	return err
}

func TestSourceGoneGivesEIO(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	s := smallSplit(t, dir)
	cache := newMemCache(t, s.data)
	var errs atomic.Int64
	m := mountLazy(t, dir, s, cache, lazyfs.Config{OnError: func(err error) {
		if errors.Is(err, syscall.EIO) {
			errs.Add(1)
		}
	}})
	sameFile(t, filepath.Join(m.root, s.files[0]), filepath.Join(s.tree, s.files[0]))
	cache.fail.Store(true)
	if err := readErr(filepath.Join(m.root, s.files[1])); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read with the source gone = %v, want EIO", err)
	}
	if errs.Load() == 0 {
		t.Error("OnError was not told of the failed read")
	}
	// Cached data and metadata still work; the connection is up, so
	// the layer recovers when the source comes back.
	sameFile(t, filepath.Join(m.root, s.files[0]), filepath.Join(s.tree, s.files[0]))
	if _, err := os.ReadDir(filepath.Join(m.root, "small/d03")); err != nil {
		t.Errorf("ReadDir with the source gone: %v", err)
	}
	cache.fail.Store(false)
	sameFile(t, filepath.Join(m.root, s.files[1]), filepath.Join(s.tree, s.files[1]))
	if st := m.conn.Stats(); st.Aborted || st.ReadErrors == 0 {
		t.Errorf("Stats = %+v, want read errors and no abort", st)
	}
}

func TestHungSourceHitsDeadline(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	s := smallSplit(t, dir)
	cache := newMemCache(t, s.data)
	cache.hang.Store(true)
	const deadline = time.Second
	m := mountLazy(t, dir, s, cache, lazyfs.Config{ReadTimeout: deadline})
	start := time.Now()
	err := readErr(filepath.Join(m.root, s.files[0]))
	took := time.Since(start)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read from a hung source = %v, want EIO", err)
	}
	// The kernel may retry a failed read (readahead, then the read
	// itself), each bounded by the deadline.
	if took < deadline || took > 4*deadline+time.Second {
		t.Errorf("EIO after %v, want within a few %v deadlines", took, deadline)
	}
	t.Logf("EIO after %v with a %v deadline", took.Round(time.Millisecond), deadline)
}

func TestWatchdogAbortsStuckServer(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	ctl := filepath.Join(dir, "fusectl")
	if err := lazyfs.MountControl(ctl); err != nil {
		t.Fatalf("MountControl: %v", err)
	}
	t.Cleanup(func() { _ = lazyfs.UnmountControl(ctl) })
	s := smallSplit(t, dir)
	cache := newMemCache(t, s.data)
	var aborted atomic.Bool
	m := mountLazy(t, dir, s, cache, lazyfs.Config{
		ReadTimeout: 500 * time.Millisecond, Grace: time.Second, Fusectl: ctl,
		OnError: func(err error) {
			if errors.Is(err, lazyfs.ErrAborted) {
				aborted.Store(true)
			}
		},
	})
	sameFile(t, filepath.Join(m.root, s.files[0]), filepath.Join(s.tree, s.files[0]))
	stuck := make(chan struct{})
	cache.mu.Lock()
	cache.stuck = stuck // a Blob that ignores its deadline
	cache.mu.Unlock()
	start := time.Now()
	err := readErr(filepath.Join(m.root, s.files[1]))
	took := time.Since(start)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read from a stuck server = %v, want EIO", err)
	}
	if took > 5*time.Second {
		t.Errorf("EIO after %v, want within deadline+grace+1s", took)
	}
	if !aborted.Load() || !m.conn.Stats().Aborted {
		t.Error("the watchdog did not report an abort")
	}
	// After the abort: cached data reads, uncached fails at once.
	sameFile(t, filepath.Join(m.root, s.files[0]), filepath.Join(s.tree, s.files[0]))
	start = time.Now()
	if err := readErr(filepath.Join(m.root, s.files[2])); !errors.Is(err, syscall.EIO) || time.Since(start) > time.Second {
		t.Errorf("read after abort = %v after %v, want EIO at once", err, time.Since(start))
	}
	close(stuck)
	m.unmount()
	notMounted(t, m.root, filepath.Join(dir, "fuse"))
}
