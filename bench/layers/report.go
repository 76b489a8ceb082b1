//go:build linux

package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
)

// The two ways of giving N sandboxes a shared toolkit and their own
// workspace.
const (
	modeLayers = "composable layers"
	modeTar    = "tar extraction"
)

// Report is the benchmark's JSON.
type Report struct {
	Date   time.Time `json:"date"`
	CPUs   int       `json:"host_cpus"`
	Kernel string    `json:"kernel"`
	Config Config    `json:"config"`
	// Toolkit and Workspace describe the synthetic trees (one workspace;
	// they all have the same shape).
	Toolkit   treeStats `json:"toolkit"`
	Workspace treeStats `json:"workspace"`
	Modes     []*Mode   `json:"modes"`
	// Ratio is the tar extraction's wall time for all N sandboxes to be
	// ready over the composable layers' (issue 6: DSec reports 1.76);
	// RatioP50 is the same of the per-sandbox medians. Zero when a side
	// is missing.
	Ratio    float64  `json:"ready_wall_ratio_tar_over_layers"`
	RatioP50 float64  `json:"ready_p50_ratio_tar_over_layers"`
	Errors   []string `json:"errors,omitempty"`
}

// Config is the run's flags.
type Config struct {
	N            int   `json:"n"`
	Concurrency  int   `json:"concurrency"`
	Rounds       int   `json:"rounds"`
	ToolkitBytes int64 `json:"toolkit_bytes"`
	ToolkitFiles int   `json:"toolkit_files"`
	WSBytes      int64 `json:"workspace_bytes"`
	WSFiles      int   `json:"workspace_files"`
	// Explicit creates the composable sandboxes from explicit layer lists
	// rather than from registered images bench/ws-I:1.
	Explicit bool `json:"explicit_layers"`
}

// Mode is one way's figures; the summary fields pool or take the median
// of its rounds.
type Mode struct {
	Name string `json:"name"`
	// Prep is done once: building and uploading the toolkit's and the
	// workspaces' layers (and registering the images), or writing their
	// tar archives. PrepBytes is what it produced.
	PrepMs    float64 `json:"prep_ms"`
	PrepBytes int64   `json:"prep_bytes"`
	// Ready is, per sandbox, from the start of its Create until the check
	// exec in it has ended, pooled over the rounds; Create and Fill split
	// it (Fill is the tar uploads, zero for layers).
	Ready  harness.Summary `json:"ready"`
	Create harness.Summary `json:"create"`
	Fill   harness.Summary `json:"fill"`
	// WallMs is the median over the rounds of the time for all N
	// sandboxes to be ready.
	WallMs float64 `json:"wall_ms"`
	// Medians over the rounds of the per-round figures (see Round).
	WritableBytes   int64    `json:"writable_bytes"`
	StateDiskBytes  int64    `json:"state_disk_bytes"`
	HostMemBytes    int64    `json:"host_mem_bytes"`
	SandboxMemBytes int64    `json:"sandbox_mem_bytes"`
	Rounds          []*Round `json:"rounds"`
}

// Round is one run of N sandboxes of a mode.
type Round struct {
	Round int `json:"round"`
	// Ready counts the sandboxes that became ready.
	Ready  int     `json:"ready"`
	WallMs float64 `json:"wall_ms"`
	// WritableBytes sums the sandboxes' writable layer use (Stats disk).
	WritableBytes int64 `json:"writable_bytes"`
	// StateDiskBytes is the growth of the blocks allocated under the
	// node's state directory (its own file system only, after sync).
	StateDiskBytes int64 `json:"state_disk_bytes"`
	// HostMemBytes is the drop of the host's MemAvailable; SandboxMemBytes
	// sums the sandboxes' cgroup memory (page cache they were charged
	// included).
	HostMemBytes    int64  `json:"host_mem_bytes"`
	SandboxMemBytes int64  `json:"sandbox_mem_bytes"`
	Error           string `json:"error,omitempty"`

	ready, create, fill []time.Duration
}

// summarize fills m's summary fields from its rounds.
func (m *Mode) summarize() {
	var ready, create, fill []time.Duration
	var wall []float64
	var writable, disk, mem, sbMem []int64
	for _, r := range m.Rounds {
		ready = append(ready, r.ready...)
		create = append(create, r.create...)
		fill = append(fill, r.fill...)
		if r.Error != "" {
			continue // its wall time and totals are not of N sandboxes
		}
		wall = append(wall, r.WallMs)
		writable = append(writable, r.WritableBytes)
		disk = append(disk, r.StateDiskBytes)
		mem = append(mem, r.HostMemBytes)
		sbMem = append(sbMem, r.SandboxMemBytes)
	}
	m.Ready = harness.Summarize("ready", m.Name, ready)
	m.Create = harness.Summarize("create", m.Name, create)
	m.Fill = harness.Summarize("fill", m.Name, fill)
	for _, s := range []*harness.Summary{&m.Ready, &m.Create, &m.Fill} {
		s.Samples = nil // the rounds' counts say enough; keep the JSON short
	}
	m.WallMs = median(wall)
	m.WritableBytes = median(writable)
	m.StateDiskBytes = median(disk)
	m.HostMemBytes = median(mem)
	m.SandboxMemBytes = median(sbMem)
}

// median returns the middle value (the upper one of an even count), or 0.
func median[T int64 | float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// ratios sets the report's ratios from its modes.
func (r *Report) ratios() {
	var layers, tarx *Mode
	for _, m := range r.Modes {
		switch m.Name {
		case modeLayers:
			layers = m
		case modeTar:
			tarx = m
		}
	}
	r.Ratio, r.RatioP50 = 0, 0
	if layers == nil || tarx == nil {
		return
	}
	if layers.WallMs > 0 && tarx.WallMs > 0 {
		r.Ratio = tarx.WallMs / layers.WallMs
	}
	if layers.Ready.P50 > 0 && tarx.Ready.P50 > 0 {
		r.RatioP50 = tarx.Ready.P50 / layers.Ready.P50
	}
}

// writeTable writes the human table of r.
func writeTable(w io.Writer, r *Report) {
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "mode\tprep s\tprep MiB\tready p50 ms\tready p99 ms\tcreate p50 ms\tfill p50 ms\tall N ready s\twritable MiB\tstate disk MiB\thost mem MiB\tsandbox mem MiB\t\n")
	for _, m := range r.Modes {
		fmt.Fprintf(tw, "%s\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t\n",
			m.Name, m.PrepMs/1e3, mib(m.PrepBytes), m.Ready.P50, m.Ready.P99, m.Create.P50, m.Fill.P50,
			m.WallMs/1e3, mib(m.WritableBytes), mib(m.StateDiskBytes), mib(m.HostMemBytes), mib(m.SandboxMemBytes))
	}
	_ = tw.Flush()
	c := r.Config
	fmt.Fprintf(w, "ready time, tar extraction / composable layers: %s for all %d (wall), %s per sandbox (p50); DSec reports 1.76×\n",
		ratioText(r.Ratio), c.N, ratioText(r.RatioP50))
	fmt.Fprintf(w, "(%d sandboxes, concurrency %d, %d round(s), %d CPUs; toolkit %.0f MiB in %d files, workspace %.1f MiB in %d files)\n",
		c.N, c.Concurrency, c.Rounds, r.CPUs, mib(r.Toolkit.Bytes), r.Toolkit.Files, mib(r.Workspace.Bytes), r.Workspace.Files)
	for _, e := range r.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
}

func ratioText(v float64) string {
	if v == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", v)
}
