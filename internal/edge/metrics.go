package edge

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsecproject/dsec/internal/sandbox"
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

	// Where the paused sandboxes' memory is, as their last pause left it,
	// by project and backend (dsec_sandboxes{state="paused"} counts them).
	descPausedResident = prometheus.NewDesc("dsec_sandboxes_paused_resident_bytes", "Memory of the paused sandboxes still in RAM (what admission holds for them), by project and backend.", []string{"project", "backend"}, nil)
	descPausedSwapped  = prometheus.NewDesc("dsec_sandboxes_paused_swapped_bytes", "Memory of the paused sandboxes out of RAM, in the node's swap, by project and backend.", []string{"project", "backend"}, nil)

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

// netSeries are the network counters, aggregated over the node by backend
// (from one call, sandbox.NetworkTotaler: deleted sandboxes' counts stay in
// them) and, with MetricsPerSandbox, per sandbox with a network.
type netSeries struct {
	agg, per *prometheus.Desc
	kind     prometheus.ValueType
	node     func(sandbox.NetworkTotals) int64
	sandbox  func(sandbox.NetworkInfo) int64
}

func netDesc(name, help string, kind prometheus.ValueType, node func(sandbox.NetworkTotals) int64, sb func(sandbox.NetworkInfo) int64) netSeries {
	s := netSeries{kind: kind, node: node, sandbox: sb}
	s.agg = prometheus.NewDesc("dsec_net_"+name, help+", on this node, by backend.", []string{"backend"}, nil)
	if sb != nil {
		s.per = prometheus.NewDesc("dsec_net_sandbox_"+name, help+", per sandbox (dsec up --metrics-per-sandbox).", []string{"sandbox", "project"}, nil)
	}
	return s
}

var netSeriesAll = []netSeries{
	netDesc("bytes_out_total", "Bytes the sandboxes sent through the egress proxy", prometheus.CounterValue,
		func(t sandbox.NetworkTotals) int64 { return t.BytesOut }, func(i sandbox.NetworkInfo) int64 { return i.BytesOut }),
	netDesc("bytes_in_total", "Bytes the sandboxes received through the egress proxy", prometheus.CounterValue,
		func(t sandbox.NetworkTotals) int64 { return t.BytesIn }, func(i sandbox.NetworkInfo) int64 { return i.BytesIn }),
	netDesc("connections_total", "Connections the egress proxy let the sandboxes make", prometheus.CounterValue,
		func(t sandbox.NetworkTotals) int64 { return t.ConnsOut }, func(i sandbox.NetworkInfo) int64 { return i.ConnsOut }),
	netDesc("connections_active", "Connections of the sandboxes open now", prometheus.GaugeValue,
		func(t sandbox.NetworkTotals) int64 { return t.ConnsActive }, func(i sandbox.NetworkInfo) int64 { return i.ConnsActive }),
	netDesc("denied_total", "Connections of the sandboxes refused (by policy or by a budget)", prometheus.CounterValue,
		func(t sandbox.NetworkTotals) int64 { return t.Denied }, func(i sandbox.NetworkInfo) int64 { return i.Denied }),
	netDesc("dns_queries_total", "DNS queries the node resolver answered for the sandboxes", prometheus.CounterValue,
		func(t sandbox.NetworkTotals) int64 { return t.DNSQueries }, func(i sandbox.NetworkInfo) int64 { return i.DNSQueries }),
	netDesc("dns_denied_total", "Names the node resolver refused the sandboxes (NXDOMAIN by policy)", prometheus.CounterValue,
		func(t sandbox.NetworkTotals) int64 { return t.DNSDenied }, func(i sandbox.NetworkInfo) int64 { return i.DNSDenied }),
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ds := []*prometheus.Desc{descSandboxes, descAggCPU, descAggCPULimit, descAggMem, descAggMemLimit, descPausedResident, descPausedSwapped, descMemCommitted, descMemCapacity, descDiskCommitted}
	if c.e.cfg.MetricsPerSandbox {
		ds = append(ds, descCPU, descCPULimit, descMem, descMemLimit)
	}
	for _, s := range netSeriesAll {
		ds = append(ds, s.agg)
		if c.e.cfg.MetricsPerSandbox && s.per != nil {
			ds = append(ds, s.per)
		}
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
	type paused struct{ resident, swapped float64 }
	counts := map[stateKey]int{}
	for _, s := range []State{StateCreating, StateRunning, StatePaused, StateExited, StateFailed, StateDeleting} {
		counts[stateKey{s, c.e.cfg.DefaultBackend, "default"}] = 0
	}
	uses := map[useKey]*use{}
	pauses := map[useKey]*paused{{"default", c.e.cfg.DefaultBackend}: {}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, r := range recs {
		counts[stateKey{r.State, r.Backend, r.Project}]++
		if states[r.State].reclaimed {
			k := useKey{r.Project, r.Backend}
			p := pauses[k]
			if p == nil {
				p = &paused{}
				pauses[k] = p
			}
			p.resident += float64(memHeld(r))
			p.swapped += float64(r.Swapped)
		}
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
			if needsLink(r.Network) {
				info := c.e.networkCounters(ctx, r)
				for _, s := range netSeriesAll {
					ch <- prometheus.MustNewConstMetric(s.per, s.kind, float64(s.sandbox(info)), r.ID, r.Project)
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.e.cfg.Backends)) {
		nt, ok := c.e.cfg.Backends[name].(sandbox.NetworkTotaler)
		if !ok {
			continue
		}
		t, err := nt.NetworkTotals(ctx)
		if err != nil {
			// A keeper without networks (an older protocol): no series.
			continue
		}
		for _, s := range netSeriesAll {
			ch <- prometheus.MustNewConstMetric(s.agg, s.kind, float64(s.node(t)), name)
		}
	}
	for k, u := range uses {
		ch <- prometheus.MustNewConstMetric(descAggCPU, prometheus.GaugeValue, u.cpu, k.project, k.backend)
		ch <- prometheus.MustNewConstMetric(descAggCPULimit, prometheus.GaugeValue, u.cpus, k.project, k.backend)
		ch <- prometheus.MustNewConstMetric(descAggMem, prometheus.GaugeValue, u.mem, k.project, k.backend)
		ch <- prometheus.MustNewConstMetric(descAggMemLimit, prometheus.GaugeValue, u.memLimit, k.project, k.backend)
	}
	for k, p := range pauses {
		ch <- prometheus.MustNewConstMetric(descPausedResident, prometheus.GaugeValue, p.resident, k.project, k.backend)
		ch <- prometheus.MustNewConstMetric(descPausedSwapped, prometheus.GaugeValue, p.swapped, k.project, k.backend)
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(descSandboxes, prometheus.GaugeValue, float64(n), string(k.state), k.backend, k.project)
	}
	a := c.e.admission()
	ch <- prometheus.MustNewConstMetric(descMemCommitted, prometheus.GaugeValue, float64(a.MemoryCommitted))
	ch <- prometheus.MustNewConstMetric(descMemCapacity, prometheus.GaugeValue, float64(a.MemoryCapacity))
	ch <- prometheus.MustNewConstMetric(descDiskCommitted, prometheus.GaugeValue, float64(a.DiskCommitted))
}
