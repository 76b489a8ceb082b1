// Package doctor checks that a node has what dsec needs, and says for each
// missing thing what to do about it.
//
// Each Check probes the real thing where a probe is possible: it mounts an
// EROFS image it built, idmaps it and stacks an overlayfs on it, creates a
// user namespace with the sandboxes' id range, calls openat2, pidfd_open and
// seccomp, and runs the OCI runtime. Version numbers are reported, never
// trusted in place of a probe.
//
// Invariants:
//   - A check leaves the node as it found it: temporary files live in one
//     temporary directory removed before the check returns, mounts are made
//     in a mount namespace private to one OS thread (so the host's mount
//     table never sees them) and undone, and that thread ends with the
//     check, taking its namespaces with it.
//   - A check never creates the state directory, a cgroup or a listener
//     that outlives it; what it writes stays in its temporary directory
//     (inside the state dir when that exists, so that the probes run on
//     the file system dsec uses), which it removes.
//   - Run returns a result for every check, whatever happens in the checks
//     (a panic in one is reported as its failure).
package doctor

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// Status is the outcome of a check.
type Status int

// The statuses.
const (
	// OK means dsec has what it needs.
	OK Status = iota
	// Warn means dsec works, with a limit the detail names.
	Warn
	// Fail means dsec (or the feature the check names) does not work.
	Fail
)

func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	case Fail:
		return "fail"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Symbol is the mark of the status in the text report.
func (s Status) Symbol() string {
	switch s {
	case OK:
		return "✓"
	case Warn:
		return "!"
	}
	return "✗"
}

// MarshalText writes the status as "ok", "warn" or "fail".
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads "ok", "warn" or "fail".
func (s *Status) UnmarshalText(b []byte) error {
	for _, v := range []Status{OK, Warn, Fail} {
		if string(b) == v.String() {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("status %q: want ok, warn or fail", b)
}

// Result is what one check found.
type Result struct {
	Status Status `json:"status"`
	// Detail says what was found, in one line.
	Detail string `json:"detail"`
	// Fix says what to do, for a Warn or a Fail; empty for OK.
	Fix string `json:"fix,omitempty"`
}

func okf(format string, args ...any) Result {
	return Result{Status: OK, Detail: fmt.Sprintf(format, args...)}
}

func warnf(fix, format string, args ...any) Result {
	return Result{Status: Warn, Detail: fmt.Sprintf(format, args...), Fix: fix}
}

func failf(fix, format string, args ...any) Result {
	return Result{Status: Fail, Detail: fmt.Sprintf(format, args...), Fix: fix}
}

// Env is what the checks check against: the settings `dsec up` would run
// with. The zero value checks the defaults.
type Env struct {
	// StateDir is dsec's state directory. Default /var/lib/dsec.
	StateDir string
	// Runtime is the OCI runtime dsec up would use: "crun", "runc" or a
	// path. Default: crun when installed, else runc.
	Runtime string
	// IDMap is the first sandbox's host uid/gid range (each sandbox has
	// one of its own, the next ones following it), UIDRanges how many
	// there are (0: the keeper's default). Default rootfs.Default.
	IDMap     rootfs.IDMap
	UIDRanges int
	// Binary is the dsec binary (the sandboxes' init and exec helper).
	// Default: the running executable.
	Binary string
	// Listen is the API address, host:port. Default 127.0.0.1:7420.
	Listen string
}

// span is the whole host id range the sandboxes' ranges take.
func (e Env) span() rootfs.IDMap {
	n := uint64(e.UIDRanges)
	if n == 0 {
		n = keeper.DefaultUIDRanges
	}
	total := n * uint64(e.IDMap.Size)
	if most := uint64(1<<32-1) - uint64(e.IDMap.HostID); total > most {
		total = most - most%uint64(max(e.IDMap.Size, 1))
	}
	return rootfs.IDMap{HostID: e.IDMap.HostID, Size: uint32(total)}
}

// withDefaults fills in the zero fields.
func (e Env) withDefaults() Env {
	if e.StateDir == "" {
		e.StateDir = "/var/lib/dsec"
	}
	if e.IDMap == (rootfs.IDMap{}) {
		e.IDMap = rootfs.Default
	}
	if e.Binary == "" {
		if p, err := os.Executable(); err == nil {
			e.Binary = p
		}
	}
	if e.Listen == "" {
		e.Listen = "127.0.0.1:7420"
	}
	return e
}

// Check is one thing dsec needs.
type Check struct {
	// Name is short and unique ("erofs mount").
	Name string
	// Required checks stop dsec from working when they fail; the others
	// limit it (disk limits, density) or report.
	Required bool
	// Run probes. It returns within a few seconds and cleans up
	// everything it made.
	Run func(ctx context.Context, env Env) Result
}

// Outcome is a check's result in a Report.
type Outcome struct {
	Name     string `json:"name"`
	Required bool   `json:"required"`
	Result
}

// Report is the result of every check, in order.
type Report struct {
	// OK is true when no required check failed.
	OK     bool      `json:"ok"`
	Checks []Outcome `json:"checks"`
}

// checkTimeout bounds one check.
const checkTimeout = 30 * time.Second

// Run runs every check of this platform (Checks) against env.
func Run(ctx context.Context, env Env) Report {
	return RunChecks(ctx, env, Checks())
}

// RunChecks runs checks one after the other against env, each with a
// deadline of its own, and reports them all.
func RunChecks(ctx context.Context, env Env, checks []Check) Report {
	env = env.withDefaults()
	r := Report{OK: true}
	for _, c := range checks {
		res := runOne(ctx, env, c)
		if c.Required && res.Status == Fail {
			r.OK = false
		}
		r.Checks = append(r.Checks, Outcome{Name: c.Name, Required: c.Required, Result: res})
	}
	return r
}

func runOne(ctx context.Context, env Env, c Check) (res Result) {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			res = failf("report this as a bug of dsec doctor", "the check crashed: %v", p)
		}
	}()
	if err := ctx.Err(); err != nil {
		return failf("run dsec doctor again", "not run: %v", err)
	}
	return c.Run(ctx, env)
}
