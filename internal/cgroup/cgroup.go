// Package cgroup creates, limits, watches and removes one control group per
// sandbox, with the same code for cgroup v1, v2 and hybrid hosts.
//
// A Manager owns one group, Config.Parent, directly under the root of every
// hierarchy it uses, and each sandbox's group is a child of it:
// <mountpoint>/<Parent>/<name>. In V1 mode those hierarchies are the cpu,
// cpuacct, cpuset, memory, pids and freezer ones that are mounted; in Unified
// mode the cgroup2 mount; in Hybrid mode both, with limits set through v1
// and the v2 group used to kill, freeze and observe.
//
// The parent itself carries Config.Ceiling, the host-wide ceilings of all
// sandboxes together (pids.max and the memory limit of <Parent>), so that no
// mix of sandboxes can take the host's last tasks or memory: processes
// outside <Parent> (the host, dsec's keeper and its exec helpers until they
// join a sandbox) never count against it.
//
// Invariants: the Manager reads and writes only below <mountpoint>/<Parent>
// (it never mounts anything and never changes a group it did not name);
// names are single path components of [a-z0-9._-], so no name walks out of
// Parent; Create leaves nothing behind when it fails, and Delete removes a
// group in every hierarchy, whatever part of it exists, so that groups left
// by a crash are found by List and removed by Delete.
//
// A Manager is safe for concurrent use on different groups; operations on
// one group are serialised by the caller.
package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// DefaultParent is the group that holds all of dsec's groups when
// Config.Parent is empty.
const DefaultParent = "dsec"

// Config configures a Manager.
type Config struct {
	// Parent is the group under each hierarchy's root that holds every
	// group of this Manager; a single name of [a-z0-9._-]. Default
	// DefaultParent.
	Parent string
	// Layout is the host's cgroup layout. The zero value means
	// DetectLayout().
	Layout Layout
	// Ceiling limits the parent group, and so every group in it together:
	// MemoryBytes and Pids (CPUs must be 0). It is written by
	// ApplyCeiling and whenever the Manager has to make the parent again.
	// Zero fields leave the parent's limit as the kernel made it (none).
	Ceiling Resources
}

// Resources are the limits of a group. Zero means no limit.
type Resources struct {
	// MemoryBytes limits memory; swap is not allowed beyond it.
	MemoryBytes int64
	// CPUs is the CPU bandwidth in CPUs (1.5 = one and a half CPUs of time
	// per period).
	CPUs float64
	// Pids limits the number of tasks (processes and threads).
	Pids int64
}

// Validate reports negative or non-finite limits.
func (r Resources) Validate() error {
	switch {
	case r.MemoryBytes < 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "memory limit %d is negative", r.MemoryBytes)
	case r.Pids < 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "pids limit %d is negative", r.Pids)
	case r.CPUs < 0 || math.IsNaN(r.CPUs) || math.IsInf(r.CPUs, 0) || r.CPUs > maxCPUs:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "cpu limit %v is not between 0 and %d", r.CPUs, maxCPUs)
	}
	return nil
}

// Stats is what a group uses. Limits of 0 mean no limit; a field whose
// controller the group is not in is 0.
type Stats struct {
	MemoryBytes int64         // memory in use
	MemoryLimit int64         // memory limit
	CPUUsage    time.Duration // CPU time consumed
	Pids        int64         // tasks in the group
	PidsLimit   int64         // limit on tasks
	OOMKills    int64         // processes killed by the OOM killer
}

// Memory is where a group's memory is. Fields a host does not report are 0.
type Memory struct {
	// Resident is the memory charged to the group in RAM: anonymous
	// memory, page cache and swap cache, kernel memory (v1
	// memory.usage_in_bytes, cgroup2 memory.current).
	Resident int64
	// Swapped is the group's memory in swap (v1 memory.stat total_swap,
	// cgroup2 memory.swap.current).
	Swapped int64
	// Anon is anonymous memory in RAM; File page cache; Unevictable what
	// no reclaim can move (mlocked pages); Writeback what is being
	// written out now.
	Anon, File, Unevictable, Writeback int64
}

const (
	// cpuPeriod is the CFS period, in microseconds, of every CPU limit.
	cpuPeriod = 100000
	// minCPUQuota is the smallest quota the kernel accepts, in microseconds.
	minCPUQuota = 1000
	// maxCPUs bounds Resources.CPUs so that the quota fits comfortably.
	maxCPUs = 1 << 16
	// maxNameLen bounds a group name.
	maxNameLen = 128
)

// cpuQuota is the quota, in microseconds per cpuPeriod, of cpus CPUs.
func cpuQuota(cpus float64) int64 {
	return max(int64(math.Round(cpus*cpuPeriod)), minCPUQuota)
}

// ValidName reports whether name can name a group: a single path component
// of lower-case letters, digits, '.', '-' and '_', not "." or "..", at most
// 128 bytes.
func ValidName(name string) bool {
	if name == "" || name == "." || name == ".." || len(name) > maxNameLen {
		return false
	}
	for _, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_'
		if !ok {
			return false
		}
	}
	return true
}

func checkName(name string) error {
	if !ValidName(name) {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"cgroup name %q is invalid: use 1 to %d of [a-z0-9._-], not . or ..", name, maxNameLen)
	}
	return nil
}

// fsError classifies a file-system error with an error kind while keeping
// its message.
type fsError struct {
	kind error
	err  error
}

func (e *fsError) Error() string   { return e.err.Error() }
func (e *fsError) Unwrap() []error { return []error{e.kind, e.err} }

// classify wraps err, an error of the os package, with its kind: a missing
// file is ErrNotFound, a refused access ErrPermissionDenied.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return &fsError{kind: errdefs.ErrNotFound, err: err}
	case errors.Is(err, fs.ErrPermission):
		return &fsError{kind: errdefs.ErrPermissionDenied, err: err}
	}
	return err
}

// notFound is the error of an operation on a group that does not exist.
func notFound(name string) error {
	return fmt.Errorf("cgroup %s: %w", name, errdefs.ErrNotFound)
}
