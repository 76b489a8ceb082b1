//go:build linux

// Package harness is what dsec's benchmarks share: starting a private
// `dsec up` and stopping it without a trace, a helper process that runs
// OCI runtimes and daemons as their subreaper, latency summaries, and the
// host's counters (memory, CPU time, processes, cgroups, mounts, loop
// devices) that the figures are computed from.
//
// Everything it starts lives under a temporary directory and a cgroup
// parent of the caller's choosing, so that a benchmark never touches a dsec
// or a docker that runs on the machine.
package harness

import (
	"math"
	"slices"
	"time"
)

// Summary is a latency distribution, in milliseconds.
type Summary struct {
	// Name says what was measured ("crun run (true)"); System is the system
	// measured ("crun").
	Name   string  `json:"name"`
	System string  `json:"system"`
	N      int     `json:"n"`
	P50    float64 `json:"p50_ms"`
	P90    float64 `json:"p90_ms"`
	P99    float64 `json:"p99_ms"`
	Mean   float64 `json:"mean_ms"`
	Min    float64 `json:"min_ms"`
	Max    float64 `json:"max_ms"`
	// Samples are every measurement, sorted.
	Samples []float64 `json:"samples_ms,omitempty"`
	// Skipped says why there are no samples ("skipped: docker.io not
	// installed").
	Skipped string `json:"skipped,omitempty"`
}

// Summarize sorts ds and summarises them; percentiles are nearest-rank
// (the smallest sample with at least p of the samples at or below it).
func Summarize(name, system string, ds []time.Duration) Summary {
	s := Summary{Name: name, System: system, N: len(ds)}
	if len(ds) == 0 {
		return s
	}
	ms := make([]float64, len(ds))
	var sum float64
	for i, d := range ds {
		ms[i] = float64(d.Nanoseconds()) / 1e6
		sum += ms[i]
	}
	slices.Sort(ms)
	s.Samples = ms
	s.P50 = Percentile(ms, 0.50)
	s.P90 = Percentile(ms, 0.90)
	s.P99 = Percentile(ms, 0.99)
	s.Mean = sum / float64(len(ms))
	s.Min, s.Max = ms[0], ms[len(ms)-1]
	return s
}

// Percentile returns the nearest-rank p-quantile (0 < p ≤ 1) of sorted
// values, or 0 when there are none.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
