package chunkcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/goleak"

	"github.com/dsecproject/dsec/internal/blobsource"
	"github.com/dsecproject/dsec/internal/blobstore"
	"github.com/dsecproject/dsec/internal/metrics"
)

func TestMain(m *testing.M) {
	retryBackoff = 20 * time.Millisecond
	goleak.VerifyTestMain(m)
}

const cs = 64 << 10 // chunk size of the tests

// testBlob is a blob of 20 full chunks and a short one, in a blob store.
type testBlob struct {
	root, digest string
	data         []byte
	chunks       []string
}

func newTestBlob(t *testing.T) *testBlob {
	t.Helper()
	data := make([]byte, 20*cs+1000)
	r := rand.New(rand.NewChaCha8([32]byte{7}))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	root := t.TempDir()
	st, err := blobstore.New(root)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := st.Put(context.Background(), bytes.NewReader(data), "")
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := ChunkDigests(bytes.NewReader(data), int64(len(data)), cs)
	if err != nil {
		t.Fatal(err)
	}
	return &testBlob{root: root, digest: desc.Digest, data: data, chunks: chunks}
}

// recorder wraps a Source and records each range it is asked for, as
// "first-last" chunk indices.
type recorder struct {
	blobsource.Source
	mu   sync.Mutex
	reqs []string // guarded by mu
}

func (r *recorder) ReadAt(ctx context.Context, digest string, p []byte, off int64) (int, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, fmt.Sprintf("%d-%d", off/cs, (off+int64(len(p))-1)/cs))
	r.mu.Unlock()
	return r.Source.ReadAt(ctx, digest, p, off)
}

func (r *recorder) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slicesClone(r.reqs)
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// faultServer is the blobserver handler behind fault injection. It
// records the chunk ranges of its GET requests.
type faultServer struct {
	h  http.Handler
	mu sync.Mutex
	// guarded by mu:
	reqs    []string
	down    bool          // close connections without answering
	hang    bool          // answer nothing until the client gives up
	gate    chan struct{} // when set, wait for it to close before answering
	corrupt map[int64]int // chunk index -> times to corrupt it
}

func newFaultServer(t *testing.T, root string) (*faultServer, *httptest.Server) {
	t.Helper()
	h, err := blobsource.NewServer(root, blobsource.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fs := &faultServer{h: h, corrupt: map[int64]int{}}
	ts := httptest.NewServer(fs)
	t.Cleanup(ts.Close)
	return fs, ts
}

func (s *faultServer) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slicesClone(s.reqs)
}

func (s *faultServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var first, last int64
	if rng, ok := strings.CutPrefix(r.Header.Get("Range"), "bytes="); ok {
		a, b, _ := strings.Cut(rng, "-")
		first, _ = strconv.ParseInt(a, 10, 64)
		last, _ = strconv.ParseInt(b, 10, 64)
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, fmt.Sprintf("%d-%d", first/cs, last/cs))
	down, hang, gate := s.down, s.hang, s.gate
	flip := int64(-1)
	for c := first / cs; c <= last/cs; c++ {
		if s.corrupt[c] > 0 {
			s.corrupt[c]--
			flip = c*cs + 100 - first // a byte inside chunk c, relative to the body
			break
		}
	}
	s.mu.Unlock()
	switch {
	case down:
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	case hang:
		<-r.Context().Done()
		return
	case gate != nil:
		<-gate
	}
	if flip >= 0 {
		w = &flipWriter{ResponseWriter: w, at: flip}
	}
	s.h.ServeHTTP(w, r)
}

// flipWriter inverts the body byte at offset at.
type flipWriter struct {
	http.ResponseWriter
	at, pos int64
}

func (f *flipWriter) Write(p []byte) (int, error) {
	if i := f.at - f.pos; i >= 0 && i < int64(len(p)) {
		p = bytes.Clone(p)
		p[i] ^= 0xff
	}
	f.pos += int64(len(p))
	return f.ResponseWriter.Write(p)
}

