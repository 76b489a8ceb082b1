package chunkcache

import (
	"sync"
	"sync/atomic"
	"time"
)

// Stats are the cache's counters since New.
type Stats struct {
	BytesFetched  int64 // bytes received from the source
	Fetches       int64 // range requests sent to the source (attempts)
	Hits          int64 // chunk lookups served from the cache
	Misses        int64 // chunk lookups that had to wait for a fetch (or a check after a restart)
	Evictions     int64 // chunks evicted for the size cap
	CorruptChunks int64 // fetched chunks whose digest did not match
	FetchErrors   int64 // failed fetch attempts
	CachedBytes   int64 // bytes in the cache now
	CachedChunks  int64 // chunks in the cache now
	// FetchesInFlight are the fetches (demanded or read ahead) started
	// and not yet ended. A read counts its readahead here before it
	// returns, so zero after a read means that read's fetches are done.
	FetchesInFlight int64
	// FetchLatency counts fetch attempts by duration: FetchLatency[i]
	// those that took at most LatencyBuckets[i] seconds (cumulative, as
	// Prometheus has it); FetchLatencyCount and FetchLatencySum all.
	FetchLatency      []uint64
	FetchLatencyCount uint64
	FetchLatencySum   float64 // seconds
}

// LatencyBuckets are the upper bounds, in seconds, of Stats.FetchLatency.
var LatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

type counters struct {
	bytesFetched, fetches, hits, misses, evictions, corrupt, fetchErrors atomic.Int64
	inFlight                                                             atomic.Int64

	mu      sync.Mutex
	buckets []uint64 // guarded by mu; not cumulative
	count   uint64   // guarded by mu
	sum     float64  // guarded by mu
}

func (s *counters) init() { s.buckets = make([]uint64, len(LatencyBuckets)) }

func (s *counters) fetched(n int, d time.Duration) {
	s.fetches.Add(1)
	s.bytesFetched.Add(int64(n))
	sec := d.Seconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, ub := range LatencyBuckets {
		if sec <= ub {
			s.buckets[i]++
			break
		}
	}
	s.count++
	s.sum += sec
}

// Stats returns the cache's counters.
func (c *Cache) Stats() Stats {
	st := Stats{
		BytesFetched:  c.st.bytesFetched.Load(),
		Fetches:       c.st.fetches.Load(),
		Hits:          c.st.hits.Load(),
		Misses:        c.st.misses.Load(),
		Evictions:     c.st.evictions.Load(),
		CorruptChunks: c.st.corrupt.Load(),
		FetchErrors:   c.st.fetchErrors.Load(),

		FetchesInFlight: c.st.inFlight.Load(),
	}
	c.mu.Lock()
	st.CachedBytes = c.cached
	st.CachedChunks = int64(c.lru.Len())
	c.mu.Unlock()
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	st.FetchLatency = make([]uint64, len(LatencyBuckets))
	var cum uint64
	for i, n := range c.st.buckets {
		cum += n
		st.FetchLatency[i] = cum
	}
	st.FetchLatencyCount, st.FetchLatencySum = c.st.count, c.st.sum
	return st
}
