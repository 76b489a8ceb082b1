//go:build linux

package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
)

// Result is the suite's JSON.
type Result struct {
	Host   HostInfo   `json:"host"`
	Config ConfigInfo `json:"config"`
	// CreateFirstExec is figure 1: asking for a sandbox until a first
	// command in it has ended.
	CreateFirstExec []LatencyRow `json:"create_first_exec"`
	// ExecRTT is figure 2: a command (true) in a running sandbox.
	ExecRTT []LatencyRow `json:"exec_rtt"`
	// BackgroundCPUPct is the host's busy CPU while every system idled, in
	// percent of one CPU; the net CPU figures subtract it.
	BackgroundCPUPct float64 `json:"background_cpu_pct"`
	// Burst is figures 3 and 5: creations per second and CPU per create.
	Burst []BurstRow `json:"burst"`
	// IdleMemory is figure 4.
	IdleMemory []MemoryRow `json:"idle_memory"`
	Targets    []Target    `json:"targets"`
	Plot       string      `json:"plot,omitempty"`
	// Failures are the errors that stopped a system's figures.
	Failures []string `json:"failures,omitempty"`
}

// HostInfo describes the machine and the software measured.
type HostInfo struct {
	Kernel    string            `json:"kernel"`
	CPUs      int               `json:"cpus"`
	MemTotal  int64             `json:"mem_total_bytes"`
	Versions  map[string]string `json:"versions"`
	DockerFS  string            `json:"docker_storage_driver,omitempty"`
	DsecFlags []string          `json:"dsec_up_flags,omitempty"`
}

// ConfigInfo is the run's flags.
type ConfigInfo struct {
	N             int      `json:"n"`
	Warmup        int      `json:"warmup"`
	Burst         int      `json:"burst"`
	Probe         int      `json:"probe"`
	Idle          int      `json:"idle"`
	Concurrencies []int    `json:"concurrencies"`
	Systems       []string `json:"systems"`
	MemoryLimit   int64    `json:"dsec_memory_limit_bytes"`
	SettleSeconds float64  `json:"settle_seconds"`
}

// LatencyRow is one system's distribution in a latency figure.
type LatencyRow struct {
	harness.Summary
	// HostCPUPerOp is the host's busy CPU time during the operations,
	// divided by their number (ms).
	HostCPUPerOp float64 `json:"host_cpu_ms_per_op,omitempty"`
}

// Probe is one concurrency tried for a burst.
type Probe struct {
	Concurrency int     `json:"concurrency"`
	Count       int     `json:"count"`
	Rate        float64 `json:"creations_per_s"`
}

// BurstRow is one system's burst.
type BurstRow struct {
	Name        string  `json:"name"`
	System      string  `json:"system"`
	Count       int     `json:"count"`
	Concurrency int     `json:"concurrency"`
	Seconds     float64 `json:"seconds"`
	Rate        float64 `json:"creations_per_s"`
	// CPU time per create (ms): the host's (every CPU, every process),
	// the same less the background, the system's own processes (daemons,
	// keeper, runtimes), and the client (this process, CLIs it ran).
	HostCPU   float64 `json:"host_cpu_ms_per_create"`
	NetCPU    float64 `json:"host_cpu_ms_per_create_net"`
	SystemCPU float64 `json:"system_cpu_ms_per_create"`
	ClientCPU float64 `json:"client_cpu_ms_per_create"`
	// DeleteSeconds is how long deleting them all took.
	DeleteSeconds float64 `json:"delete_seconds"`
	Probes        []Probe `json:"probes,omitempty"`
	Skipped       string  `json:"skipped,omitempty"`
}

// MemoryRow is one system's idle memory figure.
type MemoryRow struct {
	Name        string  `json:"name"`
	System      string  `json:"system"`
	Count       int     `json:"count"`
	Concurrency int     `json:"concurrency"`
	Before      int64   `json:"mem_available_before_bytes"`
	After       int64   `json:"mem_available_after_bytes"`
	PerSandbox  float64 `json:"bytes_per_sandbox"`
	Skipped     string  `json:"skipped,omitempty"`
}

// Target is one of issue 4's ratios, measured in this run.
type Target struct {
	Name  string   `json:"name"`
	Value *float64 `json:"value"` // nil when a side is missing
	Op    string   `json:"op"`    // "<=" or ">="
	Want  float64  `json:"target"`
	Met   *bool    `json:"met"` // nil when it could not be computed
	Note  string   `json:"note,omitempty"`
}