// sources returns the two kinds of source over tb: a directory and the
// blobserver over HTTP, each with a function returning the chunk ranges
// asked for.
func sources(t *testing.T, tb *testBlob) map[string]func() (blobsource.Source, func() []string) {
	return map[string]func() (blobsource.Source, func() []string){
		"dir": func() (blobsource.Source, func() []string) {
			d, err := blobsource.NewDir(tb.root)
			if err != nil {
				t.Fatal(err)
			}
			r := &recorder{Source: d}
			return r, r.requests
		},
		"http": func() (blobsource.Source, func() []string) {
			fs, ts := newFaultServer(t, tb.root)
			src, err := blobsource.NewHTTP(ts.URL, blobsource.HTTPOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return src, fs.requests
		},
	}
}

func newCache(t *testing.T, dir string, src blobsource.Source, opts Options) *Cache {
	t.Helper()
	if opts.Readahead == 0 {
		opts.Readahead = -1
	}
	c, err := New(dir, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// read reads n bytes at off and checks them against the blob.
func read(t *testing.T, b *Blob, tb *testBlob, off int64, n int) {
	t.Helper()
	p := make([]byte, n)
	got, err := b.ReadAt(context.Background(), p, off)
	want := min(int64(n), int64(len(tb.data))-off)
	if int64(got) != want || (err != nil && !(errors.Is(err, io.EOF) && want < int64(n))) {
		t.Fatalf("ReadAt(%d bytes at %d) = %d, %v, want %d", n, off, got, err, want)
	}
	if !bytes.Equal(p[:got], tb.data[off:off+int64(got)]) {
		t.Fatalf("ReadAt(%d bytes at %d) returned other bytes than the blob's", n, off)
	}
}

// Bytes fetched are exactly the chunks touched; a second reader of the
// same blob fetches nothing.
func TestFetchesOnlyTouchedChunks(t *testing.T) {
	tb := newTestBlob(t)
	for name, mk := range sources(t, tb) {
		t.Run(name, func(t *testing.T) {
			src, requests := mk()
			c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs})
			b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
			// Five "files": inside chunk 1; chunks 4-5; inside 9; 12-14; the short last chunk.
			reads := []struct {
				off int64
				n   int
			}{{cs + 10, 100}, {4*cs + 5, cs}, {9 * cs, cs}, {12*cs + 1, 2 * cs}, {20*cs + 500, 4000}}
			for _, r := range reads {
				read(t, b, tb, r.off, r.n)
			}
			touched := int64(1+2+1+3)*cs + 1000
			st := c.Stats()
			if st.BytesFetched != touched || st.Fetches != 5 || st.CachedBytes != touched || st.CachedChunks != 8 {
				t.Errorf("after 5 reads: fetched %d bytes in %d requests, cached %d bytes in %d chunks; want %d bytes in 5 requests, 8 chunks",
					st.BytesFetched, st.Fetches, st.CachedBytes, st.CachedChunks, touched)
			}
			if diff := cmp.Diff([]string{"1-1", "4-5", "9-9", "12-14", "20-20"}, requests()); diff != "" {
				t.Errorf("range requests (-want +got):\n%s", diff)
			}

			second := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
			for _, r := range reads {
				read(t, second, tb, r.off, r.n)
			}
			st2 := c.Stats()
			if st2.BytesFetched != st.BytesFetched || st2.Fetches != st.Fetches || st2.Hits != st.Hits+8 {
				t.Errorf("second reader: fetched %d bytes, %d hits; want 0 bytes, 8 hits",
					st2.BytesFetched-st.BytesFetched, st2.Hits-st.Hits)
			}
		})
	}
}

// Adjacent misses are one range request; cached chunks split runs.
func TestCoalescing(t *testing.T) {
	tb := newTestBlob(t)
	for name, mk := range sources(t, tb) {
		t.Run(name, func(t *testing.T) {
			src, requests := mk()
			c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs})
			b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
			read(t, b, tb, 3*cs+7, 5*cs-100) // chunks 3-7
			read(t, b, tb, 5*cs, 1)          // chunk 5, cached
			read(t, b, tb, 1*cs, 10*cs)      // chunks 1-10: 1-2 and 8-10 missing
			// The two misses of the last read are fetched in parallel: any order.
			if diff := cmp.Diff([]string{"3-7", "1-2", "8-10"}, requests(), anyOrder); diff != "" {
				t.Errorf("range requests (-want +got):\n%s", diff)
			}
		})
	}
}

