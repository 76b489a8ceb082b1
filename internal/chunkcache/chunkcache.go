// Package chunkcache is the node-local cache of blob data fetched from a
// blobsource.Source in fixed-size chunks, shared by every lazy layer and
// sandbox of the node.
//
// Layout: <dir>/<ChunkSize>/<blob hex>/<chunk index>, one file per chunk
// (the last chunk of a blob may be short). Files being written are
// ".tmp-*" files in the same directory.
//
// Invariants:
//   - A chunk is in the cache only verified: fetched bytes are checked
//     against the chunk's digest, written to a temporary file and renamed
//     into place. A chunk that fails its check is refetched once and then
//     the read fails with EIO; it is never stored.
//   - A read never fails because the cache is full: chunks being read are
//     pinned, the least recently used unpinned chunks are evicted, and the
//     cap may be exceeded while more than MaxBytes is pinned or in flight.
//   - A fetch is bounded: each attempt has FetchTimeout, a failed attempt
//     is retried Retries times with backoff, then the read fails with an
//     error wrapping ErrIO (and so syscall.EIO).
//   - Concurrent readers of a chunk share one fetch, which the Cache owns:
//     a reader that gives up does not cancel it for the others.
//   - The cache survives a restart: New rebuilds the index from the
//     files, removes temporary files, and verifies a kept chunk again
//     (size and digest) the first time it is read, discarding it when it
//     is torn.
package chunkcache

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dsecproject/dsec/internal/blobsource"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// Options configures a Cache. The zero value works (with no size cap).
type Options struct {
	// ChunkSize is the unit of fetching and caching; default 1 MiB. With
	// DirectIO it should be a multiple of 4 KiB.
	ChunkSize int64
	// MaxBytes caps the cached bytes; the least recently used chunks are
	// evicted beyond it. 0 means no cap.
	MaxBytes int64
	// Readahead is the number of chunks fetched ahead when a blob is read
	// sequentially; default 4, negative disables readahead.
	Readahead int
	// FetchTimeout bounds each fetch attempt; default 10 s.
	FetchTimeout time.Duration
	// Retries is the number of extra attempts of a failed fetch, with
	// backoff (100 ms, doubling); default 2, negative means none.
	Retries int
	// DirectIO opens cache files with O_DIRECT (Linux), so that cached data
	// is not kept a second time in the page cache. Where the file system
	// refuses O_DIRECT (tmpfs) the cache falls back to buffered I/O.
	DirectIO bool
	// Logger receives warnings (a discarded torn chunk, a fallback from
	// DirectIO); nil discards them.
	Logger *slog.Logger
}

const (
	defaultChunkSize = 1 << 20
	maxRunBytes      = 16 << 20 // largest range request
	tmpPrefix        = ".tmp-"
)

// retryBackoff is the wait before the first retry; it doubles after.
var retryBackoff = 100 * time.Millisecond

// ErrIO is wrapped by the errors of reads whose data could not be fetched
// after the retries. errors.Is(err, syscall.EIO) holds for them too, so
// a FUSE server returns EIO.
var ErrIO error = ioError{}

type ioError struct{}

func (ioError) Error() string        { return "blob data unavailable (I/O error)" }
func (ioError) Is(target error) bool { return target == syscall.EIO }

// Cache is a node-local chunk cache. Its methods are safe for concurrent
// use.
type Cache struct {
	root string // <dir>/<ChunkSize>, absolute
	src  blobsource.Source
	opts Options
	log  *slog.Logger

	// bg is the context of the fetches the Cache owns; Close cancels it
	// and waits for them with wg. It lives as long as the Cache.
	bg       context.Context
	bgCancel context.CancelFunc
	wg       sync.WaitGroup

	direct atomic.Bool // DirectIO, until the file system refuses it
	st     counters

	mu     sync.Mutex
	closed bool                // guarded by mu
	chunks map[chunkKey]*entry // guarded by mu
	lru    *list.List          // present chunks, most recent first; guarded by mu
	cached int64               // bytes of present chunks; guarded by mu
	dirs   map[string]struct{} // blob directories known to exist; guarded by mu
}

type chunkKey struct {
	blob string // hex digest
	idx  int64
}

type entryState int

const (
	stateFetching entryState = iota // being fetched or checked; done closes when it ends
	statePresent                    // its file holds the chunk
)

// entry is one chunk of the index. All fields are guarded by Cache.mu,
// except that done is closed once, after err or mem is set.
type entry struct {
	key      chunkKey
	state    entryState
	verified bool  // checked since New (false for chunks kept across a restart)
	size     int64 // bytes on disk when present
	pins     int   // readers reading or waiting for it
	done     chan struct{}
	err      error
	mem      []byte        // the data, when it was fetched but could not be stored
	elem     *list.Element // in lru when present
	mtime    time.Time     // when rebuilt from disk: its file's modification time
}

