//go:build linux

package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
)

// The two ways a node gets the images' data from shared storage.
const (
	modeLazy  = "lazy"
	modeEager = "eager"
)

// Issue 7's targets (DSec's result).
const (
	targetSpeedup = 1.7  // eager's wall time over lazy's, at least
	targetDisk    = 0.43 // lazy's bytes written to local disk over eager's, at most
	targetFetch   = 2.0  // lazy's bytes fetched over the bytes the tasks read, at most
)

// Report is the benchmark's JSON.
type Report struct {
	Date   time.Time `json:"date"`
	CPUs   int       `json:"host_cpus"`
	Kernel string    `json:"kernel"`
	Config Config    `json:"config"`
	// Setup says how the node was made to read every data byte through
	// the blobserver.
	Setup string `json:"setup"`
	// Layers describes the synthetic data layers (summed over the images).
	Layers  LayerStats `json:"layers"`
	Modes   []*Mode    `json:"modes"`
	Targets []Target   `json:"targets"`
	Errors  []string   `json:"errors,omitempty"`
}

// Config is the run's flags.
type Config struct {
	Images      int     `json:"images"`
	PerImage    int     `json:"sandboxes_per_image"`
	Size        int64   `json:"layer_bytes"`
	ReadFrac    float64 `json:"read_fraction"`
	Shared      float64 `json:"shared_fraction"`
	Concurrency int     `json:"concurrency"`
	Rate        int64   `json:"blobserver_rate_bytes_per_s"`
	LatencyMs   float64 `json:"blobserver_latency_ms"`
	Order       string  `json:"order"`
}

// LayerStats describes the data layers as stored.
type LayerStats struct {
	Files      int   `json:"files"`
	LargeFiles int   `json:"large_files"`
	FileBytes  int64 `json:"file_bytes"`
	// ImageBytes are the layers' EROFS images (what eager fetches);
	// MetaBytes and DataBytes their lazy forms' two blobs.
	ImageBytes int64   `json:"image_bytes"`
	MetaBytes  int64   `json:"meta_bytes"`
	DataBytes  int64   `json:"data_bytes"`
	BuildMs    float64 `json:"build_ms"`
}

// Mode is one way's figures.
type Mode struct {
	Name string `json:"name"`
	// Tasks counts the tasks that completed; WallMs is from the first
	// task's start until the last one's end.
	Tasks  int     `json:"tasks"`
	WallMs float64 `json:"wall_ms"`
	// Task is, per task, from the start of its create (for eager, of the
	// wait for its image's layers) until its reads have ended; Create and
	// Read split it (for eager, Create includes the fetch).
	Task   harness.Summary `json:"task"`
	Create harness.Summary `json:"create"`
	Read   harness.Summary `json:"read"`
	// FetchedBytes is what the blobserver sent (counted at a proxy in
	// front of it), by kind of blob: layer images (eager), metadata
	// images and data blobs (lazy).
	FetchedBytes      int64 `json:"fetched_bytes"`
	FetchedImageBytes int64 `json:"fetched_image_bytes"`
	FetchedMetaBytes  int64 `json:"fetched_meta_bytes"`
	FetchedDataBytes  int64 `json:"fetched_data_bytes"`
	Requests          int64 `json:"requests"`
	// ReadBytes sums the bytes every task read; UniqueReadBytes counts
	// each file once per image.
	ReadBytes       int64 `json:"read_bytes"`
	UniqueReadBytes int64 `json:"unique_read_bytes"`
	// DiskWriteBytes is the growth of the blocks allocated under the
	// node's state directory (local store, chunk cache, fetched metadata
	// images, sandboxes' writable layers, etcd), after sync.
	DiskWriteBytes int64  `json:"disk_write_bytes"`
	Error          string `json:"error,omitempty"`

	task, create, read []time.Duration
}

// Target is one of issue 7's targets and whether the run met it.
type Target struct {
	Name string  `json:"name"`
	Want string  `json:"want"`
	Got  float64 `json:"got"`
	// Met is false when the figure is missing (a mode failed).
	Met bool `json:"met"`
}

