package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Where a group's memory is, and moving it out of RAM: what pausing a
// sandbox needs (docs/pause.md).
//
// A running group never swaps on its own account: Create sets v1's
// memory.swappiness to 0 (so reclaim at the group's limit takes page
// cache only) and cgroup2's memory.swap.max to 0, and v1's memsw limit
// equal to the memory limit bounds what it holds in RAM and swap
// together. AllowSwap(true) lifts that while the group is paused.
// memory.swappiness of the root group is the host's vm.swappiness: the
// Manager never writes it (its groups are below Parent).

// swappinessPaused is v1's memory.swappiness of a group whose memory may
// go to swap: anonymous memory and page cache are reclaimed alike.
const swappinessPaused = "100"

// AllowSwap lets the group's memory go to swap (allow), or keeps it from
// swapping again: v1's memory.swappiness 100 or 0, cgroup2's
// memory.swap.max max or 0. Memory already in swap stays there until it
// is used. A host without the files (no memory controller, no swap
// accounting) has nothing to set.
func (m *Manager) AllowSwap(name string, allow bool) error {
	if err := checkName(name); err != nil {
		return err
	}
	if !m.exists(name) {
		return notFound(name)
	}
	file, v := m.swapControl(name, allow)
	if file == "" || !exists(file) {
		return nil
	}
	if err := m.fs.WriteFile(file, v); err != nil {
		return fmt.Errorf("cgroup %s: set %s: %w", name, filepath.Base(file), classify(err))
	}
	return nil
}

// swapControl is the file that lets a group swap and its value for
// allow; "" without a memory controller.
func (m *Manager) swapControl(name string, allow bool) (file, value string) {
	if m.layout.Mode == Unified {
		if allow {
			return filepath.Join(m.v2Dir(name), "memory.swap.max"), "max"
		}
		return filepath.Join(m.v2Dir(name), "memory.swap.max"), "0"
	}
	d := m.v1Dir("memory", name)
	if d == "" {
		return "", ""
	}
	if allow {
		return filepath.Join(d, "memory.swappiness"), swappinessPaused
	}
	return filepath.Join(d, "memory.swappiness"), "0"
}

// Reclaim has the kernel reclaim the group's memory (page cache, and
// anonymous memory as far as the group may swap): v1's memory.force_empty
// (which tries until the group holds nothing it can free), cgroup2's
// memory.reclaim of what it holds. What cannot be reclaimed (no swap
// left, locked pages, kernel memory) stays, and is no error: Memory says
// what is left. It fails with DeadlineExceeded when ctx ends first (the
// kernel's own pass is not interrupted).
func (m *Manager) Reclaim(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if !m.exists(name) {
		return notFound(name)
	}
	var file, v string
	if m.layout.Mode == Unified {
		cur, err := readInt(filepath.Join(m.v2Dir(name), "memory.current"))
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", name, err)
		}
		if cur == 0 {
			return nil
		}
		file, v = filepath.Join(m.v2Dir(name), "memory.reclaim"), strconv.FormatInt(cur, 10)
	} else {
		d := m.v1Dir("memory", name)
		if d == "" {
			return nil
		}
		file, v = filepath.Join(d, "memory.force_empty"), "0"
	}
	if !exists(file) {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- m.fs.WriteFile(file, v) }()
	select {
	case err := <-done:
		switch {
		case err == nil, errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EBUSY):
			// memory.reclaim says EAGAIN when it freed less than asked.
			return nil
		case errors.Is(err, syscall.EINTR):
			return fmt.Errorf("cgroup %s: reclaim: %w", name, errdefs.ErrDeadlineExceeded)
		}
		return fmt.Errorf("cgroup %s: reclaim: %w", name, classify(err))
	case <-ctx.Done():
		// The write ends on its own; the kernel bounds its retries.
		return fmt.Errorf("cgroup %s: reclaim: %w (%w)", name, errdefs.ErrDeadlineExceeded, ctx.Err())
	}
}

// Memory reports where the group's memory is, reading each file once.
// It fails with ErrNotFound when the group does not exist.
func (m *Manager) Memory(name string) (Memory, error) {
	if err := checkName(name); err != nil {
		return Memory{}, err
	}
	if !m.exists(name) {
		return Memory{}, notFound(name)
	}
	var mem Memory
	var dir, current, swapFile string
	var keys map[string]*int64
	if m.layout.Mode == Unified {
		dir = m.v2Dir(name)
		current, swapFile = "memory.current", "memory.swap.current"
		keys = map[string]*int64{"anon": &mem.Anon, "file": &mem.File, "unevictable": &mem.Unevictable, "file_writeback": &mem.Writeback}
	} else {
		if dir = m.v1Dir("memory", name); dir == "" {
			return Memory{}, nil
		}
		current = "memory.usage_in_bytes"
		keys = map[string]*int64{"total_swap": &mem.Swapped, "total_rss": &mem.Anon, "total_cache": &mem.File,
			"total_unevictable": &mem.Unevictable, "total_writeback": &mem.Writeback}
	}
	var err error
	if mem.Resident, err = readInt(filepath.Join(dir, current)); err != nil {
		return Memory{}, fmt.Errorf("cgroup %s memory: %w", name, err)
	}
	if swapFile != "" {
		if mem.Swapped, err = readInt(filepath.Join(dir, swapFile)); err != nil {
			return Memory{}, fmt.Errorf("cgroup %s memory: %w", name, err)
		}
	}
	stat, err := readString(filepath.Join(dir, "memory.stat"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Memory{}, fmt.Errorf("cgroup %s memory: %w", name, err)
	}
	for line := range strings.Lines(stat) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if dst := keys[k]; ok && dst != nil {
			if *dst, err = strconv.ParseInt(v, 10, 64); err != nil {
				return Memory{}, fmt.Errorf("cgroup %s memory: parse %s: %w", name, k, err)
			}
		}
	}
	return mem, nil
}
