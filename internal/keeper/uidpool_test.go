package keeper

import (
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/rootfs"
)

func TestUIDPool(t *testing.T) {
	p := newUIDPool(rootfs.IDMap{HostID: 1_000_000_000, Size: 65536}, 3)
	var got []uint32
	for range 3 {
		m, err := p.take()
		if err != nil {
			t.Fatalf("take() = %v", err)
		}
		if m.Size != 65536 {
			t.Errorf("take() size = %d, want 65536", m.Size)
		}
		got = append(got, m.HostID)
	}
	if want := []uint32{1_000_000_000, 1_000_065_536, 1_000_131_072}; got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("take() x3 = %v, want %v", got, want)
	}
	if _, err := p.take(); !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("take() with every range held = %v, want ResourceExhausted", err)
	}
	// A range given back is reused only after the ones never used since.
	p.put(rootfs.IDMap{HostID: 1_000_065_536, Size: 65536})
	p.put(rootfs.IDMap{HostID: 1_000_000_000, Size: 65536})
	if m, _ := p.take(); m.HostID != 1_000_000_000 {
		t.Errorf("take() after two puts = %d, want the range after the last one taken (wrapping to 1000000000)", m.HostID)
	}
	if m, _ := p.take(); m.HostID != 1_000_065_536 {
		t.Errorf("second take() = %d, want 1000065536", m.HostID)
	}
	if n := p.inUse(); n != 3 {
		t.Errorf("inUse() = %d, want 3", n)
	}
}

func TestUIDPoolAdopted(t *testing.T) {
	first := rootfs.IDMap{HostID: 1_000_000_000, Size: 65536}
	p := newUIDPool(first, 2)
	// Two sandboxes of an older keeper shared the first range.
	p.hold(first)
	p.hold(first)
	p.hold(rootfs.IDMap{HostID: 5, Size: 65536}) // not of the pool: ignored
	if m, err := p.take(); err != nil || m.HostID != 1_000_065_536 {
		t.Errorf("take() beside the adopted range = %v, %v; want 1000065536", m, err)
	}
	p.put(first)
	if _, err := p.take(); err == nil {
		t.Errorf("take() while one adopted sandbox still holds the first range = nil error, want ResourceExhausted")
	}
	p.put(first)
	if m, err := p.take(); err != nil || m.HostID != first.HostID {
		t.Errorf("take() after both adopted sandboxes left = %v, %v; want the first range", m, err)
	}
}

func TestMaxUIDRanges(t *testing.T) {
	for _, tt := range []struct {
		base, size uint32
		want       int
	}{
		{1_000_000_000, 65536, 50277},
		{1<<32 - 65536, 65536, 0},
		{1, 0, 0},
	} {
		if got := maxUIDRanges(tt.base, tt.size); got != tt.want {
			t.Errorf("maxUIDRanges(%d, %d) = %d, want %d", tt.base, tt.size, got, tt.want)
		}
	}
}

func TestSandboxInfoIDs(t *testing.T) {
	def := rootfs.IDMap{HostID: 1_000_000_000, Size: 65536}
	if got := (SandboxInfo{}).IDs(def); got != def {
		t.Errorf("IDs of a record without a range = %v, want the node's first range %v", got, def)
	}
	own := rootfs.IDMap{HostID: 1_000_131_072, Size: 65536}
	if got := (SandboxInfo{IDBase: own.HostID, IDSize: own.Size}).IDs(def); got != own {
		t.Errorf("IDs = %v, want %v", got, own)
	}
}
