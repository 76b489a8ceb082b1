//go:build linux

package main

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
)

// creator makes long-lived sandboxes of one system: the unit of the burst
// and idle-memory figures.
type creator interface {
	system() string
	name() string
	// roots are the system's own processes (daemons, runners): their trees'
	// CPU time is the system's side of a create.
	roots() []int
	// prepare readies count creations (not timed).
	prepare(ctx context.Context, count int) error
	create(ctx context.Context, i int) error
	// cleanup deletes everything create made since prepare.
	cleanup(ctx context.Context) error
}

// cpuClock reads the CPU counters a burst is charged with.
type cpuClock struct {
	host   harness.CPUTimes
	server time.Duration // the system's process trees
	client time.Duration // this process and the children it waited for
}

func readCPU(roots []int) (cpuClock, error) {
	h, err := harness.ReadCPUTimes()
	if err != nil {
		return cpuClock{}, err
	}
	var self, kids syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return cpuClock{
		host:   h,
		server: harness.TreeCPU(roots...),
		client: tv(self.Utime) + tv(self.Stime) + tv(kids.Utime) + tv(kids.Stime),
	}, nil
}

// fill is one burst: count creations, conc at a time, timed from the first
// start to the last end, with the CPU time spent meanwhile.
type fill struct {
	Count, Conc                   int
	Elapsed                       time.Duration
	HostCPU, ServerCPU, ClientCPU time.Duration
}

func (f fill) rate() float64 { return float64(f.Count) / f.Elapsed.Seconds() }

func runFill(ctx context.Context, c creator, count, conc int) (fill, error) {
	f := fill{Count: count, Conc: conc}
	if err := c.prepare(ctx, count); err != nil {
		return f, fmt.Errorf("%s: prepare: %w", c.name(), err)
	}
	c0, err := readCPU(c.roots())
	if err != nil {
		return f, err
	}
	t0 := time.Now()
	err = harness.ForEach(ctx, count, conc, c.create)
	f.Elapsed = time.Since(t0)
	c1, cerr := readCPU(c.roots())
	if err != nil {
		return f, fmt.Errorf("%s: %w", c.name(), err)
	}
	if cerr != nil {
		return f, cerr
	}
	f.HostCPU = c1.host.Sub(c0.host).BusyTime()
	f.ServerCPU = max(c1.server-c0.server, 0)
	f.ClientCPU = c1.client - c0.client
	return f, nil
}

// rotate returns xs rotated left by k, so that the systems take turns at
// going first.
func rotate[T any](xs []T, k int) []T {
	if len(xs) == 0 {
		return xs
	}
	k %= len(xs)
	return append(append([]T(nil), xs[k:]...), xs[:k]...)
}