func burstRow(f fill, name, system string, background float64) BurstRow {
	per := func(d float64) float64 { return d / float64(f.Count) }
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	return BurstRow{
		Name: name, System: system, Count: f.Count, Concurrency: f.Conc,
		Seconds: f.Elapsed.Seconds(), Rate: f.rate(),
		HostCPU:   per(ms(f.HostCPU)),
		NetCPU:    per(math.Max(ms(f.HostCPU)-background/100*ms(f.Elapsed), 0)),
		SystemCPU: per(ms(f.ServerCPU)),
		ClientCPU: per(ms(f.ClientCPU)),
	}
}

func latencyOf(rows []LatencyRow, system string) (float64, string) {
	for _, r := range rows {
		if r.System == system {
			if r.Skipped != "" || r.N == 0 {
				return 0, orSkipped(r.Skipped)
			}
			return r.P50, ""
		}
	}
	return 0, "not measured"
}

func rateOf(rows []BurstRow, name string) (float64, string) {
	for _, r := range rows {
		if r.Name == name {
			if r.Skipped != "" || r.Rate == 0 {
				return 0, orSkipped(r.Skipped)
			}
			return r.Rate, ""
		}
	}
	return 0, "not measured"
}

func memoryOf(rows []MemoryRow, system string) (float64, string) {
	for _, r := range rows {
		if r.System == system {
			if r.Skipped != "" {
				return 0, r.Skipped
			}
			if r.PerSandbox <= 0 {
				return 0, "no memory taken (within the noise)"
			}
			return r.PerSandbox, ""
		}
	}
	return 0, "not measured"
}

func orSkipped(s string) string {
	if s == "" {
		return "no samples"
	}
	return s
}

// ratio builds a target num/den op want, or one that says which side is
// missing.
func ratio(name string, num float64, numWhy string, den float64, denWhy string, op string, want float64) Target {
	t := Target{Name: name, Op: op, Want: want}
	switch {
	case numWhy != "":
		t.Note = numWhy
		return t
	case denWhy != "":
		t.Note = denWhy
		return t
	}
	v := num / den
	met := v <= want
	if op == ">=" {
		met = v >= want
	}
	t.Value, t.Met = &v, &met
	return t
}

// computeTargets computes issue 4's targets from the figures.
func computeTargets(r *Result) []Target {
	var ts []Target
	dc, dcWhy := latencyOf(r.CreateFirstExec, "dsec")
	cc, ccWhy := latencyOf(r.CreateFirstExec, "crun")
	kc, kcWhy := latencyOf(r.CreateFirstExec, "docker")
	ts = append(ts,
		ratio("create→first exec p50: dsec / crun run", dc, dcWhy, cc, ccWhy, "<=", 1.5),
		ratio("create→first exec p50: docker run / dsec", kc, kcWhy, dc, dcWhy, ">=", 10))
	de, deWhy := latencyOf(r.ExecRTT, "dsec")
	ce, ceWhy := latencyOf(r.ExecRTT, "crun")
	ke, keWhy := latencyOf(r.ExecRTT, "docker")
	ts = append(ts,
		ratio("exec RTT p50: dsec / crun exec", de, deWhy, ce, ceWhy, "<=", 0.5),
		ratio("exec RTT p50: docker exec / dsec", ke, keWhy, de, deWhy, ">=", 10))
	db, dbWhy := rateOf(r.Burst, "dsec Create")
	cb, cbWhy := rateOf(r.Burst, "crun create+start (sleep)")
	kb, kbWhy := rateOf(r.Burst, "docker run -d (sleep)")
	t := ratio("burst creations/s: dsec / crun", db, dbWhy, cb, cbWhy, ">=", 0.8)
	if note := sameConcurrency(r.Burst); note != "" {
		t.Note = note
	}
	ts = append(ts, t, ratio("burst creations/s: dsec / docker", db, dbWhy, kb, kbWhy, ">=", 15))
	// A burst is what BatchCreate is for (N sandboxes in one call): its
	// rate is reported against the same baselines, beside the per-call one.
	bb, bbWhy := rateOf(r.Burst, "dsec BatchCreate")
	ts = append(ts,
		ratio("burst creations/s: dsec BatchCreate / crun", bb, bbWhy, cb, cbWhy, ">=", 0.8),
		ratio("burst creations/s: dsec BatchCreate / docker", bb, bbWhy, kb, kbWhy, ">=", 15))
	dm, dmWhy := memoryOf(r.IdleMemory, "dsec")
	cm, cmWhy := memoryOf(r.IdleMemory, "crun")
	ts = append(ts, ratio("idle memory per sandbox: dsec / crun", dm, dmWhy, cm, cmWhy, "<=", 1.5))
	return ts
}

