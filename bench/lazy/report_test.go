//go:build linux

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestTargets(t *testing.T) {
	lazy := func(wall float64, disk, fetched, read int64) *Mode {
		return &Mode{Name: modeLazy, Tasks: 50, WallMs: wall, DiskWriteBytes: disk, FetchedBytes: fetched, ReadBytes: read}
	}
	eager := &Mode{Name: modeEager, Tasks: 50, WallMs: 34000, DiskWriteBytes: 1000, FetchedBytes: 5000, ReadBytes: 2500}
	for _, tc := range []struct {
		name  string
		modes []*Mode
		want  []bool
		got   []float64
	}{
		{"all met", []*Mode{lazy(20000, 430, 5000, 2500), eager}, []bool{true, true, true}, []float64{1.7, 0.43, 2}},
		{"none met", []*Mode{lazy(25000, 500, 6000, 2500), eager}, []bool{false, false, false}, []float64{1.36, 0.5, 2.4}},
		{"lazy alone", []*Mode{lazy(20000, 430, 2500, 2500)}, []bool{false, false, true}, []float64{0, 0, 1}},
		{"lazy failed", []*Mode{{Name: modeLazy, Error: "boom", Tasks: 3, WallMs: 1, FetchedBytes: 1, ReadBytes: 1}, eager}, []bool{false, false, false}, []float64{0, 0, 0}},
		{"nothing read", []*Mode{lazy(20000, 430, 100, 0), eager}, []bool{true, true, false}, []float64{1.7, 0.43, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Report{Modes: tc.modes}
			r.targets()
			var met []bool
			var got []float64
			for _, tg := range r.Targets {
				met = append(met, tg.Met)
				got = append(got, float64(int(tg.Got*100+0.5))/100)
			}
			if diff := cmp.Diff(tc.want, met); diff != "" {
				t.Errorf("targets met (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.got, got); diff != "" {
				t.Errorf("target figures (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSummarizeAndTable(t *testing.T) {
	m := &Mode{Name: modeLazy, task: []time.Duration{3 * time.Second, time.Second, 2 * time.Second},
		create: []time.Duration{time.Second}, read: []time.Duration{time.Second}}
	m.summarize()
	if m.Tasks != 3 || m.Task.P50 != 2000 || m.Task.Max != 3000 {
		t.Errorf("summarize: tasks %d, p50 %v, max %v; want 3, 2000, 3000", m.Tasks, m.Task.P50, m.Task.Max)
	}
	if diff := cmp.Diff([]float64{1000, 2000, 3000}, m.Task.Samples); diff != "" {
		t.Errorf("task samples kept for the plot (-want +got):\n%s", diff)
	}
	r := &Report{Config: Config{Images: 1, PerImage: 3}, Modes: []*Mode{m}}
	r.targets()
	var b strings.Builder
	writeTable(&b, r)
	for _, want := range []string{"lazy completes sooner (eager wall / lazy wall) >= 1.70: n/a, NOT met", "lazy      3"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestPick(t *testing.T) {
	files := layerSpec(3, 100<<20)
	var large, small int64
	nSmall := 0
	for _, f := range files {
		if f.Large {
			large += f.Size
		} else {
			small += f.Size
			nSmall++
		}
	}
	if large+small != 100<<20 {
		t.Fatalf("layerSpec(3, 100M) holds %d bytes, want %d", large+small, 100<<20)
	}
	a, b := pick(3, 0, files, 0.1), pick(3, 0, files, 0.1)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("pick is not deterministic (-first +second):\n%s", diff)
	}
	var got int64
	for _, f := range a {
		got += f.Size
	}
	if lo, hi := int64(0.07*float64(large+small)), int64(0.14*float64(large+small)); got < lo || got > hi {
		t.Errorf("pick(3, 0, 10%%) reads %d bytes of %d, want within [%d, %d]", got, large+small, lo, hi)
	}
}

func TestPickTaskShares(t *testing.T) {
	files := layerSpec(2, 500<<20)
	var total int64
	for _, f := range files {
		total += f.Size
	}
	set := func(fs []file) map[string]int64 {
		m := map[string]int64{}
		for _, f := range fs {
			m[f.Path] = f.Size
		}
		return m
	}
	a, b := set(pickTask(2, 0, files, 0.1, 0.8)), set(pickTask(2, 1, files, 0.1, 0.8))
	var common, got int64
	for p, n := range a {
		got += n
		if _, ok := b[p]; ok {
			common += n
		}
	}
	if lo, hi := int64(0.07*float64(total)), int64(0.14*float64(total)); got < lo || got > hi {
		t.Errorf("pickTask(10%%, shared 80%%) reads %d bytes of %d, want within [%d, %d]", got, total, lo, hi)
	}
	if frac := float64(common) / float64(got); frac < 0.6 || frac > 0.95 {
		t.Errorf("two tasks of one image share %.2f of their reads, want about 0.8", frac)
	}
	indep := set(pickTask(2, 1, files, 0.1, 0))
	common = 0
	for p, n := range a {
		if _, ok := indep[p]; ok {
			common += n
		}
	}
	if float64(common) > 0.4*float64(got) {
		t.Errorf("with shared 0 a task shares %d of %d bytes with another, want independent choices", common, got)
	}
}
