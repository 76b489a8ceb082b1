package cgroup

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// ApplyCeiling makes the parent group and writes Config.Ceiling to it:
// pids.max, and the memory limit (v1 memory.limit_in_bytes, cgroup2
// memory.max), in that order. It fails with ErrFailedPrecondition when
// the host does not offer a controller the ceiling needs, and with
// ErrResourceExhausted, after setting pids.max, when the groups in the
// parent already use more memory than the ceiling.
func (m *Manager) ApplyCeiling() error {
	made, err := m.prepareParentMade(m.ceiling)
	if err != nil {
		return fmt.Errorf("cgroup %s ceiling: %w", m.parent, err)
	}
	if made {
		return nil // prepareParentMade wrote it
	}
	if err := m.writeCeiling(); err != nil {
		return fmt.Errorf("cgroup %s ceiling: %w", m.parent, err)
	}
	return nil
}

// writeCeiling writes the ceiling's limits to the parent group, which
// exists, pids first. In V1 and Hybrid mode they go to the v1
// hierarchies, as a group's own limits do.
func (m *Manager) writeCeiling() error {
	c := m.ceiling
	pidsDir, memDir, memFile := m.v1Dir("pids", ""), m.v1Dir("memory", ""), "memory.limit_in_bytes"
	if m.layout.Mode == Unified {
		pidsDir, memDir, memFile = m.v2Dir(""), m.v2Dir(""), "memory.max"
	}
	if c.Pids > 0 {
		if err := m.writeAll([]write{{filepath.Join(pidsDir, "pids.max"), strconv.FormatInt(c.Pids, 10)}}); err != nil {
			return err
		}
	}
	if c.MemoryBytes > 0 {
		err := m.writeAll([]write{{filepath.Join(memDir, memFile), strconv.FormatInt(c.MemoryBytes, 10)}})
		if errors.Is(err, syscall.EBUSY) {
			// v1 refuses a limit below what the groups use and cannot
			// reclaim; the pids ceiling is set.
			return errdefs.Newf(errdefs.ErrResourceExhausted,
				"the sandboxes use more memory than the ceiling of %d bytes (%v): delete sandboxes or reserve less for the host", c.MemoryBytes, err)
		}
		return err
	}
	return nil
}

// Ceiling reports what the parent group, all groups together, uses and
// its limits (the ceiling as the kernel has it). It fails with
// ErrNotFound when the parent does not exist.
func (m *Manager) Ceiling() (Stats, error) {
	if !m.exists("") {
		return Stats{}, fmt.Errorf("cgroup %s: %w", m.parent, errdefs.ErrNotFound)
	}
	var (
		s   Stats
		err error
	)
	if m.layout.Mode == Unified {
		s, err = m.v2Stats("")
	} else {
		s, err = m.v1Stats("")
	}
	if err != nil {
		return Stats{}, fmt.Errorf("cgroup %s stats: %w", m.parent, err)
	}
	return s, nil
}
