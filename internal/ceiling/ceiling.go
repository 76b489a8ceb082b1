// Package ceiling sets the host-wide ceilings of a node: how much of the
// host's tasks (pids), memory and state-dir disk space all sandboxes
// together may take, so that no mix of sandboxes can fork-bomb, OOM or fill
// the host itself.
//
// Each ceiling is the host's total minus a Reserve kept for the host (its
// own processes, dsec's keeper, edge and exec helpers, and everything else
// that runs there). Pids and memory are enforced by the kernel on the
// cgroup that holds every sandbox (internal/cgroup's Manager.SetCeiling);
// disk space is enforced by the edge's admission, which measures the state
// dir's file system with DiskSpace.
//
// Invariant: a ceiling is never the whole host; a Reserve that would leave
// the sandboxes nothing is an error, not a zero ceiling.
package ceiling

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Reserve is how much of a host-wide resource is kept out of the
// sandboxes' reach: the larger of Fraction of the host's total and Min.
// The zero Reserve means the resource's default (PidsReserve,
// MemoryReserve, DiskReserve).
type Reserve struct {
	// Fraction of the host's total, in [0, 1).
	Fraction float64
	// Min is the smallest reserve, in the resource's unit (tasks or
	// bytes).
	Min int64
}

// The default reserves.
var (
	// PidsReserve keeps 25% of the host's task limit, at least 4,096
	// tasks, for the host: 8,192 of a pid_max of 32,768.
	PidsReserve = Reserve{Fraction: 0.25, Min: 4096}
	// MemoryReserve keeps 10% of the host's memory, at least 1 GiB, for
	// the host.
	MemoryReserve = Reserve{Fraction: 0.10, Min: 1 << 30}
	// DiskReserve keeps 5% of the state dir's file system, at least
	// 2 GiB, free of sandbox disks and exec output.
	DiskReserve = Reserve{Fraction: 0.05, Min: 2 << 30}
)

// IsZero reports whether r is the zero Reserve (the default).
func (r Reserve) IsZero() bool { return r == Reserve{} }

// Or returns r, or def when r is zero.
func (r Reserve) Or(def Reserve) Reserve {
	if r.IsZero() {
		return def
	}
	return r
}

// Of is the reserve of a host whose total is total: the larger of the
// fraction and the minimum, never more than total.
func (r Reserve) Of(total int64) int64 {
	v := max(int64(math.Ceil(r.Fraction*float64(total))), r.Min)
	return min(v, total)
}

// String formats r the way ParseReserve reads it.
func (r Reserve) String() string {
	switch {
	case r.Fraction > 0 && r.Min > 0:
		return pct(r.Fraction) + "," + strconv.FormatInt(r.Min, 10)
	case r.Fraction > 0:
		return pct(r.Fraction)
	}
	return strconv.FormatInt(r.Min, 10)
}

func pct(f float64) string { return strconv.FormatFloat(f*100, 'f', -1, 64) + "%" }

// ParseReserve reads a reserve: "auto" or "" (the default), a percentage of
// the host's total ("25%"), an amount ("4096" tasks; with sizes true, bytes
// with an optional unit, "1G"), or both, comma-separated, meaning the
// larger ("10%,1G"). A reserve must be above zero and a percentage below
// 100: the sandboxes' ceiling is never the whole host, nor nothing.
func ParseReserve(s string, sizes bool) (Reserve, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "auto" {
		return Reserve{}, nil
	}
	var r Reserve
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return Reserve{}, reserveError(s, "has more than two parts")
	}
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if num, ok := strings.CutSuffix(p, "%"); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
			if err != nil || math.IsNaN(f) || f <= 0 || f >= 100 || r.Fraction != 0 {
				return Reserve{}, reserveError(s, "has a percentage that is not above 0 and below 100")
			}
			r.Fraction = f / 100
			continue
		}
		if r.Min != 0 {
			return Reserve{}, reserveError(s, "has two amounts")
		}
		var (
			n   int64
			err error
		)
		if sizes {
			n, err = dsec.ParseSize(p)
		} else {
			n, err = strconv.ParseInt(p, 10, 64)
		}
		if err != nil || n <= 0 {
			return Reserve{}, reserveError(s, "has an amount that is not a number above 0")
		}
		r.Min = n
	}
	return r, nil
}

func reserveError(s, why string) error {
	return errdefs.Newf(errdefs.ErrInvalidArgument,
		"reserve %q %s: want auto, a percentage of the host (25%%), an amount, or both, meaning the larger (10%%,1G)", s, why)
}

// Host is what bounds the whole host.
type Host struct {
	// Tasks is the most tasks (processes and threads) the host can have:
	// the smaller of kernel.pid_max and kernel.threads-max.
	Tasks int64
	// MemoryBytes is the host's memory (MemTotal).
	MemoryBytes int64
}

// Sandboxes are the ceilings of all sandboxes together.
type Sandboxes struct {
	Pids        int64 // tasks
	MemoryBytes int64
}

// ForSandboxes returns what all sandboxes together may take of h once
// pids and mem are kept for the host; zero reserves are the defaults. It
// fails with InvalidArgument when a reserve leaves the sandboxes nothing.
func ForSandboxes(h Host, pids, mem Reserve) (Sandboxes, error) {
	pids, mem = pids.Or(PidsReserve), mem.Or(MemoryReserve)
	s := Sandboxes{Pids: h.Tasks - pids.Of(h.Tasks), MemoryBytes: h.MemoryBytes - mem.Of(h.MemoryBytes)}
	if s.Pids <= 0 {
		return Sandboxes{}, errdefs.Newf(errdefs.ErrInvalidArgument,
			"the host pids reserve %s leaves sandboxes none of the host's %d tasks: reserve less", pids, h.Tasks)
	}
	if s.MemoryBytes <= 0 {
		return Sandboxes{}, errdefs.Newf(errdefs.ErrInvalidArgument,
			"the host memory reserve %s leaves sandboxes none of the host's %s: reserve less", mem, FormatBytes(h.MemoryBytes))
	}
	return s, nil
}

// Space is the size and free space of a file system, in bytes.
type Space struct {
	// Free is what is available to use (statfs f_bavail, df's Avail).
	Free int64
	// Size is the file system's size.
	Size int64
}

// FormatBytes formats n bytes for people: "512 MiB", "3.2 GiB", "100 B".
func FormatBytes(n int64) string {
	units := []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	neg := ""
	if n < 0 {
		neg, n = "-", -n
	}
	for _, u := range units {
		if n < u.mult {
			continue
		}
		if n%u.mult == 0 {
			return fmt.Sprintf("%s%d %s", neg, n/u.mult, u.name)
		}
		return fmt.Sprintf("%s%.1f %s", neg, math.Floor(float64(n)/float64(u.mult)*10)/10, u.name)
	}
	return fmt.Sprintf("%s%d B", neg, n)
}