// Sequential reads fetch the next chunks ahead in one request.
func TestReadahead(t *testing.T) {
	tb := newTestBlob(t)
	src, requests := sources(t, tb)["dir"]()
	c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs, Readahead: 3})
	b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
	read(t, b, tb, 0, cs)
	waitFor(t, func() bool { return c.Stats().CachedChunks == 4 })
	before := c.Stats()
	read(t, b, tb, cs, cs) // a hit, and readahead of chunk 4
	if st := c.Stats(); st.Hits != before.Hits+1 {
		t.Errorf("read of chunk 1 after readahead: %d hits, want 1", st.Hits-before.Hits)
	}
	waitFor(t, func() bool { return c.Stats().CachedChunks == 5 })
	read(t, b, tb, 15*cs, 10) // not sequential: no readahead
	c.Close()
	// The readahead of 1-3 runs beside the fetch of 0: any order.
	if diff := cmp.Diff([]string{"0-0", "1-3", "4-4", "15-15"}, requests(), anyOrder); diff != "" {
		t.Errorf("range requests (-want +got):\n%s", diff)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
	}
}

// Concurrent readers of one chunk share one fetch.
func TestConcurrentReadersShareFetch(t *testing.T) {
	tb := newTestBlob(t)
	fs, ts := newFaultServer(t, tb.root)
	gate := make(chan struct{})
	fs.gate = gate
	src, _ := blobsource.NewHTTP(ts.URL, blobsource.HTTPOptions{})
	c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs})
	const readers = 8
	var wg sync.WaitGroup
	errs := make([]error, readers)
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
			p := make([]byte, 1000)
			off := int64(2*cs + 100*i)
			if _, err := b.ReadAt(context.Background(), p, off); err != nil {
				errs[i] = err
			} else if !bytes.Equal(p, tb.data[off:off+1000]) {
				errs[i] = errors.New("wrong bytes")
			}
		}()
	}
	waitFor(t, func() bool { return c.Stats().Misses == readers })
	fs.mu.Lock()
	fs.gate = nil
	fs.mu.Unlock()
	close(gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("reader %d: %v", i, err)
		}
	}
	if got := fs.requests(); len(got) != 1 {
		t.Errorf("%d readers of one chunk sent requests %q, want one", readers, got)
	}
}

// A reader of a chunk that another reader's readahead is fetching waits
// for that fetch instead of sending its own; the fetches in flight count
// the readahead until it ends.
func TestReadaheadInFlightIsShared(t *testing.T) {
	tb := newTestBlob(t)
	fs, ts := newFaultServer(t, tb.root)
	gate := make(chan struct{})
	fs.gate = gate
	src, _ := blobsource.NewHTTP(ts.URL, blobsource.HTTPOptions{})
	c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs, Readahead: 3})
	first := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); read(t, first, tb, 0, cs) }() // chunk 0, readahead 1-3
	waitFor(t, func() bool { return len(fs.requests()) == 2 })
	if n := c.Stats().FetchesInFlight; n != 2 {
		t.Errorf("FetchesInFlight = %d while chunk 0 and its readahead wait, want 2", n)
	}
	second := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
	go func() { defer wg.Done(); read(t, second, tb, 2*cs+10, 100) }() // inside chunk 2, being read ahead
	waitFor(t, func() bool { return c.Stats().Misses == 2 })
	fs.mu.Lock()
	fs.gate = nil
	fs.mu.Unlock()
	close(gate)
	wg.Wait()
	waitFor(t, func() bool { return c.Stats().FetchesInFlight == 0 })
	c.Close()
	if diff := cmp.Diff([]string{"0-0", "1-3"}, fs.requests(), anyOrder); diff != "" {
		t.Errorf("range requests (-want +got):\n%s", diff)
	}
}

