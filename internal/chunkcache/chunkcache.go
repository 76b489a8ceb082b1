// Package chunkcache is the node-local cache of blob data fetched from a
// blobsource.Source in fixed-size chunks, shared by every lazy layer and
// sandbox of the node.
//
// Invariants:
//   - A chunk is in the cache only verified: fetched bytes are checked
//     against the chunk's digest, written to a temporary file and renamed
//     into place. A chunk that fails its check is refetched once and then
//     the read fails with EIO; it is never stored.
//   - A read never fails because the cache is full: chunks being read are
//     pinned, the least recently used unpinned chunks are evicted, and the
//     cap may be exceeded while more than MaxBytes is pinned.
//   - A fetch is bounded: each attempt has FetchTimeout, a failed attempt
//     is retried Retries times with backoff, then the read fails with an
//     error wrapping ErrIO (and so syscall.EIO).
//   - The cache survives a restart: New rebuilds the index from the
//     files, removes temporary files, and verifies a kept chunk again the
//     first time it is read, discarding it when it is torn.
package chunkcache

import (
	"context"
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/dsecproject/dsec/internal/blobsource"
)

// Options configures a Cache. The zero value works (with no size cap).
type Options struct {
	// ChunkSize is the unit of fetching and caching; default 1 MiB.
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
	// backoff; default 2, negative means none.
	Retries int
	// DirectIO opens cache files with O_DIRECT (Linux), so that cached data
	// is not kept a second time in the page cache.
	DirectIO bool
}

// ErrIO is wrapped by the errors of reads whose data could not be fetched
// after the retries. errors.Is(err, syscall.EIO) holds for them too, so
// a FUSE server returns EIO.
var ErrIO error = ioError{}

type ioError struct{}

func (ioError) Error() string        { return "blob data unavailable (I/O error)" }
func (ioError) Is(target error) bool { return target == syscall.EIO }

// Stats are the cache's counters since New.
type Stats struct {
	BytesFetched  int64 // bytes received from the source
	Fetches       int64 // range requests sent to the source (attempts)
	Hits          int64 // chunk lookups served from the cache
	Misses        int64 // chunk lookups that had to wait for a fetch
	Evictions     int64 // chunks evicted for the size cap
	CorruptChunks int64 // fetched chunks whose digest did not match
	FetchErrors   int64 // failed fetch attempts
	CachedBytes   int64 // bytes in the cache now
	CachedChunks  int64 // chunks in the cache now
	// FetchLatency counts fetch attempts by duration: FetchLatency[i]
	// those that took at most LatencyBuckets[i] seconds (cumulative, as
	// Prometheus has it); FetchLatencyCount and FetchLatencySum all.
	FetchLatency      []uint64
	FetchLatencyCount uint64
	FetchLatencySum   float64 // seconds
}

// LatencyBuckets are the upper bounds, in seconds, of Stats.FetchLatency.
var LatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Cache is a node-local chunk cache. Its methods are safe for concurrent
// use.
type Cache struct {
	dir  string
	src  blobsource.Source
	opts Options
}

// New opens the cache in dir (created when missing) over src, keeping
// the chunks a previous Cache left there.
func New(dir string, src blobsource.Source, opts Options) (*Cache, error) {
	return nil, errors.ErrUnsupported
}

// Close stops readahead fetches and waits for them. Reads after Close
// fail.
func (c *Cache) Close() error { return nil }

// Stats returns the cache's counters.
func (c *Cache) Stats() Stats { return Stats{} }

// Blob is a cached view of one blob. It is safe for concurrent use; a
// FUSE file system keeps one per open blob file, so that sequential
// reads are recognised for readahead.
type Blob struct {
	c            *Cache
	digest       string
	size         int64
	chunkDigests []string
}

// Blob returns a cached view of blob digest of size bytes.
// chunkDigests ("sha256:<hex>" of each ChunkSize piece, the last may be
// short; see ChunkDigests) verify every fetched chunk; nil means no
// verification (allowed only in tests). When chunkDigests has the wrong
// length, reads fail with ErrInvalidArgument.
func (c *Cache) Blob(digest string, size int64, chunkDigests []string) *Blob {
	return &Blob{c: c, digest: digest, size: size, chunkDigests: chunkDigests}
}

// Size returns the blob's size.
func (b *Blob) Size() int64 { return b.size }

// ReadAt reads len(p) bytes at off, fetching the missing chunks:
// adjacent misses are fetched with one range request, and concurrent
// readers of a chunk share one fetch. It is short only at the blob's
// end, with io.EOF.
func (b *Blob) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return 0, errors.ErrUnsupported
}

// ChunkDigests returns the "sha256:<hex>" digests of each chunkSize
// piece of the size bytes of r (the last may be short), as Blob takes
// them; they are computed when a layer is stored.
func ChunkDigests(r io.ReaderAt, size, chunkSize int64) ([]string, error) {
	return nil, errors.ErrUnsupported
}
