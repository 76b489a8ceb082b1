package edge

import (
	"strconv"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// Disk admission. A sandbox's writable disk and its exec output quota live
// on the state dir's file system (sparse disk images or quota directories,
// and output files), so they are admitted against that file system's free
// space above a reserve kept for the host ("the space left"):
//
//   - one sandbox's disk plus output quota must fit the space left, never
//     overcommitted: no single sandbox may fill the file system past the
//     reserve;
//   - all sandboxes' disks plus output quotas together may add up to
//     DiskOvercommit times the space left: disks are sparse and most
//     sandboxes write a small part of theirs, so, as with memory, limits
//     are overcommitted and the free space is measured again at every
//     create (space a sandbox has written is no longer free, so a filling
//     node admits less and less).
const (
	// DefaultDiskOvercommit is Config.DiskOvercommit's default.
	DefaultDiskOvercommit = 32
	// DefaultOutputQuota is the keeper's exec output quota per sandbox
	// (keeper.Config.OutputQuota), Config.OutputQuota's default.
	DefaultOutputQuota = 256 << 20
)

// diskRetry is the retry hint of a disk refusal: space comes back when
// sandboxes are deleted, which takes longer than memory to matter.
const diskRetry = 30 * time.Second

// diskNeed is what a sandbox with a writable disk of disk bytes takes from
// the state dir's file system at most.
func (e *Edge) diskNeed(disk int64) int64 { return disk + e.cfg.OutputQuota }

// admitDisk reserves the state dir's space for a sandbox with a writable
// disk of disk bytes, or refuses it naming disk: InvalidArgument when the
// file system could never hold it, ResourceExhausted (with a retry hint)
// when it could once space is freed.
func (e *Edge) admitDisk(disk int64) (release func(), err error) {
	need := e.diskNeed(disk)
	sp, err := e.diskSpace()
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrInternal, "disk admission: %v", err)
	}
	reserve := e.cfg.DiskReserve.Or(ceiling.DiskReserve).Of(sp.Size)
	if most := sp.Size - reserve; need > most {
		// More than the whole file system holds for sandboxes: no delete
		// ever makes room for it here.
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument,
			"disk %s is more than node %s can ever give a sandbox: the most is %s (its state dir's file system holds %s, "+
				"less %s kept for the host and %s for the sandbox's exec output); ask for at most that (--disk)",
			ceiling.FormatBytes(disk), e.cfg.Node, ceiling.FormatBytes(max(most-e.cfg.OutputQuota, 0)),
			ceiling.FormatBytes(sp.Size), ceiling.FormatBytes(reserve), ceiling.FormatBytes(e.cfg.OutputQuota))
	}
	left := max(sp.Free-reserve, 0)
	if need > left {
		return nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrResourceExhausted,
			"disk: %s asked (%s writable disk and %s of exec output), %s left on the state dir's file system of node %s "+
				"(%s free, %s kept for the host): ask for a smaller disk (--disk), retry once the node's operator freed space there, or retry on another node",
			ceiling.FormatBytes(need), ceiling.FormatBytes(disk), ceiling.FormatBytes(e.cfg.OutputQuota), ceiling.FormatBytes(left),
			e.cfg.Node, ceiling.FormatBytes(sp.Free), ceiling.FormatBytes(reserve)), diskRetry)
	}
	budget := int64(e.cfg.DiskOvercommit * float64(left))
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.diskCommitted+need > budget {
		return nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrResourceExhausted,
			"disk: node %s has no room for %s more: %s of writable disks and exec output admitted, at most %s "+
				"(%s × the %s left on the state dir's file system): delete sandboxes, ask for a smaller disk (--disk), or retry later",
			e.cfg.Node, ceiling.FormatBytes(need), ceiling.FormatBytes(e.diskCommitted), ceiling.FormatBytes(budget),
			strconv.FormatFloat(e.cfg.DiskOvercommit, 'g', -1, 64), ceiling.FormatBytes(left)), diskRetry)
	}
	e.diskCommitted += need
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			e.diskCommitted -= need
			e.mu.Unlock()
		})
	}, nil
}

// checkFits refuses, with InvalidArgument, resources this node can never
// give one sandbox however many others are deleted: memory above what all
// sandboxes together may hold (the host's memory for sandboxes, and that
// times the overcommit ratio), pids above the tasks all sandboxes together
// may run. Waiting cannot help, so there is no retry hint; what only
// running sandboxes hold back is admit's (ResourceExhausted). Disk is
// admitDisk's, which measures the file system.
func (e *Edge) checkFits(r sandbox.Resources) error {
	if most := e.mostMemory(); r.MemoryBytes > most {
		why := "the host's memory less what --host-memory-reserve keeps for it"
		if e.memoryCapacity() < e.cfg.MemoryBytes {
			why = "its memory for sandboxes × --memory-overcommit " + strconv.FormatFloat(e.cfg.MemoryOvercommit, 'g', -1, 64)
		}
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"memory %s is more than node %s can ever give a sandbox: the most is %s (%s); ask for at most that (--memory)",
			ceiling.FormatBytes(r.MemoryBytes), e.cfg.Node, ceiling.FormatBytes(most), why)
	}
	if most := e.cfg.PidsCeiling; most > 0 && r.Pids > most {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"pids %d is more than node %s can ever give a sandbox: the most is %d, what all its sandboxes together may run "+
				"(the host's task limit less what --host-pids-reserve keeps for it); ask for at most that (--pids)",
			r.Pids, e.cfg.Node, most)
	}
	return nil
}

// mostMemory is the largest memory limit one sandbox can ever be admitted
// with: what all of them may hold, and the memory they share.
func (e *Edge) mostMemory() int64 { return min(e.memoryCapacity(), e.cfg.MemoryBytes) }

// mostDisk is the largest writable disk one sandbox can ever be admitted
// with here, as the node reports it to placement (0: the file system
// cannot be measured).
func (e *Edge) mostDisk() int64 {
	sp, err := e.diskSpace()
	if err != nil {
		return 0
	}
	return max(sp.Size-e.cfg.DiskReserve.Or(ceiling.DiskReserve).Of(sp.Size)-e.cfg.OutputQuota, 0)
}

// Admission is what a node's admission holds.
type Admission struct {
	// MemoryCommitted adds up the memory limits of every sandbox with a
	// record (state.go); MemoryCapacity is what they may add up to.
	MemoryCommitted, MemoryCapacity int64
	// DiskCommitted adds up their writable disks and exec output quotas.
	DiskCommitted int64
}

// admission reports what admission holds now.
func (e *Edge) admission() Admission {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Admission{
		MemoryCommitted: e.committed,
		MemoryCapacity:  e.memoryCapacity(),
		DiskCommitted:   e.diskCommitted,
	}
}

// memoryCapacity is what the memory limits of a node's sandboxes may add
// up to.
func (e *Edge) memoryCapacity() int64 {
	return int64(float64(e.cfg.MemoryBytes) * e.cfg.MemoryOvercommit)
}