// sameConcurrency compares dsec's and crun's probes at dsec's best
// concurrency, which the wording asks for.
func sameConcurrency(rows []BurstRow) string {
	var d, c *BurstRow
	for i := range rows {
		switch rows[i].Name {
		case "dsec Create":
			d = &rows[i]
		case "crun create+start (sleep)":
			c = &rows[i]
		}
	}
	if d == nil || c == nil || d.Skipped != "" || c.Skipped != "" {
		return ""
	}
	for _, cp := range c.Probes {
		for _, dp := range d.Probes {
			if cp.Concurrency == d.Concurrency && dp.Concurrency == d.Concurrency && cp.Rate > 0 {
				return fmt.Sprintf("at dsec's best concurrency %d the probes give %.2f", d.Concurrency, dp.Rate/cp.Rate)
			}
		}
	}
	return ""
}

// writeTable prints the figures and targets for people.
func writeTable(w io.Writer, r *Result) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	latency := func(title string, rows []LatencyRow) {
		fmt.Fprintf(tw, "%s\tn\tp50 ms\tp90 ms\tp99 ms\tmean ms\thost CPU ms/op\n", title)
		for _, s := range rows {
			if s.Skipped != "" {
				fmt.Fprintf(tw, "  %s\t%s\n", s.Name, s.Skipped)
				continue
			}
			fmt.Fprintf(tw, "  %s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\n", s.Name, s.N, s.P50, s.P90, s.P99, s.Mean, s.HostCPUPerOp)
		}
		fmt.Fprintln(tw)
	}
	latency("1. create → first exec done", r.CreateFirstExec)
	latency("2. exec round trip (true)", r.ExecRTT)
	fmt.Fprintf(tw, "3. burst\tcount\tconc\tcreations/s\tseconds\tdelete s\tprobes (conc: /s)\n")
	for _, b := range r.Burst {
		if b.Skipped != "" {
			fmt.Fprintf(tw, "  %s\t%s\n", b.Name, b.Skipped)
			continue
		}
		var ps []string
		for _, p := range b.Probes {
			ps = append(ps, fmt.Sprintf("%d: %.1f", p.Concurrency, p.Rate))
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%.1f\t%.2f\t%.2f\t%s\n", b.Name, b.Count, b.Concurrency, b.Rate, b.Seconds, b.DeleteSeconds, strings.Join(ps, ", "))
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "4. idle host memory\tcount\tMemAvailable before MiB\tafter MiB\tMiB per sandbox\n")
	for _, m := range r.IdleMemory {
		if m.Skipped != "" {
			fmt.Fprintf(tw, "  %s\t%s\n", m.Name, m.Skipped)
			continue
		}
		fmt.Fprintf(tw, "  %s\t%d\t%.0f\t%.0f\t%.3f\n", m.Name, m.Count, mib(float64(m.Before)), mib(float64(m.After)), mib(m.PerSandbox))
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "5. CPU time per create (ms)\thost\thost less background (%.1f%% of a CPU)\tsystem's processes\tclient\n", r.BackgroundCPUPct)
	for _, b := range r.Burst {
		if b.Skipped != "" {
			continue
		}
		fmt.Fprintf(tw, "  %s\t%.2f\t%.2f\t%.2f\t%.2f\n", b.Name, b.HostCPU, b.NetCPU, b.SystemCPU, b.ClientCPU)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "targets (issue 4)\tvalue\ttarget\tmet\n")
	for _, t := range r.Targets {
		v, met := "-", "n/a"
		if t.Value != nil {
			v = fmt.Sprintf("%.2f", *t.Value)
		}
		if t.Met != nil {
			met = map[bool]string{true: "met", false: "NOT met"}[*t.Met]
		}
		note := ""
		if t.Note != "" {
			note = "  (" + t.Note + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s %.2f\t%s%s\n", t.Name, v, strings.Replace(strings.Replace(t.Op, "<=", "≤", 1), ">=", "≥", 1), t.Want, met, note)
	}
	tw.Flush()
	for _, f := range r.Failures {
		fmt.Fprintln(w, "failure:", f)
	}
	if r.Plot != "" {
		fmt.Fprintln(w, "plot:", r.Plot)
	}
}

func mib(b float64) float64 { return b / (1 << 20) }
