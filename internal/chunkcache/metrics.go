package chunkcache

import "github.com/prometheus/client_golang/prometheus"

// Collector exports a Cache's Stats as dsec_chunkcache_* Prometheus
// metrics, read at each scrape. Register it in the process's registry
// (internal/metrics: m.Registry.MustRegister(chunkcache.NewCollector(cache))).
type Collector struct {
	stats func() (Stats, bool)
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector of c's Stats.
func NewCollector(c *Cache) *Collector {
	return &Collector{stats: func() (Stats, bool) { return c.Stats(), true }}
}

// NewStatsCollector exports the Stats that stats returns at each scrape,
// from a cache in another process (the node keeper's); it exports nothing
// while stats reports none (no cache, or its process does not answer).
func NewStatsCollector(stats func() (Stats, bool)) *Collector { return &Collector{stats: stats} }

var (
	descBytesFetched = prometheus.NewDesc("dsec_chunkcache_fetched_bytes_total", "Bytes fetched from the blob source.", nil, nil)
	descFetches      = prometheus.NewDesc("dsec_chunkcache_fetches_total", "Range requests sent to the blob source.", nil, nil)
	descFetchErrors  = prometheus.NewDesc("dsec_chunkcache_fetch_errors_total", "Failed range requests to the blob source.", nil, nil)
	descHits         = prometheus.NewDesc("dsec_chunkcache_hits_total", "Chunk lookups served from the cache.", nil, nil)
	descMisses       = prometheus.NewDesc("dsec_chunkcache_misses_total", "Chunk lookups that waited for a fetch.", nil, nil)
	descEvictions    = prometheus.NewDesc("dsec_chunkcache_evictions_total", "Chunks evicted for the size cap.", nil, nil)
	descCorrupt      = prometheus.NewDesc("dsec_chunkcache_corrupt_chunks_total", "Fetched chunks whose digest did not match.", nil, nil)
	descCachedBytes  = prometheus.NewDesc("dsec_chunkcache_cached_bytes", "Bytes in the chunk cache.", nil, nil)
	descCachedChunks = prometheus.NewDesc("dsec_chunkcache_cached_chunks", "Chunks in the chunk cache.", nil, nil)
	descInFlight     = prometheus.NewDesc("dsec_chunkcache_fetches_in_flight", "Fetches from the blob source started and not yet ended (demanded or read ahead).", nil, nil)
	descLatency      = prometheus.NewDesc("dsec_chunkcache_fetch_duration_seconds", "Duration of range requests to the blob source.", nil, nil)
)

// Describe implements prometheus.Collector.
func (m *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBytesFetched, descFetches, descFetchErrors, descHits, descMisses,
		descEvictions, descCorrupt, descCachedBytes, descCachedChunks, descInFlight, descLatency} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Collector) Collect(ch chan<- prometheus.Metric) {
	st, ok := m.stats()
	if !ok {
		return
	}
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(descBytesFetched, st.BytesFetched)
	counter(descFetches, st.Fetches)
	counter(descFetchErrors, st.FetchErrors)
	counter(descHits, st.Hits)
	counter(descMisses, st.Misses)
	counter(descEvictions, st.Evictions)
	counter(descCorrupt, st.CorruptChunks)
	ch <- prometheus.MustNewConstMetric(descCachedBytes, prometheus.GaugeValue, float64(st.CachedBytes))
	ch <- prometheus.MustNewConstMetric(descCachedChunks, prometheus.GaugeValue, float64(st.CachedChunks))
	ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(st.FetchesInFlight))
	buckets := make(map[float64]uint64, len(LatencyBuckets))
	for i, ub := range LatencyBuckets {
		if i < len(st.FetchLatency) {
			buckets[ub] = st.FetchLatency[i]
		}
	}
	ch <- prometheus.MustNewConstHistogram(descLatency, st.FetchLatencyCount, st.FetchLatencySum, buckets)
}
