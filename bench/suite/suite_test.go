//go:build linux

package main

import (
	"bytes"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/bench/internal/cdfplot"
	"github.com/dsecproject/dsec/bench/internal/harness"
)

func TestRotate(t *testing.T) {
	xs := []string{"a", "b", "c"}
	tests := []struct {
		k    int
		want []string
	}{
		{0, []string{"a", "b", "c"}},
		{1, []string{"b", "c", "a"}},
		{5, []string{"c", "a", "b"}},
	}
	for _, tt := range tests {
		if got := rotate(xs, tt.k); !cmp.Equal(got, tt.want) {
			t.Errorf("rotate(%v, %d) = %v, want %v", xs, tt.k, got, tt.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestComputeTargets(t *testing.T) {
	lat := func(system string, p50 float64) LatencyRow {
		return LatencyRow{Summary: harness.Summary{System: system, N: 10, P50: p50}}
	}
	r := &Result{
		CreateFirstExec: []LatencyRow{lat("dsec", 12), lat("crun", 10), lat("docker", 150)},
		ExecRTT:         []LatencyRow{lat("dsec", 2), lat("crun", 5), {Summary: harness.Summary{System: "docker", Skipped: "skipped: docker.io not installed"}}},
		Burst: []BurstRow{
			{Name: "dsec Create", Rate: 90, Concurrency: 8, Probes: []Probe{{Concurrency: 8, Rate: 85}}},
			{Name: "dsec BatchCreate", Rate: 300},
			{Name: "crun create+start (sleep)", Rate: 100, Concurrency: 16, Probes: []Probe{{Concurrency: 8, Rate: 95}, {Concurrency: 16, Rate: 100}}},
			{Name: "docker run -d (sleep)", Rate: 10},
		},
		IdleMemory: []MemoryRow{{System: "dsec", PerSandbox: 3 << 20}, {System: "crun", PerSandbox: 1 << 20}},
	}
	want := []Target{
		{Name: "create→first exec p50: dsec / crun run", Value: ptr(1.2), Op: "<=", Want: 1.5, Met: ptr(true)},
		{Name: "create→first exec p50: docker run / dsec", Value: ptr(12.5), Op: ">=", Want: 10, Met: ptr(true)},
		{Name: "exec RTT p50: dsec / crun exec", Value: ptr(0.4), Op: "<=", Want: 0.5, Met: ptr(true)},
		{Name: "exec RTT p50: docker exec / dsec", Op: ">=", Want: 10, Note: "skipped: docker.io not installed"},
		{Name: "burst creations/s: dsec / crun", Value: ptr(0.9), Op: ">=", Want: 0.8, Met: ptr(true), Note: "at dsec's best concurrency 8 the probes give 0.89"},
		{Name: "burst creations/s: dsec / docker", Value: ptr(9.0), Op: ">=", Want: 15, Met: ptr(false)},
		{Name: "burst creations/s: dsec BatchCreate / crun", Value: ptr(3.0), Op: ">=", Want: 0.8, Met: ptr(true)},
		{Name: "burst creations/s: dsec BatchCreate / docker", Value: ptr(30.0), Op: ">=", Want: 15, Met: ptr(true)},
		{Name: "idle memory per sandbox: dsec / crun", Value: ptr(3.0), Op: "<=", Want: 1.5, Met: ptr(false)},
	}
	got := computeTargets(r)
	approx := cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })
	if diff := cmp.Diff(want, got, approx); diff != "" {
		t.Errorf("computeTargets() mismatch (-want +got):\n%s", diff)
	}

	r.Targets = got
	var table bytes.Buffer
	writeTable(&table, r)
	for _, s := range []string{"NOT met", "skipped: docker.io not installed", "dsec / crun run"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("writeTable() lacks %q:\n%s", s, table.String())
		}
	}
}

func TestWritePlot(t *testing.T) {
	r := &Result{
		CreateFirstExec: []LatencyRow{
			{Summary: harness.Summary{Name: "dsec Create + Exec(true)", System: "dsec", Samples: []float64{20, 22, 25, 40}}},
			{Summary: harness.Summary{Name: "docker run --rm (true)", System: "docker", Skipped: "skipped: docker.io not installed"}},
		},
		ExecRTT: []LatencyRow{
			{Summary: harness.Summary{Name: "crun exec (true)", System: "crun", Samples: []float64{3, 4, 5}}},
		},
	}
	path := filepath.Join(t.TempDir(), "p.png")
	if err := writePlot(path, r); err != nil {
		t.Fatalf("writePlot() = %v", err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decode the plot: %v", err)
	}
	if b := img.Bounds(); b.Dx() != cdfplot.Width || b.Dy() != 2*cdfplot.PanelHeight {
		t.Errorf("plot is %v, want %dx%d (two panels)", b, cdfplot.Width, 2*cdfplot.PanelHeight)
	}
	count := map[color.RGBA]int{}
	for y := range img.Bounds().Dy() {
		for x := range img.Bounds().Dx() {
			r, g, b, a := img.At(x, y).RGBA()
			count[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), uint8(a >> 8)}]++
		}
	}
	for _, sys := range []string{"dsec", "crun"} {
		if count[colorOf[sys]] < 100 {
			t.Errorf("plot has %d pixels of %s's colour, want its curve and legend", count[colorOf[sys]], sys)
		}
	}
	if count[colorOf["docker"]] != 0 {
		t.Errorf("plot draws docker, which has no samples")
	}
	if err := writePlot(path, &Result{}); err == nil {
		t.Errorf("writePlot(no samples) = nil, want an error")
	}
}
