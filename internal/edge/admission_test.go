package edge

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// diskEdge is an edge whose state dir's file system is space.
func diskEdge(space ceiling.Space, overcommit float64) *Edge {
	return &Edge{
		cfg:       Config{Node: "n", StateDir: "/var/lib/dsec", DiskOvercommit: overcommit, OutputQuota: 256 << 20},
		diskSpace: func() (ceiling.Space, error) { return space, nil },
	}
}

func TestAdmitDiskOneSandbox(t *testing.T) {
	// 79 GiB free of 100 GiB: 5 GiB (5%) kept, 74 GiB left now, 95 GiB
	// at most, once everything else is deleted.
	e := diskEdge(ceiling.Space{Free: 79 << 30, Size: 100 << 30}, 32)
	_, err := e.admitDisk(80 << 30)
	if !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("admitDisk(80 GiB) on 79 GiB free of 100 GiB = %v, want ResourceExhausted", err)
	}
	for _, want := range []string{"disk: 80.2 GiB asked", "80 GiB writable disk", "256 MiB of exec output", "74 GiB left on the state dir's file system", "5 GiB kept", "--disk"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("admitDisk(80 GiB) = %q, want it to say %q", err, want)
		}
	}
	if d, ok := errdefs.RetryHint(err); !ok || d <= 0 {
		t.Errorf("admitDisk(80 GiB) = %v, has no retry hint", err)
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

// TestAdmitDiskNeverFits: a disk the whole file system could never hold
// (its size less the reserve) is InvalidArgument at once, without a retry
// hint: no delete makes room for it.
func TestAdmitDiskNeverFits(t *testing.T) {
	e := diskEdge(ceiling.Space{Free: 79 << 30, Size: 100 << 30}, 32)
	for _, disk := range []int64{10 << 40, 95<<30 - 256<<20 + 1} {
		_, err := e.admitDisk(disk)
		if !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("admitDisk(%s) on a 100 GiB file system = %v, want InvalidArgument", ceiling.FormatBytes(disk), err)
		}
		if _, ok := errdefs.RetryHint(err); ok {
			t.Errorf("admitDisk(%s) = %v, want no retry hint", ceiling.FormatBytes(disk), err)
		}
		for _, want := range []string{"disk " + ceiling.FormatBytes(disk) + " is more than node n can ever give a sandbox: the most is 94.7 GiB", "holds 100 GiB, less 5 GiB kept for the host and 256 MiB for the sandbox's exec output", "--disk"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("admitDisk(%s) = %q, want it to say %q", ceiling.FormatBytes(disk), err, want)
			}
		}
		if strings.Contains(err.Error(), "/var/lib/dsec") {
			t.Errorf("admitDisk(%s) = %q, names the state dir, a host path", ceiling.FormatBytes(disk), err)
		}
	}
	if e.diskCommitted != 0 {
		t.Errorf("diskCommitted after refusals = %d, want 0", e.diskCommitted)
	}
}

// TestCheckFits: memory or pids no delete could ever make room for are
// InvalidArgument naming the limit; at the limit they are not.
func TestCheckFits(t *testing.T) {
	e := &Edge{cfg: Config{Node: "n", MemoryBytes: 20 << 30, MemoryOvercommit: 4, PidsCeiling: 24576}}
	tests := []struct {
		name string
		r    sandbox.Resources
		want []string // nil: fits
	}{
		{"at the limits", sandbox.Resources{MemoryBytes: 20 << 30, Pids: 24576}, nil},
		{"memory 1 TiB", sandbox.Resources{MemoryBytes: 1 << 40, Pids: 1}, []string{"memory 1 TiB is more than node n can ever give a sandbox: the most is 20 GiB", "--host-memory-reserve", "--memory"}},
		{"memory above the host's", sandbox.Resources{MemoryBytes: 20<<30 + 1, Pids: 1}, []string{"memory 20.0 GiB", "20 GiB"}},
		{"pids 10^9", sandbox.Resources{MemoryBytes: 1 << 30, Pids: 1e9}, []string{"pids 1000000000 is more than node n can ever give a sandbox: the most is 24576", "--host-pids-reserve", "--pids"}},
	}
	for _, tt := range tests {
		err := e.checkFits(tt.r)
		if tt.want == nil {
			if err != nil {
				t.Errorf("checkFits(%s) = %v, want nil", tt.name, err)
			}
			continue
		}
		if !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("checkFits(%s) = %v, want InvalidArgument", tt.name, err)
			continue
		}
		if _, ok := errdefs.RetryHint(err); ok {
			t.Errorf("checkFits(%s) = %v, want no retry hint", tt.name, err)
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("checkFits(%s) = %q, want it to say %q", tt.name, err, w)
			}
		}
	}
	// With an overcommit below 1, what all sandboxes may hold is less than
	// the memory, and the message says why.
	e.cfg.MemoryOvercommit = 0.5
	if err := e.checkFits(sandbox.Resources{MemoryBytes: 11 << 30}); !errdefs.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "10 GiB") || !strings.Contains(err.Error(), "--memory-overcommit 0.5") {
		t.Errorf("checkFits(11 GiB) with overcommit 0.5 = %v, want InvalidArgument naming 10 GiB and --memory-overcommit 0.5", err)
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

// TestMostDisk: what the node reports to placement as the largest disk a
// sandbox can ever have is what admitDisk admits at most.
func TestMostDisk(t *testing.T) {
	e := diskEdge(ceiling.Space{Free: 79 << 30, Size: 100 << 30}, 32)
	most := e.mostDisk()
	if want := int64(95<<30 - 256<<20); most != want {
		t.Fatalf("mostDisk() of 100 GiB = %d, want %d (less the 5 GiB reserve and the output quota)", most, want)
	}
	if _, err := e.admitDisk(most + 1); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("admitDisk(mostDisk()+1) = %v, want InvalidArgument", err)
	}
	e.diskSpace = func() (ceiling.Space, error) { return ceiling.Space{}, errors.New("statfs: EIO") }
	if got := e.mostDisk(); got != 0 {
		t.Errorf("mostDisk() with statfs failing = %d, want 0 (unknown)", got)
	}
}