// The source going away mid-read fails reads with EIO after the retries,
// within the deadline; cached chunks stay readable.
func TestSourceDown(t *testing.T) {
	tb := newTestBlob(t)
	const (
		timeout = 200 * time.Millisecond
		retries = 2
	)
	// FetchTimeout×(Retries+1) plus the backoff (20 + 40 ms in tests).
	deadline := timeout*(retries+1) + 60*time.Millisecond
	for _, fault := range []string{"connection closed", "hang", "server gone"} {
		t.Run(fault, func(t *testing.T) {
			fs, ts := newFaultServer(t, tb.root)
			src, _ := blobsource.NewHTTP(ts.URL, blobsource.HTTPOptions{})
			c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs, FetchTimeout: timeout, Retries: retries})
			b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
			read(t, b, tb, 0, cs) // chunk 0 cached

			fs.mu.Lock()
			switch fault {
			case "connection closed":
				fs.down = true
			case "hang":
				fs.hang = true
			}
			fs.mu.Unlock()
			if fault == "server gone" {
				ts.CloseClientConnections()
				ts.Close()
			}
			start := time.Now()
			n, err := b.ReadAt(context.Background(), make([]byte, 2*cs), cs/2) // chunks 0-1
			elapsed := time.Since(start)
			if !errors.Is(err, syscall.EIO) || !errors.Is(err, ErrIO) {
				t.Errorf("ReadAt with the source down = %d, %v, want EIO", n, err)
			}
			if elapsed > deadline+750*time.Millisecond {
				t.Errorf("ReadAt with the source down took %v, want at most %v", elapsed, deadline)
			}
			if fault == "hang" { // (net/http retries a GET on a closed idle connection itself)
				if got := len(fs.requests()); got != 1+1+retries {
					t.Errorf("server saw %d requests, want 1 + %d attempts", got, 1+retries)
				}
			}
			if st := c.Stats(); st.FetchErrors != 1+retries || st.CachedChunks != 1 {
				t.Errorf("Stats: %d fetch errors, %d chunks cached; want %d, 1", st.FetchErrors, st.CachedChunks, 1+retries)
			}
			read(t, b, tb, 10, 1000) // the node stays healthy: cached data is served
		})
	}
}

// A caller that gives up does not wait for the fetch.
func TestReadContextCanceled(t *testing.T) {
	tb := newTestBlob(t)
	fs, ts := newFaultServer(t, tb.root)
	fs.hang = true
	src, _ := blobsource.NewHTTP(ts.URL, blobsource.HTTPOptions{})
	c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs, FetchTimeout: 5 * time.Second})
	b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := b.ReadAt(ctx, make([]byte, 10), 0); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Errorf("ReadAt with a 100ms context = %v after %v, want DeadlineExceeded", err, time.Since(start))
	}
	// Close cancels the fetch in flight and waits for it.
	c.Close()
}

// A corrupt chunk is refetched once, then EIO; it is never cached.
func TestCorruptChunk(t *testing.T) {
	tb := newTestBlob(t)
	tests := []struct {
		name        string
		times       int // responses corrupting chunk 3
		wantErr     bool
		wantReqs    []string
		wantCorrupt int64
	}{
		{"once", 1, false, []string{"2-4", "3-3"}, 1},
		{"always", 100, true, []string{"2-4", "3-3"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs, ts := newFaultServer(t, tb.root)
			fs.corrupt[3] = tt.times
			src, _ := blobsource.NewHTTP(ts.URL, blobsource.HTTPOptions{})
			dir := t.TempDir()
			c := newCache(t, dir, src, Options{ChunkSize: cs})
			b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
			p := make([]byte, 3*cs)
			_, err := b.ReadAt(context.Background(), p, 2*cs) // chunks 2-4
			if tt.wantErr != (err != nil) || (err != nil && !errors.Is(err, syscall.EIO)) {
				t.Fatalf("ReadAt = %v, want error %v (EIO)", err, tt.wantErr)
			}
			if !tt.wantErr && !bytes.Equal(p, tb.data[2*cs:5*cs]) {
				t.Error("ReadAt returned other bytes than the blob's")
			}
			if diff := cmp.Diff(tt.wantReqs, fs.requests()); diff != "" {
				t.Errorf("range requests (-want +got):\n%s", diff)
			}
			st := c.Stats()
			if st.CorruptChunks != tt.wantCorrupt {
				t.Errorf("CorruptChunks = %d, want %d", st.CorruptChunks, tt.wantCorrupt)
			}
			_, serr := os.Stat(filepath.Join(dir, strconv.Itoa(cs), tb.digest[7:], "3"))
			if tt.wantErr && (!errors.Is(serr, os.ErrNotExist) || st.CachedChunks != 2) {
				t.Errorf("corrupt chunk 3: file %v, %d chunks cached; want no file, 2 chunks (2 and 4)", serr, st.CachedChunks)
			}
			if tt.wantErr {
				// The next read of chunk 3 fetches again (and the server is now honest).
				fs.mu.Lock()
				fs.corrupt[3] = 0
				fs.mu.Unlock()
				read(t, b, tb, 3*cs, cs)
			}
		})
	}
}

