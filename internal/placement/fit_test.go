package placement

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLargestFit(t *testing.T) {
	c := []string{"container"}
	tests := []struct {
		name  string
		nodes []Node
		want  Largest
	}{
		{"none", nil, Largest{Known: true}},
		{"memory below admissible", []Node{
			{Name: "a", Backends: c, Healthy: true, MemoryAdmissible: 84 << 30, MemoryBytes: 21 << 30},
			{Name: "b", Backends: c, Healthy: true, MemoryAdmissible: 32 << 30},
		}, Largest{MemoryBytes: 32 << 30, Node: "b", Known: true, Nodes: 2}},
		{"unhealthy and other backends left out", []Node{
			{Name: "a", Backends: c, Healthy: false, MemoryAdmissible: 1 << 40},
			{Name: "b", Backends: []string{"microvm"}, Healthy: true, MemoryAdmissible: 1 << 40},
			{Name: "c", Backends: c, Healthy: true, MemoryAdmissible: 8 << 30, MemoryBytes: 16 << 30},
		}, Largest{MemoryBytes: 8 << 30, Node: "c", Known: true, Nodes: 1}},
		{"a node without a report", []Node{
			{Name: "a", Backends: c, Healthy: true},
			{Name: "b", Backends: c, Healthy: true, MemoryAdmissible: 8 << 30},
		}, Largest{MemoryBytes: 8 << 30, Node: "b", Known: false, Nodes: 2}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, LargestFit(tt.nodes, "container")); diff != "" {
			t.Errorf("LargestFit(%s) mismatch (-want +got):\n%s", tt.name, diff)
		}
	}
}

// TestOrderSkipsNodesTooSmall: a node whose memory for sandboxes is below
// the request is never tried, however much its overcommit admits.
func TestOrderSkipsNodesTooSmall(t *testing.T) {
	c := []string{"container"}
	nodes := []Node{
		{Name: "small", Backends: c, Healthy: true, MemoryAdmissible: 96 << 30, MemoryBytes: 24 << 30},
		{Name: "big", Backends: c, Healthy: true, MemoryAdmissible: 64 << 30, MemoryBytes: 64 << 30},
	}
	p := New(Config{})
	for range 20 {
		if got := p.Order(nodes, Request{Backend: "container", MemoryBytes: 30 << 30}); !cmp.Equal(got, []string{"big"}) {
			t.Fatalf("Order(30 GiB) = %q, want only big (small has 24 GiB for sandboxes)", got)
		}
	}
}