// summarize fills m's summaries from its samples.
func (m *Mode) summarize() {
	m.Tasks = len(m.task)
	m.Task = harness.Summarize("task", m.Name, m.task)
	m.Create = harness.Summarize("create", m.Name, m.create)
	m.Read = harness.Summarize("read", m.Name, m.read)
	m.Create.Samples, m.Read.Samples = nil, nil
}

func (r *Report) mode(name string) *Mode {
	for _, m := range r.Modes {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// targets computes the three targets from the modes.
func (r *Report) targets() {
	lazy, eager := r.mode(modeLazy), r.mode(modeEager)
	ok := func(m *Mode) bool { return m != nil && m.Error == "" && m.Tasks > 0 }
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	var speedup, disk, fetch float64
	complete := ok(lazy) && ok(eager)
	if complete {
		speedup = ratio(eager.WallMs, lazy.WallMs)
		disk = ratio(float64(lazy.DiskWriteBytes), float64(eager.DiskWriteBytes))
	}
	if ok(lazy) {
		fetch = ratio(float64(lazy.FetchedBytes), float64(lazy.ReadBytes))
	}
	r.Targets = []Target{
		{Name: "lazy completes sooner (eager wall / lazy wall)", Want: fmt.Sprintf(">= %.2f", targetSpeedup), Got: speedup,
			Met: complete && speedup >= targetSpeedup},
		{Name: "lazy disk writes / eager disk writes", Want: fmt.Sprintf("<= %.2f", targetDisk), Got: disk,
			Met: complete && eager.DiskWriteBytes > 0 && disk <= targetDisk},
		{Name: "lazy bytes fetched / bytes read", Want: fmt.Sprintf("<= %.2f", targetFetch), Got: fetch,
			Met: ok(lazy) && lazy.ReadBytes > 0 && fetch <= targetFetch},
	}
}

// writeTable writes the human table of r and its targets.
func writeTable(w io.Writer, r *Report) {
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "mode\ttasks\tall done s\ttask p50 s\ttask p90 s\ttask max s\tcreate p50 s\tread p50 s\tfetched MiB\tread MiB\tunique read MiB\tdisk written MiB\trequests\t\n")
	for _, m := range r.Modes {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t\n",
			m.Name, m.Tasks, m.WallMs/1e3, m.Task.P50/1e3, m.Task.P90/1e3, m.Task.Max/1e3, m.Create.P50/1e3, m.Read.P50/1e3,
			mib(m.FetchedBytes), mib(m.ReadBytes), mib(m.UniqueReadBytes), mib(m.DiskWriteBytes), m.Requests)
	}
	_ = tw.Flush()
	for _, t := range r.Targets {
		verdict := "met"
		if !t.Met {
			verdict = "NOT met"
		}
		got := "n/a"
		if t.Got != 0 {
			got = fmt.Sprintf("%.2f", t.Got)
		}
		fmt.Fprintf(w, "target: %s %s: %s, %s\n", t.Name, t.Want, got, verdict)
	}
	c, l := r.Config, r.Layers
	fmt.Fprintf(w, "(%d images × %d sandboxes, concurrency %d, each task reads %.0f%% of its image, %.0f%% of that shared by the image's tasks; each data layer %.0f MiB in %d files, %d large; in all: layer images %.0f MiB, lazy data blobs %.0f MiB, metadata images %.1f MiB; blobserver %.0f MB/s, %.1f ms; %d CPUs)\n",
		c.Images, c.PerImage, c.Concurrency, 100*c.ReadFrac, 100*c.Shared, mib(c.Size), l.Files/max(c.Images, 1), l.LargeFiles/max(c.Images, 1),
		mib(l.ImageBytes), mib(l.DataBytes), mib(l.MetaBytes), float64(c.Rate)/1e6, c.LatencyMs, r.CPUs)
	if r.Setup != "" {
		fmt.Fprintf(w, "setup: %s\n", r.Setup)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
}
