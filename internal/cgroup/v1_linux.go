package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// cpusetFiles must be set in a v1 cpuset group before a task can join it; a
// new group starts with them empty.
var cpusetFiles = []string{"cpuset.cpus", "cpuset.mems"}

// checkV1 reports a limit whose v1 controller is not mounted.
func (m *Manager) checkV1(r Resources) error {
	for _, need := range []struct {
		ctrl string
		set  bool
	}{{"memory", r.MemoryBytes > 0}, {"cpu", r.CPUs > 0}, {"pids", r.Pids > 0}} {
		if need.set && m.layout.V1[need.ctrl] == "" {
			return errdefs.Newf(errdefs.ErrFailedPrecondition,
				"cgroup v1 controller %s is not mounted, so its limit cannot be set: mount it or drop the limit", need.ctrl)
		}
	}
	return nil
}

// prepareV1Parent gives the parent's cpuset group the CPUs and memory
// nodes of the hierarchy's root when it has none.
func (m *Manager) prepareV1Parent() error {
	root := m.layout.V1["cpuset"]
	if root == "" {
		return nil
	}
	return m.inheritCpuset(root, filepath.Join(root, m.parent))
}

// setupV1 readies a new group's cpuset and writes its limits.
func (m *Manager) setupV1(name string, r Resources) error {
	if d := m.v1Dir("cpuset", name); d != "" {
		if err := m.inheritCpuset(filepath.Dir(d), d); err != nil {
			return err
		}
	}
	var w []write
	if r.MemoryBytes > 0 {
		// memsw (memory+swap) equal to the memory limit forbids swap
		// beyond it; memory first, since memsw may not be below it.
		d := m.v1Dir("memory", name)
		v := strconv.FormatInt(r.MemoryBytes, 10)
		w = append(w, write{filepath.Join(d, "memory.limit_in_bytes"), v})
		if f := filepath.Join(d, "memory.memsw.limit_in_bytes"); exists(f) {
			w = append(w, write{f, v})
		}
	}
	if d := m.v1Dir("memory", name); d != "" {
		// A running sandbox's memory never goes to swap through its
		// own reclaim (AllowSwap lifts this while it is paused).
		if f := filepath.Join(d, "memory.swappiness"); exists(f) {
			w = append(w, write{f, "0"})
		}
	}
	if r.CPUs > 0 {
		d := m.v1Dir("cpu", name)
		w = append(w,
			write{filepath.Join(d, "cpu.cfs_period_us"), strconv.Itoa(cpuPeriod)},
			write{filepath.Join(d, "cpu.cfs_quota_us"), strconv.FormatInt(cpuQuota(r.CPUs), 10)})
	}
	if r.Pids > 0 {
		w = append(w, write{filepath.Join(m.v1Dir("pids", name), "pids.max"), strconv.FormatInt(r.Pids, 10)})
	}
	return m.writeAll(w)
}

// inheritCpuset copies cpuset.cpus and cpuset.mems from parent to dir
// where dir's are empty.
func (m *Manager) inheritCpuset(parent, dir string) error {
	for _, f := range cpusetFiles {
		cur, err := readString(filepath.Join(dir, f))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if cur != "" {
			continue
		}
		v, err := readString(filepath.Join(parent, f))
		if err != nil {
			return err
		}
		if err := m.fs.WriteFile(filepath.Join(dir, f), v); err != nil {
			return classify(err)
		}
	}
	return nil
}

// v1Stats reads a group's use from its v1 hierarchies.
func (m *Manager) v1Stats(name string) (Stats, error) {
	var s Stats
	var cpuNanos int64
	in := func(ctrl, file string) string {
		if d := m.v1Dir(ctrl, name); d != "" {
			return filepath.Join(d, file)
		}
		return ""
	}
	err := readStats([]statFile{
		{&s.MemoryBytes, in("memory", "memory.usage_in_bytes"), ""},
		{&s.MemoryLimit, in("memory", "memory.limit_in_bytes"), ""},
		{&s.OOMKills, in("memory", "memory.oom_control"), "oom_kill"},
		{&cpuNanos, in("cpuacct", "cpuacct.usage"), ""},
		{&s.Pids, in("pids", "pids.current"), ""},
		{&s.PidsLimit, in("pids", "pids.max"), ""},
	})
	s.CPUUsage = time.Duration(cpuNanos)
	return s, err
}

// write is one write to a control file.
type write struct{ file, data string }

// writeAll makes the writes in order.
func (m *Manager) writeAll(ws []write) error {
	for _, w := range ws {
		if err := m.fs.WriteFile(w.file, w.data); err != nil {
			return fmt.Errorf("set %s: %w", filepath.Base(w.file), classify(err))
		}
	}
	return nil
}
