//go:build linux

package harness

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPercentile(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		sorted []float64
		p      float64
		want   float64
	}{
		{nil, 0.5, 0},
		{[]float64{7}, 0.5, 7},
		{[]float64{7}, 0.99, 7},
		{ten, 0.5, 5},
		{ten, 0.9, 9},
		{ten, 0.99, 10},
		{ten, 1, 10},
		{ten, 0.01, 1},
		{[]float64{1, 2, 3, 4}, 0.5, 2},
	}
	for _, tt := range tests {
		if got := Percentile(tt.sorted, tt.p); got != tt.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	ms := time.Millisecond
	got := Summarize("crun run", "crun", []time.Duration{4 * ms, 1 * ms, 3 * ms, 2 * ms})
	want := Summary{
		Name: "crun run", System: "crun", N: 4,
		P50: 2, P90: 4, P99: 4, Mean: 2.5, Min: 1, Max: 4,
		Samples: []float64{1, 2, 3, 4},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Summarize() mismatch (-want +got):\n%s", diff)
	}
	if got := Summarize("none", "x", nil); got.N != 0 || got.Samples != nil {
		t.Errorf("Summarize(nil) = %+v, want an empty summary", got)
	}
}