// New opens the cache in dir (created when missing) over src, keeping
// the chunks a previous Cache of the same ChunkSize left there. Chunks of
// another ChunkSize are removed.
func New(dir string, src blobsource.Source, opts Options) (*Cache, error) {
	if src == nil {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "chunk cache: no blob source")
	}
	if opts.ChunkSize == 0 {
		opts.ChunkSize = defaultChunkSize
	}
	if opts.ChunkSize < 0 || opts.MaxBytes < 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "chunk cache: ChunkSize and MaxBytes cannot be negative")
	}
	if opts.Readahead == 0 {
		opts.Readahead = 4
	}
	if opts.FetchTimeout <= 0 {
		opts.FetchTimeout = 10 * time.Second
	}
	if opts.Retries == 0 {
		opts.Retries = 2
	}
	opts.Readahead = max(opts.Readahead, 0)
	opts.Retries = max(opts.Retries, 0)
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("chunk cache %s: %w", dir, err)
	}
	c := &Cache{
		root:   filepath.Join(abs, strconv.FormatInt(opts.ChunkSize, 10)),
		src:    src,
		opts:   opts,
		log:    opts.Logger,
		chunks: make(map[chunkKey]*entry),
		lru:    list.New(),
		dirs:   make(map[string]struct{}),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.direct.Store(opts.DirectIO)
	c.st.init()
	if err := os.MkdirAll(c.root, 0o700); err != nil {
		return nil, fmt.Errorf("create chunk cache: %w", err)
	}
	if err := c.removeOtherChunkSizes(abs); err != nil {
		return nil, err
	}
	if err := c.rebuild(); err != nil {
		return nil, err
	}
	c.bg, c.bgCancel = context.WithCancel(context.Background())
	return c, nil
}

func (c *Cache) removeOtherChunkSizes(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read chunk cache: %w", err)
	}
	for _, e := range entries {
		if n, err := strconv.ParseInt(e.Name(), 10, 64); err == nil && n > 0 && n != c.opts.ChunkSize && e.IsDir() {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("remove chunks of another chunk size: %w", err)
			}
		}
	}
	return nil
}

// rebuild fills the index from the files of a previous Cache. The chunks
// stay unverified until read.
func (c *Cache) rebuild() error {
	blobs, err := os.ReadDir(c.root)
	if err != nil {
		return fmt.Errorf("read chunk cache: %w", err)
	}
	var found []*entry
	for _, b := range blobs {
		bdir := filepath.Join(c.root, b.Name())
		if !b.IsDir() || !isHex(b.Name()) {
			if err := os.RemoveAll(bdir); err != nil {
				return fmt.Errorf("remove stray chunk cache entry: %w", err)
			}
			continue
		}
		files, err := os.ReadDir(bdir)
		if err != nil {
			return fmt.Errorf("read chunk cache: %w", err)
		}
		if len(files) == 0 {
			_ = os.Remove(bdir)
			continue
		}
		c.dirs[bdir] = struct{}{}
		for _, f := range files {
			p := filepath.Join(bdir, f.Name())
			idx, ok := parseChunkName(f.Name())
			var fi fs.FileInfo
			if ok && f.Type().IsRegular() {
				fi, err = f.Info()
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					return fmt.Errorf("read chunk cache: %w", err)
				}
			}
			if fi == nil || fi.Size() == 0 || fi.Size() > c.opts.ChunkSize {
				// A temporary file of a crashed write, or a torn chunk.
				if err := os.RemoveAll(p); err != nil {
					return fmt.Errorf("remove torn chunk: %w", err)
				}
				continue
			}
			found = append(found, &entry{
				key:   chunkKey{blob: b.Name(), idx: idx},
				state: statePresent,
				size:  fi.Size(),
				mtime: fi.ModTime(),
			})
		}
	}
	// Oldest at the back of the LRU list.
	slices.SortFunc(found, func(a, b *entry) int { return b.mtime.Compare(a.mtime) })
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range found {
		e.elem = c.lru.PushBack(e)
		c.chunks[e.key] = e
		c.cached += e.size
	}
	c.evictLocked()
	return nil
}