// With a cap, reads evict and never fail; a read larger than the cap
// succeeds with its chunks pinned, and the cache then shrinks.
func TestEviction(t *testing.T) {
	tb := newTestBlob(t)
	for name, mk := range sources(t, tb) {
		t.Run(name, func(t *testing.T) {
			src, _ := mk()
			c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs, MaxBytes: 3 * cs})
			b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
			for i := range int64(10) {
				read(t, b, tb, i*cs+1, 10)
			}
			st := c.Stats()
			if st.CachedBytes > 3*cs || st.Evictions != 7 {
				t.Errorf("after 10 chunks under a 3-chunk cap: %d bytes cached, %d evictions; want <= %d, 7", st.CachedBytes, st.Evictions, 3*cs)
			}
			read(t, b, tb, 0, 6*cs) // more than the cap in one read
			if st := c.Stats(); st.CachedBytes > 3*cs {
				t.Errorf("after a 6-chunk read: %d bytes cached, want <= %d", st.CachedBytes, 3*cs)
			}
			// The most recently used chunks stayed: 3, 4, 5.
			before := c.Stats().Fetches
			read(t, b, tb, 3*cs, 3*cs)
			if got := c.Stats().Fetches - before; got != 0 {
				t.Errorf("reading the 3 most recent chunks fetched %d times, want 0", got)
			}

			// Many concurrent readers over a small cache: every read succeeds.
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 1))
					for range 30 {
						off := r.Int64N(int64(len(tb.data)))
						n := 1 + r.IntN(2*cs)
						p := make([]byte, n)
						got, err := b.ReadAt(context.Background(), p, off)
						if err != nil && !errors.Is(err, io.EOF) {
							t.Errorf("ReadAt(%d at %d): %v", n, off, err)
							return
						}
						if !bytes.Equal(p[:got], tb.data[off:off+int64(got)]) {
							t.Errorf("ReadAt(%d at %d): other bytes than the blob's", n, off)
							return
						}
					}
				}()
			}
			wg.Wait()
			if st := c.Stats(); st.CachedBytes > 3*cs {
				t.Errorf("after concurrent reads: %d bytes cached, want <= %d", st.CachedBytes, 3*cs)
			}
		})
	}
}

// The cache survives a restart; torn files and temporary files are
// discarded.
func TestRestart(t *testing.T) {
	tb := newTestBlob(t)
	src, requests := sources(t, tb)["dir"]()
	dir := t.TempDir()
	c, err := New(dir, src, Options{ChunkSize: cs, Readahead: -1})
	if err != nil {
		t.Fatal(err)
	}
	b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
	read(t, b, tb, 0, 6*cs)
	read(t, b, tb, 20*cs, 1000)
	c.Close()

	chunkFile := func(i int) string { return filepath.Join(dir, strconv.Itoa(cs), tb.digest[7:], strconv.Itoa(i)) }
	if err := os.Truncate(chunkFile(1), cs/2); err != nil { // torn: short
		t.Fatal(err)
	}
	garbage := bytes.Repeat([]byte{0}, cs) // torn: zeroes after a crash
	if err := os.WriteFile(chunkFile(2), garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, strconv.Itoa(cs), tb.digest[7:], tmpPrefix+"crashed")
	if err := os.WriteFile(tmp, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(chunkFile(3)+"x", []byte("stray"), 0o600); err != nil {
		t.Fatal(err)
	}

	c2 := newCache(t, dir, src, Options{ChunkSize: cs})
	if st := c2.Stats(); st.CachedChunks != 7 {
		t.Errorf("after restart: %d chunks cached, want 7 (6 + the last)", st.CachedChunks)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file after restart: %v, want removed", err)
	}
	before := len(requests())
	b2 := c2.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
	read(t, b2, tb, 0, 6*cs)
	read(t, b2, tb, 20*cs, 1000)
	if diff := cmp.Diff([]string{"1-1", "2-2"}, requests()[before:], anyOrder); diff != "" {
		t.Errorf("range requests after restart (-want +got), only the torn chunks:\n%s", diff)
	}
	before = len(requests())
	read(t, b2, tb, 0, 6*cs)
	if got := requests()[before:]; len(got) != 0 {
		t.Errorf("second read after restart sent %q, want nothing", got)
	}
}

func TestDirectIO(t *testing.T) {
	tb := newTestBlob(t)
	src, _ := sources(t, tb)["dir"]()
	c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs, DirectIO: true, MaxBytes: 5 * cs})
	b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
	for _, r := range []struct {
		off int64
		n   int
	}{{0, 10}, {cs - 5, 4097}, {5*cs + 4095, 3 * cs}, {20*cs + 3, 997}, {0, 10}} {
		read(t, b, tb, r.off, r.n)
	}
	t.Logf("direct I/O in use: %v", c.direct.Load())
}

