package edge

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// collector reports the node's sandboxes to Prometheus at scrape time:
// how many are in each state, and per running sandbox its CPU time, CPU
// cap, memory and memory limit (CPU used against CPU requested).
type collector struct{ e *Edge }

var (
	descSandboxes = prometheus.NewDesc("dsec_sandboxes", "Sandboxes on this node by state and backend.", []string{"state", "backend"}, nil)
	descCPU       = prometheus.NewDesc("dsec_sandbox_cpu_seconds_total", "CPU time a sandbox used.", []string{"sandbox"}, nil)
	descCPULimit  = prometheus.NewDesc("dsec_sandbox_cpus_limit", "CPU cap of a sandbox, in cores.", []string{"sandbox"}, nil)
	descMem       = prometheus.NewDesc("dsec_sandbox_memory_bytes", "Memory a sandbox uses.", []string{"sandbox"}, nil)
	descMemLimit  = prometheus.NewDesc("dsec_sandbox_memory_limit_bytes", "Memory limit of a sandbox.", []string{"sandbox"}, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSandboxes, descCPU, descCPULimit, descMem, descMemLimit} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	recs, err := c.e.store.list()
	if err != nil {
		return
	}
	type key struct{ state, backend string }
	counts := map[key]int{}
	for _, s := range []string{StateCreating, StateRunning, StateExited, StateFailed, StateDeleting} {
		counts[key{s, c.e.cfg.DefaultBackend}] = 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, r := range recs {
		counts[key{r.State, r.Backend}]++
		if r.State != StateRunning {
			continue
		}
		be, err := c.e.backend(r.Backend)
		if err != nil {
			continue
		}
		st, err := be.Stats(ctx, r.ID)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descCPU, prometheus.CounterValue, st.CPUUsage.Seconds(), r.ID)
		ch <- prometheus.MustNewConstMetric(descCPULimit, prometheus.GaugeValue, r.Resources.CPUs, r.ID)
		ch <- prometheus.MustNewConstMetric(descMem, prometheus.GaugeValue, float64(st.MemoryBytes), r.ID)
		ch <- prometheus.MustNewConstMetric(descMemLimit, prometheus.GaugeValue, float64(r.Resources.MemoryBytes), r.ID)
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(descSandboxes, prometheus.GaugeValue, float64(n), k.state, k.backend)
	}
}