// parseChunkName parses a chunk file's name: a decimal index without
// leading zeros.
func parseChunkName(name string) (int64, bool) {
	if name == "" || len(name) > 18 || (name[0] == '0' && len(name) > 1) {
		return 0, false
	}
	for i := 0; i < len(name); i++ {
		if name[i] < '0' || name[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(name, 10, 64)
	return n, err == nil
}

func isHex(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ChunkSize returns the cache's chunk size, which the chunk digests given
// to Blob must have been computed with.
func (c *Cache) ChunkSize() int64 { return c.opts.ChunkSize }

// Close stops the fetches in flight and waits for them. Reads after Close
// fail; the cached chunks stay on disk for the next Cache.
func (c *Cache) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.bgCancel()
	c.wg.Wait()
	return nil
}

func (c *Cache) chunkPath(k chunkKey) string {
	return filepath.Join(c.root, k.blob, strconv.FormatInt(k.idx, 10))
}

// evictLocked removes least recently used unpinned chunks until the cache
// is within MaxBytes.
func (c *Cache) evictLocked() {
	if c.opts.MaxBytes <= 0 {
		return
	}
	for el := c.lru.Back(); el != nil && c.cached > c.opts.MaxBytes; {
		e := el.Value.(*entry)
		prev := el.Prev()
		if e.pins == 0 {
			c.lru.Remove(el)
			e.elem = nil
			delete(c.chunks, e.key)
			c.cached -= e.size
			c.st.evictions.Add(1)
			if err := os.Remove(c.chunkPath(e.key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				c.log.Warn("chunk cache: remove evicted chunk", "err", err)
			}
		}
		el = prev
	}
}

// Blob is a cached view of one blob. It is safe for concurrent use; a
// FUSE file system keeps one per open blob file, so that sequential
// reads are recognised for readahead.
type Blob struct {
	c            *Cache
	digest       string
	hex          string
	size         int64
	chunkDigests []string
	err          error // why the arguments of Cache.Blob are unusable

	mu       sync.Mutex
	lastRead int64 // last chunk of the previous read; guarded by mu
}

// Blob returns a cached view of blob digest of size bytes.
// chunkDigests ("sha256:<hex>" of each ChunkSize piece, the last may be
// short; see ChunkDigests) verify every fetched chunk; nil means no
// verification (allowed only in tests). When the digest is malformed or
// chunkDigests has the wrong length, reads fail with ErrInvalidArgument.
func (c *Cache) Blob(digest string, size int64, chunkDigests []string) *Blob {
	b := &Blob{c: c, digest: digest, size: size, chunkDigests: chunkDigests, lastRead: -1}
	algo, h, _ := strings.Cut(digest, ":")
	switch {
	case algo != "sha256" || !isHex(h):
		b.err = errdefs.Newf(errdefs.ErrInvalidArgument, "blob digest %.80q: want sha256: followed by 64 lowercase hex digits", digest)
	case size < 0:
		b.err = errdefs.Newf(errdefs.ErrInvalidArgument, "blob %s: negative size %d", digest, size)
	case chunkDigests != nil && int64(len(chunkDigests)) != b.chunks(size, c.opts.ChunkSize):
		b.err = errdefs.Newf(errdefs.ErrInvalidArgument, "blob %s: %d chunk digests for %d chunks of %d bytes",
			digest, len(chunkDigests), b.chunks(size, c.opts.ChunkSize), c.opts.ChunkSize)
	}
	b.hex = h
	return b
}

func (b *Blob) chunks(size, cs int64) int64 { return (size + cs - 1) / cs }

// Size returns the blob's size.
func (b *Blob) Size() int64 { return b.size }

// chunkLen is the length of chunk idx.
func (b *Blob) chunkLen(idx int64) int64 {
	cs := b.c.opts.ChunkSize
	return min(cs, b.size-idx*cs)
}

// ReadAt reads len(p) bytes at off, fetching the missing chunks:
// adjacent misses are fetched with one range request, and concurrent
// readers of a chunk share one fetch. It is short only at the blob's
// end, with io.EOF.
func (b *Blob) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if off < 0 {
		return 0, errdefs.Newf(errdefs.ErrInvalidArgument, "blob %s: negative offset %d", b.digest, off)
	}
	if off >= b.size {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	c := b.c
	cs := c.opts.ChunkSize
	end := min(off+int64(len(p)), b.size)
	first, last := off/cs, (end-1)/cs
	nchunks := b.chunks(b.size, cs)

	b.mu.Lock()
	sequential := first == b.lastRead || first == b.lastRead+1
	b.lastRead = last
	b.mu.Unlock()

	// Look the chunks up, pinning them, and claim the fetches of the
	// missing ones.
	entries := make([]*entry, 0, last-first+1)
	var fetch, verify, ahead []int64
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, fmt.Errorf("read blob %s: chunk cache closed: %w", b.digest, errdefs.ErrUnavailable)
	}
	for i := first; i <= last; i++ {
		k := chunkKey{blob: b.hex, idx: i}
		e := c.chunks[k]
		switch {
		case e == nil:
			e = &entry{key: k, state: stateFetching, done: make(chan struct{})}
			c.chunks[k] = e
			fetch = append(fetch, i)
			c.st.misses.Add(1)
		case e.state == statePresent && e.verified:
			c.lru.MoveToFront(e.elem)
			c.st.hits.Add(1)
		case e.state == statePresent: // kept across a restart: check it first
			c.lru.Remove(e.elem)
			e.elem = nil
			c.cached -= e.size
			e.state, e.done = stateFetching, make(chan struct{})
			verify = append(verify, i)
			c.st.misses.Add(1)
		default: // another reader's fetch
			c.st.misses.Add(1)
		}
		e.pins++
		entries = append(entries, e)
	}
	if sequential {
		for i := last + 1; i <= last+int64(c.opts.Readahead) && i < nchunks; i++ {
			k := chunkKey{blob: b.hex, idx: i}
			if c.chunks[k] == nil {
				c.chunks[k] = &entry{key: k, state: stateFetching, done: make(chan struct{})}
				ahead = append(ahead, i)
			}
		}
	}
	fetchRuns := runs(fetch, max(1, maxRunBytes/cs))
	aheadRuns := runs(ahead, max(1, maxRunBytes/cs))
	// Added under mu, so that a Close that saw closed unset waits for them;
	// counted in flight before the read returns.
	started := len(verify) + len(fetchRuns) + len(aheadRuns)
	c.wg.Add(started)
	c.st.inFlight.Add(int64(started))
	c.mu.Unlock()

	for _, i := range verify {
		c.startFetch(b, []int64{i}, true)
	}
	for _, run := range fetchRuns {
		c.startFetch(b, run, false)
	}
	for _, run := range aheadRuns {
		c.startFetch(b, run, false)
	}

	n, err := b.copyOut(ctx, entries, p, off, end, first)
	c.mu.Lock()
	for _, e := range entries {
		e.pins--
	}
	c.evictLocked()
	c.mu.Unlock()
	if err != nil {
		return n, err
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// copyOut waits for each pinned chunk and copies its part of [off, end)
// into p.
func (b *Blob) copyOut(ctx context.Context, entries []*entry, p []byte, off, end, first int64) (int, error) {
	c := b.c
	cs := c.opts.ChunkSize
	n := 0
	for j, e := range entries {
		if e.done != nil {
			select {
			case <-e.done:
			case <-ctx.Done():
				return n, fmt.Errorf("read blob %s: %w", b.digest, ctx.Err())
			}
			if e.err != nil {
				return n, e.err
			}
		}
		idx := first + int64(j)
		lo := max(off, idx*cs)
		hi := min(end, (idx+1)*cs)
		if e.mem != nil {
			copy(p[lo-off:hi-off], e.mem[lo-idx*cs:])
		} else if err := c.readChunk(e.key, p[lo-off:hi-off], lo-idx*cs); err != nil {
			return n, fmt.Errorf("read blob %s chunk %d from the cache: %w: %w", b.digest, idx, ErrIO, err)
		}
		n += int(hi - lo)
	}
	return n, nil
}

// runs splits sorted chunk indices into runs of adjacent ones of at most
// maxLen chunks.
func runs(idx []int64, maxLen int64) [][]int64 {
	var out [][]int64
	for len(idx) > 0 {
		n := 1
		for n < len(idx) && int64(n) < maxLen && idx[n] == idx[n-1]+1 {
			n++
		}
		out = append(out, idx[:n:n])
		idx = idx[n:]
	}
	return out
}

// ChunkDigests returns the "sha256:<hex>" digests of each chunkSize
// piece of the size bytes of r (the last may be short), as Blob takes
// them; they are computed when a layer is stored.
func ChunkDigests(r io.ReaderAt, size, chunkSize int64) ([]string, error) {
	if size < 0 || chunkSize <= 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "chunk digests: want size >= 0 and chunkSize > 0")
	}
	out := make([]string, 0, (size+chunkSize-1)/chunkSize)
	buf := make([]byte, min(chunkSize, max(size, 1)))
	for off := int64(0); off < size; off += chunkSize {
		p := buf[:min(chunkSize, size-off)]
		if n, err := r.ReadAt(p, off); n < len(p) {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("chunk digests at %d: %w", off, err)
		}
		out = append(out, digestOf(p))
	}
	return out, nil
}

func digestOf(p []byte) string {
	sum := sha256.Sum256(p)
	return "sha256:" + hex.EncodeToString(sum[:])
}
