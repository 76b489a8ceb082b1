package cgroup

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// v2Controllers are the cgroup2 controllers a group uses in Unified mode.
var v2Controllers = []string{"cpu", "memory", "pids"}

// prepareV2Parent checks the parent offers the controllers r needs and
// enables every one of v2Controllers it offers for its children.
func (m *Manager) prepareV2Parent(r Resources) error {
	d := filepath.Join(m.layout.Unified, m.parent)
	avail, err := readControllerList(filepath.Join(d, "cgroup.controllers"))
	if err != nil {
		return err
	}
	for _, need := range []struct {
		ctrl string
		set  bool
	}{{"memory", r.MemoryBytes > 0}, {"cpu", r.CPUs > 0}, {"pids", r.Pids > 0}} {
		if need.set && !slices.Contains(avail, need.ctrl) {
			return errdefs.Newf(errdefs.ErrFailedPrecondition,
				"cgroup v2 controller %s is not available in %s, so its limit cannot be set: "+
					"enable it in %s or drop the limit",
				need.ctrl, d, filepath.Join(m.layout.Unified, "cgroup.subtree_control"))
		}
	}
	enabled, err := readControllerList(filepath.Join(d, "cgroup.subtree_control"))
	if err != nil {
		return err
	}
	var add []string
	for _, c := range v2Controllers {
		if slices.Contains(avail, c) && !slices.Contains(enabled, c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	return m.writeAll([]write{{filepath.Join(d, "cgroup.subtree_control"), strings.Join(add, " ")}})
}

// setupV2 writes a new group's limits to its cgroup2 directory.
func (m *Manager) setupV2(name string, r Resources) error {
	d := m.v2Dir(name)
	var w []write
	if r.MemoryBytes > 0 {
		w = append(w, write{filepath.Join(d, "memory.max"), strconv.FormatInt(r.MemoryBytes, 10)})
	}
	// A running sandbox never swaps (AllowSwap lifts this while it is
	// paused). Without swap accounting the file is absent and there is
	// no swap to limit.
	if f := filepath.Join(d, "memory.swap.max"); exists(f) {
		w = append(w, write{f, "0"})
	}
	if r.CPUs > 0 {
		w = append(w, write{filepath.Join(d, "cpu.max"), fmt.Sprintf("%d %d", cpuQuota(r.CPUs), cpuPeriod)})
	}
	if r.Pids > 0 {
		w = append(w, write{filepath.Join(d, "pids.max"), strconv.FormatInt(r.Pids, 10)})
	}
	return m.writeAll(w)
}

// v2Stats reads a group's use from its cgroup2 directory.
func (m *Manager) v2Stats(name string) (Stats, error) {
	d := m.v2Dir(name)
	var s Stats
	var cpuMicros int64
	err := readStats([]statFile{
		{&s.MemoryBytes, filepath.Join(d, "memory.current"), ""},
		{&s.MemoryLimit, filepath.Join(d, "memory.max"), ""},
		{&s.OOMKills, filepath.Join(d, "memory.events"), "oom_kill"},
		{&cpuMicros, filepath.Join(d, "cpu.stat"), "usage_usec"},
		{&s.Pids, filepath.Join(d, "pids.current"), ""},
		{&s.PidsLimit, filepath.Join(d, "pids.max"), ""},
	})
	s.CPUUsage = time.Duration(cpuMicros) * time.Microsecond
	return s, err
}
