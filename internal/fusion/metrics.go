package fusion

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's dsec_sandboxfusion_* instruments. Their label
// values come from the server's own configuration (its languages, images
// and the outcomes), never from a request as sent, so that a client cannot
// grow the series.
type metrics struct {
	calls     *prometheus.CounterVec
	queueWait *prometheus.HistogramVec
}

var waitBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

func newMetrics() *metrics {
	return &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsec_sandboxfusion_calls_total",
			Help: "run_code calls by language and status (Success, Failed, SandboxError); an unknown language counts as \"other\".",
		}, []string{"language", "status"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dsec_sandboxfusion_queue_wait_seconds",
			Help:    "Time a run_code call waited for a free slot and a sandbox (including waits for room on the platform).",
			Buckets: waitBuckets,
		}, []string{"language"}),
	}
}

var (
	descPoolSize  = prometheus.NewDesc("dsec_sandboxfusion_pool_size", "Ready sandboxes a run_code pool keeps, by image and memory limit.", []string{"image", "memory_mib"}, nil)
	descPoolReady = prometheus.NewDesc("dsec_sandboxfusion_pool_ready", "Ready sandboxes a run_code pool holds now, by image and memory limit.", []string{"image", "memory_mib"}, nil)
	descInFlight  = prometheus.NewDesc("dsec_sandboxfusion_calls_in_flight", "run_code calls holding a slot (at most the server's concurrency limit).", nil, nil)
)

// collector exports a Server's metrics.
type collector struct{ s *Server }

var _ prometheus.Collector = collector{}

// Collector returns the server's dsec_sandboxfusion_* metrics, to register
// in the process's registry (internal/metrics).
func (s *Server) Collector() prometheus.Collector { return collector{s} }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	c.s.met.calls.Describe(ch)
	c.s.met.queueWait.Describe(ch)
	ch <- descPoolSize
	ch <- descPoolReady
	ch <- descInFlight
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.s.met.calls.Collect(ch)
	c.s.met.queueWait.Collect(ch)
	c.s.mu.Lock()
	pools := make([]*pool, 0, len(c.s.pools))
	for _, p := range c.s.pools {
		pools = append(pools, p)
	}
	c.s.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		ready := len(p.ready)
		p.mu.Unlock()
		mib := strconv.FormatInt(p.key.memory>>20, 10)
		ch <- prometheus.MustNewConstMetric(descPoolSize, prometheus.GaugeValue, float64(p.size), p.key.image, mib)
		ch <- prometheus.MustNewConstMetric(descPoolReady, prometheus.GaugeValue, float64(ready), p.key.image, mib)
	}
	ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(len(c.s.sem)))
}

// observe records one call of language (a name of the server's languages,
// or "" for an unknown one) that waited wait (0: it never queued).
func (m *metrics) observe(language string, status RunStatus, wait time.Duration, queued bool) {
	if language == "" {
		language = "other"
	}
	m.calls.WithLabelValues(language, string(status)).Inc()
	if queued {
		m.queueWait.WithLabelValues(language).Observe(wait.Seconds())
	}
}
