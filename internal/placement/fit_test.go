package placement

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNever(t *testing.T) {
	c := []string{"container"}
	small := Node{Name: "small", Backends: c, Healthy: true, MemoryAdmissible: 84 << 30, MemoryBytes: 21 << 30, PidsMax: 24576, DiskMaxBytes: 200 << 30}
	big := Node{Name: "big", Backends: c, Healthy: true, MemoryAdmissible: 32 << 30, PidsMax: 4000000, DiskMaxBytes: 50 << 30}
	tests := []struct {
		name  string
		nodes []Node
		req   Request
		want  Misfit
		never bool
	}{
		{"fits one", []Node{small, big}, Request{MemoryBytes: 30 << 30}, Misfit{}, false},
		{"memory", []Node{small, big}, Request{MemoryBytes: 1 << 40}, Misfit{"memory", 32 << 30, "big"}, true},
		{"pids", []Node{small, big}, Request{MemoryBytes: 1 << 30, Pids: 1e9}, Misfit{"pids", 4000000, "big"}, true},
		{"disk", []Node{small, big}, Request{MemoryBytes: 1 << 30, DiskBytes: 10 << 40}, Misfit{"disk", 200 << 30, "small"}, true},
		{"each alone, not together", []Node{small, big}, Request{MemoryBytes: 30 << 30, DiskBytes: 100 << 30}, Misfit{}, true},
		{"pids unreported", []Node{{Name: "old", Backends: c, Healthy: true, MemoryAdmissible: 8 << 30}}, Request{MemoryBytes: 1 << 30, Pids: 1e9}, Misfit{}, false},
		{"memory unreported", []Node{{Name: "new", Backends: c, Healthy: true}, big}, Request{MemoryBytes: 1 << 40}, Misfit{}, false},
		{"unhealthy and other backends left out", []Node{
			{Name: "down", Backends: c, MemoryAdmissible: 1 << 40},
			{Name: "vm", Backends: []string{"microvm"}, Healthy: true, MemoryAdmissible: 1 << 40},
			big,
		}, Request{MemoryBytes: 64 << 30}, Misfit{"memory", 32 << 30, "big"}, true},
		{"no node of the backend", nil, Request{MemoryBytes: 1 << 40}, Misfit{}, false},
	}
	for _, tt := range tests {
		tt.req.Backend = "container"
		got, never := Never(tt.nodes, tt.req)
		if never != tt.never || got != tt.want {
			t.Errorf("Never(%s) = %+v, %v; want %+v, %v", tt.name, got, never, tt.want, tt.never)
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

// TestOrderSkipsNodesThatNeverFit: pids or disk above what a node ever
// gives one sandbox rule it out; left to the defaults (0), they do not.
func TestOrderSkipsNodesThatNeverFit(t *testing.T) {
	c := []string{"container"}
	nodes := []Node{
		{Name: "a", Backends: c, Healthy: true, MemoryAdmissible: 64 << 30, PidsMax: 1000, DiskMaxBytes: 1 << 40},
		{Name: "b", Backends: c, Healthy: true, MemoryAdmissible: 64 << 30, PidsMax: 100000, DiskMaxBytes: 10 << 30},
	}
	p := New(Config{})
	for _, tt := range []struct {
		req  Request
		want []string
	}{
		{Request{Pids: 5000, MemoryBytes: 1 << 30}, []string{"b"}},
		{Request{DiskBytes: 20 << 30, MemoryBytes: 1 << 30}, []string{"a"}},
		{Request{Pids: 5000, DiskBytes: 20 << 30, MemoryBytes: 1 << 30}, []string{}},
	} {
		tt.req.Backend = "container"
		if got := p.Order(nodes, tt.req); !cmp.Equal(got, tt.want) {
			t.Errorf("Order(%+v) = %q, want %q", tt.req, got, tt.want)
		}
	}
	if got := p.Order(nodes, Request{Backend: "container", MemoryBytes: 1 << 30}); len(got) != 2 {
		t.Errorf("Order(defaults) = %q, want both nodes", got)
	}
}
