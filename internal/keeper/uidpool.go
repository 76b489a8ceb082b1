package keeper

import (
	"sync"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// uidPool hands out the sandboxes' host id ranges: range i maps ids 0 to
// Size-1 inside a sandbox to Base+i*Size and up on the host. Every sandbox
// (warm ones too) holds one of its own while it exists, so that no two
// sandboxes share a host uid: their processes cannot signal or ptrace each
// other's, and the kernel's per-user counts (processes, inotify instances,
// user namespaces, ...) of one are never another's.
//
// A range is taken when a sandbox starts, recorded in its keeper.json
// (SandboxInfo.IDBase) and given back when it is destroyed. Ranges are
// handed out round-robin, so a range given back is reused only after every
// other free one: whatever a dead sandbox's ids may still be charged with
// in the kernel has long drained by then.
type uidPool struct {
	base, size uint32
	n          int

	mu sync.Mutex
	// guarded by mu
	used map[int]int // range → sandboxes holding it (more than one only for adopted sandboxes of the shared range of older versions)
	next int         // where the next search starts
}

func newUIDPool(m rootfs.IDMap, n int) *uidPool {
	return &uidPool{base: m.HostID, size: m.Size, n: n, used: map[int]int{}}
}

// take returns a free range.
func (p *uidPool) take() (rootfs.IDMap, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := 0; k < p.n; k++ {
		i := (p.next + k) % p.n
		if p.used[i] == 0 {
			p.used[i] = 1
			p.next = (i + 1) % p.n
			return p.idmap(i), nil
		}
	}
	return rootfs.IDMap{}, errdefs.Newf(errdefs.ErrResourceExhausted,
		"all %d host id ranges of this node are in use (one per sandbox): delete sandboxes, or start dsec up with more --uid-ranges", p.n)
}

// hold marks the range of m as used by one more sandbox (a sandbox a
// restarted keeper adopts); a range outside the pool is ignored.
func (p *uidPool) hold(m rootfs.IDMap) {
	i, ok := p.index(m)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.used[i]++
}

// put gives the range of m back.
func (p *uidPool) put(m rootfs.IDMap) {
	i, ok := p.index(m)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used[i] > 1 {
		p.used[i]--
	} else {
		delete(p.used, i)
	}
}

// inUse returns the number of ranges held.
func (p *uidPool) inUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.used)
}

func (p *uidPool) idmap(i int) rootfs.IDMap {
	return rootfs.IDMap{HostID: p.base + uint32(i)*p.size, Size: p.size}
}

func (p *uidPool) index(m rootfs.IDMap) (int, bool) {
	if m.Size != p.size || m.HostID < p.base || (m.HostID-p.base)%p.size != 0 {
		return 0, false
	}
	i := int((m.HostID - p.base) / p.size)
	return i, i < p.n
}

// maxUIDRanges is how many ranges of size ids fit above base in 32 bits
// (the last id, 2^32-1, is the kernel's invalid id).
func maxUIDRanges(base, size uint32) int {
	if size == 0 || uint64(base)+uint64(size) > 1<<32-1 {
		return 0
	}
	return int((uint64(1<<32-1) - uint64(base)) / uint64(size))
}