func TestBadArguments(t *testing.T) {
	tb := newTestBlob(t)
	src, _ := sources(t, tb)["dir"]()
	c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs})
	ctx := context.Background()
	p := make([]byte, 10)
	if _, err := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks[:3]).ReadAt(ctx, p, 0); err == nil {
		t.Error("ReadAt with too few chunk digests succeeded")
	}
	if _, err := c.Blob("sha256:../x", 10, nil).ReadAt(ctx, p, 0); err == nil {
		t.Error("ReadAt of a malformed digest succeeded")
	}
	b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
	if n, err := b.ReadAt(ctx, p, int64(len(tb.data))); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("ReadAt at the end = %d, %v, want 0, EOF", n, err)
	}
	// A size larger than the blob's: the missing bytes are an I/O error, not a short read.
	long := c.Blob(tb.digest, int64(len(tb.data))+cs, nil)
	if _, err := long.ReadAt(ctx, p, int64(len(tb.data))+10); !errors.Is(err, syscall.EIO) {
		t.Errorf("ReadAt past the real end = %v, want EIO", err)
	}
}

func TestDefaults(t *testing.T) {
	tb := newTestBlob(t)
	src, _ := sources(t, tb)["dir"]()
	c := newCache(t, t.TempDir(), src, Options{})
	if got := c.ChunkSize(); got != 1<<20 {
		t.Errorf("ChunkSize() = %d, want 1 MiB by default", got)
	}
	chunks, err := ChunkDigests(bytes.NewReader(tb.data), int64(len(tb.data)), c.ChunkSize())
	if err != nil {
		t.Fatal(err)
	}
	read(t, c.Blob(tb.digest, int64(len(tb.data)), chunks), tb, 0, len(tb.data))
	if st := c.Stats(); st.Fetches != 1 || st.BytesFetched != int64(len(tb.data)) {
		t.Errorf("reading %d bytes in 1 MiB chunks: %d fetches, %d bytes; want 1 (both chunks in one request), %d", len(tb.data), st.Fetches, st.BytesFetched, len(tb.data))
	}
}

func TestChunkDigests(t *testing.T) {
	data := []byte("abcdefghij")
	got, err := ChunkDigests(bytes.NewReader(data), 10, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{digestOf([]byte("abcd")), digestOf([]byte("efgh")), digestOf([]byte("ij"))}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ChunkDigests (-want +got):\n%s", diff)
	}
	if _, err := ChunkDigests(bytes.NewReader(data), 11, 4); err == nil {
		t.Error("ChunkDigests of a reader shorter than size succeeded")
	}
}

func TestParseChunkName(t *testing.T) {
	for name, want := range map[string]int64{"0": 0, "7": 7, "123": 123} {
		if got, ok := parseChunkName(name); !ok || got != want {
			t.Errorf("parseChunkName(%q) = %d, %v, want %d", name, got, ok, want)
		}
	}
	for _, name := range []string{"", "01", "-1", "+1", "1x", ".tmp-1", "9999999999999999999"} {
		if _, ok := parseChunkName(name); ok {
			t.Errorf("parseChunkName(%q) succeeded", name)
		}
	}
}

func FuzzParseChunkName(f *testing.F) {
	for _, s := range []string{"0", "12", "01", ".tmp-3", "999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		n, ok := parseChunkName(name)
		if ok && (n < 0 || strconv.FormatInt(n, 10) != name) {
			t.Errorf("parseChunkName(%q) = %d: does not round-trip", name, n)
		}
	})
}

var anyOrder = cmpopts.SortSlices(func(a, b string) bool { return a < b })

