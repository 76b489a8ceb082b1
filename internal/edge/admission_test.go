package edge

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// diskEdge is an edge whose state dir's file system is space.
func diskEdge(space ceiling.Space, overcommit float64) *Edge {
	return &Edge{
		cfg:       Config{Node: "n", StateDir: "/var/lib/dsec", DiskOvercommit: overcommit, OutputQuota: 256 << 20},
		diskSpace: func() (ceiling.Space, error) { return space, nil },
	}
}

func TestAdmitDiskOneSandbox(t *testing.T) {
	// 79 GiB free of 100 GiB: 5 GiB (5%) kept, 74 GiB left.
	e := diskEdge(ceiling.Space{Free: 79 << 30, Size: 100 << 30}, 32)
	_, err := e.admitDisk(10 << 40)
	if !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("admitDisk(10 TiB) on 79 GiB free = %v, want ResourceExhausted", err)
	}
	for _, want := range []string{"disk: 10.0 TiB asked", "10 TiB writable disk", "256 MiB of exec output", "74 GiB left on the state dir's file system", "5 GiB kept", "--disk"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("admitDisk(10 TiB) = %q, want it to say %q", err, want)
		}
	}
	if d, ok := errdefs.RetryHint(err); !ok || d <= 0 {
		t.Errorf("admitDisk(10 TiB) = %v, has no retry hint", err)
	}
	// What fits the space left, output quota included, is admitted alone.
	rel, err := e.admitDisk(74<<30 - 256<<20)
	if err != nil {
		t.Fatalf("admitDisk(74 GiB - 256 MiB) on 74 GiB left = %v, want nil", err)
	}
	rel()
	if _, err := e.admitDisk(74<<30 - 256<<20 + 1); !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("admitDisk(one byte more than left) = %v, want ResourceExhausted", err)
	}
}

func TestAdmitDiskReserve(t *testing.T) {
	tests := []struct {
		name    string
		space   ceiling.Space
		reserve ceiling.Reserve
		left    int64
	}{
		{"default, the minimum", ceiling.Space{Free: 20 << 30, Size: 30 << 30}, ceiling.Reserve{}, 18 << 30},
		{"default, 5%", ceiling.Space{Free: 79 << 30, Size: 100 << 30}, ceiling.Reserve{}, 74 << 30},
		{"configured", ceiling.Space{Free: 79 << 30, Size: 100 << 30}, ceiling.Reserve{Min: 40 << 30}, 39 << 30},
		{"full", ceiling.Space{Free: 1 << 30, Size: 100 << 30}, ceiling.Reserve{}, 0},
	}
	for _, tt := range tests {
		e := diskEdge(tt.space, 1)
		e.cfg.DiskReserve = tt.reserve
		e.cfg.OutputQuota = 1
		if tt.left > 0 {
			rel, err := e.admitDisk(tt.left - 1)
			if err != nil {
				t.Errorf("%s: admitDisk(all that is left) = %v, want nil", tt.name, err)
				continue
			}
			rel()
		}
		if _, err := e.admitDisk(tt.left); !errdefs.Is(err, errdefs.ErrResourceExhausted) {
			t.Errorf("%s: admitDisk(one byte more than left) = %v, want ResourceExhausted", tt.name, err)
		}
	}
}

func TestAdmitDiskOvercommit(t *testing.T) {
	// 10 GiB left above the 2 GiB minimum reserve: 4× is 40 GiB of limits.
	e := diskEdge(ceiling.Space{Free: 12 << 30, Size: 20 << 30}, 4)
	need := int64(10<<30) - 256<<20 // one sandbox's disk + output = 10 GiB
	var releases []func()
	for i := range 4 {
		rel, err := e.admitDisk(need)
		if err != nil {
			t.Fatalf("admitDisk #%d within 4× of 10 GiB = %v", i+1, err)
		}
		releases = append(releases, rel)
	}
	_, err := e.admitDisk(need)
	if !errdefs.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "disk: node n has no room for 10 GiB more: 40 GiB") {
		t.Fatalf("admitDisk beyond 4× = %v, want ResourceExhausted naming disk and the 40 GiB admitted", err)
	}
	if d, ok := errdefs.RetryHint(err); !ok || d <= 0 {
		t.Errorf("refusal has no retry hint")
	}
	releases[0]()
	releases[0]() // idempotent
	if _, err := e.admitDisk(need); err != nil {
		t.Errorf("admitDisk after a release = %v", err)
	}
	if e.diskCommitted != 4*(10<<30) {
		t.Errorf("diskCommitted = %d, want %d", e.diskCommitted, 4*(10<<30))
	}
}

func TestAdmitDiskStatfsFails(t *testing.T) {
	e := diskEdge(ceiling.Space{}, 4)
	e.diskSpace = func() (ceiling.Space, error) { return ceiling.Space{}, errors.New("statfs: EIO") }
	if _, err := e.admitDisk(1 << 30); !errdefs.Is(err, errdefs.ErrInternal) {
		t.Errorf("admitDisk with statfs failing = %v, want Internal (never admitted blind)", err)
	}
}
