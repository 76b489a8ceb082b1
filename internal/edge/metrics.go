package edge

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// collector reports the node's sandboxes to Prometheus at scrape time.
//
// /metrics needs no key on loopback, so by default it shows aggregates only,
// by project, backend and state: how many sandboxes there are, and what the
// running ones use against what they asked for. Series labelled with sandbox
// IDs, which would tell any local user every tenant's sandboxes, are there
// only with Config.MetricsPerSandbox (dsec up --metrics-per-sandbox).
type collector struct{ e *Edge }

var (
	descSandboxes = prometheus.NewDesc("dsec_sandboxes", "Sandboxes on this node by state, backend and project.", []string{"state", "backend", "project"}, nil)

	// Aggregates of the running sandboxes, by project and backend.
	descAggCPU      = prometheus.NewDesc("dsec_sandboxes_cpu_seconds", "CPU time the running sandboxes have used, by project and backend.", []string{"project", "backend"}, nil)
	descAggCPULimit = prometheus.NewDesc("dsec_sandboxes_cpus_limit", "CPU caps of the running sandboxes added up, in cores, by project and backend.", []string{"project", "backend"}, nil)
	descAggMem      = prometheus.NewDesc("dsec_sandboxes_memory_bytes", "Memory the running sandboxes use, by project and backend.", []string{"project", "backend"}, nil)
	descAggMemLimit = prometheus.NewDesc("dsec_sandboxes_memory_limit_bytes", "Memory limits of the running sandboxes added up, by project and backend.", []string{"project", "backend"}, nil)

	// What admission holds: every sandbox with a record, in any state,
	// holds its memory limit until it is deleted; capacity is what the
	// memory limits may add up to (the node's memory, or the sandboxes'
	// memory ceiling, times the memory overcommit).
	descMemCommitted  = prometheus.NewDesc("dsec_node_memory_committed_bytes", "Memory limits admitted on this node: the sandboxes' that are not yet deleted, in any state.", nil, nil)
	descMemCapacity   = prometheus.NewDesc("dsec_node_memory_capacity_bytes", "Memory limits this node admits in all (its memory times --memory-overcommit).", nil, nil)
	descDiskCommitted = prometheus.NewDesc("dsec_node_disk_committed_bytes", "Writable disks and exec output quotas admitted on this node (sandboxes not yet deleted).", nil, nil)

	// Per sandbox, only with MetricsPerSandbox.
	descCPU      = prometheus.NewDesc("dsec_sandbox_cpu_seconds_total", "CPU time a sandbox used (dsec up --metrics-per-sandbox).", []string{"sandbox", "project"}, nil)
	descCPULimit = prometheus.NewDesc("dsec_sandbox_cpus_limit", "CPU cap of a sandbox, in cores (dsec up --metrics-per-sandbox).", []string{"sandbox", "project"}, nil)
	descMem      = prometheus.NewDesc("dsec_sandbox_memory_bytes", "Memory a sandbox uses (dsec up --metrics-per-sandbox).", []string{"sandbox", "project"}, nil)
	descMemLimit = prometheus.NewDesc("dsec_sandbox_memory_limit_bytes", "Memory limit of a sandbox (dsec up --metrics-per-sandbox).", []string{"sandbox", "project"}, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ds := []*prometheus.Desc{descSandboxes, descAggCPU, descAggCPULimit, descAggMem, descAggMemLimit, descMemCommitted, descMemCapacity, descDiskCommitted}
	if c.e.cfg.MetricsPerSandbox {
		ds = append(ds, descCPU, descCPULimit, descMem, descMemLimit)
	}
	for _, d := range ds {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	recs, err := c.e.store.list()
	if err != nil {
		return
	}
	type stateKey struct {
		state            State
		backend, project string
	}
	type useKey struct{ project, backend string }
	type use struct{ cpu, cpus, mem, memLimit float64 }
	counts := map[stateKey]int{}
	for _, s := range []State{StateCreating, StateRunning, StateExited, StateFailed, StateDeleting} {
		counts[stateKey{s, c.e.cfg.DefaultBackend, "default"}] = 0
	}
	uses := map[useKey]*use{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, r := range recs {
		counts[stateKey{r.State, r.Backend, r.Project}]++
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
		k := useKey{r.Project, r.Backend}
		u := uses[k]
		if u == nil {
			u = &use{}
			uses[k] = u
		}
		u.cpu += st.CPUUsage.Seconds()
		u.cpus += r.Resources.CPUs
		u.mem += float64(st.MemoryBytes)
		u.memLimit += float64(r.Resources.MemoryBytes)
		if c.e.cfg.MetricsPerSandbox {
			ch <- prometheus.MustNewConstMetric(descCPU, prometheus.CounterValue, st.CPUUsage.Seconds(), r.ID, r.Project)
			ch <- prometheus.MustNewConstMetric(descCPULimit, prometheus.GaugeValue, r.Resources.CPUs, r.ID, r.Project)
			ch <- prometheus.MustNewConstMetric(descMem, prometheus.GaugeValue, float64(st.MemoryBytes), r.ID, r.Project)
			ch <- prometheus.MustNewConstMetric(descMemLimit, prometheus.GaugeValue, float64(r.Resources.MemoryBytes), r.ID, r.Project)
		}
	}
	for k, u := range uses {
		ch <- prometheus.MustNewConstMetric(descAggCPU, prometheus.GaugeValue, u.cpu, k.project, k.backend)
		ch <- prometheus.MustNewConstMetric(descAggCPULimit, prometheus.GaugeValue, u.cpus, k.project, k.backend)
		ch <- prometheus.MustNewConstMetric(descAggMem, prometheus.GaugeValue, u.mem, k.project, k.backend)
		ch <- prometheus.MustNewConstMetric(descAggMemLimit, prometheus.GaugeValue, u.memLimit, k.project, k.backend)
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(descSandboxes, prometheus.GaugeValue, float64(n), string(k.state), k.backend, k.project)
	}
	a := c.e.admission()
	ch <- prometheus.MustNewConstMetric(descMemCommitted, prometheus.GaugeValue, float64(a.MemoryCommitted))
	ch <- prometheus.MustNewConstMetric(descMemCapacity, prometheus.GaugeValue, float64(a.MemoryCapacity))
	ch <- prometheus.MustNewConstMetric(descDiskCommitted, prometheus.GaugeValue, float64(a.DiskCommitted))
}