func TestCollector(t *testing.T) {
	tb := newTestBlob(t)
	src, _ := sources(t, tb)["dir"]()
	c := newCache(t, t.TempDir(), src, Options{ChunkSize: cs})
	b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
	read(t, b, tb, 0, 2*cs)
	read(t, b, tb, 0, 10)
	reg := metrics.New().Registry
	reg.MustRegister(NewCollector(c))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "dsec_chunkcache_") {
			continue
		}
		m := f.GetMetric()[0]
		switch {
		case m.GetCounter() != nil:
			got[f.GetName()] = m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			got[f.GetName()] = m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			got[f.GetName()+"_count"] = float64(m.GetHistogram().GetSampleCount())
		}
	}
	want := map[string]float64{
		"dsec_chunkcache_fetched_bytes_total":          2 * cs,
		"dsec_chunkcache_fetches_total":                1,
		"dsec_chunkcache_fetch_errors_total":           0,
		"dsec_chunkcache_hits_total":                   1,
		"dsec_chunkcache_misses_total":                 2,
		"dsec_chunkcache_evictions_total":              0,
		"dsec_chunkcache_corrupt_chunks_total":         0,
		"dsec_chunkcache_cached_bytes":                 2 * cs,
		"dsec_chunkcache_cached_chunks":                2,
		"dsec_chunkcache_fetches_in_flight":            0,
		"dsec_chunkcache_fetch_duration_seconds_count": 1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dsec_chunkcache_* metrics (-want +got):\n%s", diff)
	}
}

// BenchmarkRead reads a 32 MiB blob in 128 KiB reads (as FUSE sends
// them) through the cache from dsec blobserver over loopback HTTP: cold
// (a new cache each time, 1 MiB chunks, readahead 4) and warm.
func BenchmarkRead(b *testing.B) {
	const size = 32 << 20
	data := make([]byte, size)
	r := rand.New(rand.NewChaCha8([32]byte{9}))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	root := b.TempDir()
	st, err := blobstore.New(root)
	if err != nil {
		b.Fatal(err)
	}
	desc, err := st.Put(context.Background(), bytes.NewReader(data), "")
	if err != nil {
		b.Fatal(err)
	}
	chunks, _ := ChunkDigests(bytes.NewReader(data), size, 1<<20)
	h, _ := blobsource.NewServer(root, blobsource.ServerOptions{})
	ts := httptest.NewServer(h)
	defer ts.Close()
	src, _ := blobsource.NewHTTP(ts.URL, blobsource.HTTPOptions{})
	readAll := func(c *Cache) {
		blob := c.Blob(desc.Digest, size, chunks)
		p := make([]byte, 128<<10)
		for off := int64(0); off < size; off += int64(len(p)) {
			if _, err := blob.ReadAt(context.Background(), p, off); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, direct := range []bool{false, true} {
		b.Run(fmt.Sprintf("cold/direct=%v", direct), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				c, err := New(b.TempDir(), src, Options{DirectIO: direct})
				if err != nil {
					b.Fatal(err)
				}
				readAll(c)
				c.Close()
			}
		})
		b.Run(fmt.Sprintf("warm/direct=%v", direct), func(b *testing.B) {
			c, err := New(b.TempDir(), src, Options{DirectIO: direct})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			readAll(c)
			b.SetBytes(size)
			b.ResetTimer()
			for b.Loop() {
				readAll(c)
			}
		})
	}
}

// A chunk that cannot be written to the cache is still served.
func TestStoreFailureServesRead(t *testing.T) {
	tb := newTestBlob(t)
	src, requests := sources(t, tb)["dir"]()
	dir := t.TempDir()
	c := newCache(t, dir, src, Options{ChunkSize: cs})
	// A file where the blob's directory should be: every store fails.
	if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(cs), tb.digest[7:]), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b := c.Blob(tb.digest, int64(len(tb.data)), tb.chunks)
	read(t, b, tb, cs-10, 20) // chunks 0-1
	read(t, b, tb, cs-10, 20)
	if st := c.Stats(); st.CachedChunks != 0 || st.Fetches != 2 {
		t.Errorf("with an unwritable cache: %d chunks cached, %d fetches; want 0, 2 (fetched again)", st.CachedChunks, st.Fetches)
	}
	if got := len(requests()); got != 2 {
		t.Errorf("%d range requests, want 2", got)
	}
}
