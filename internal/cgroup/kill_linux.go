package cgroup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// settleFreeze bounds how long Kill waits for a group to freeze before it
// signals the processes anyway.
const settleFreeze = 100 * time.Millisecond

// Kill kills every process of the group, and of groups nested in it, and
// returns once none is left, or fails when ctx ends first. Where the
// cgroup2 group has cgroup.kill the kernel kills them all at once;
// processes left (only in v1 groups, or on kernels without cgroup.kill)
// are killed while the group is frozen, so that none forks away, until
// none is left. A group that does not exist has nothing to kill.
func (m *Manager) Kill(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if d := m.v2Dir(name); d != "" && exists(filepath.Join(d, "cgroup.kill")) {
		if err := m.fs.WriteFile(filepath.Join(d, "cgroup.kill"), "1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("kill cgroup %s: %w", name, classify(err))
		}
		err := poll(ctx, func() (bool, error) {
			n, err := readKey(filepath.Join(d, "cgroup.events"), "populated")
			return n == 0, err
		})
		if err != nil {
			return fmt.Errorf("kill cgroup %s: wait until empty: %w", name, err)
		}
	}
	f := m.freezer(name)
	err := poll(ctx, func() (bool, error) {
		pids, err := m.pids(name)
		if err != nil || len(pids) == 0 {
			return err == nil, err
		}
		return false, m.killFrozen(ctx, f, name)
	})
	if err != nil {
		return fmt.Errorf("kill cgroup %s: %w", name, err)
	}
	return nil
}

// killFrozen freezes the group (waiting at most settleFreeze for it),
// sends SIGKILL to each of its processes and thaws it, so that they die.
func (m *Manager) killFrozen(ctx context.Context, f freezer, name string) (err error) {
	if f.dir != "" {
		if err := m.setFrozen(f, true); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		defer func() {
			if terr := m.setFrozen(f, false); terr != nil && !errors.Is(terr, fs.ErrNotExist) {
				err = errors.Join(err, terr)
			}
		}()
		sctx, cancel := context.WithTimeout(ctx, settleFreeze)
		_ = poll(sctx, func() (bool, error) { return isFrozen(f) }) // signal anyway when it does not settle
		cancel()
	}
	pids, err := m.pids(name)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal process %d: %w", pid, err)
		}
	}
	return nil
}

// Procs returns the processes in the group, in any hierarchy, and in the
// groups nested in it, sorted.
func (m *Manager) Procs(name string) ([]int, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	return m.pids(name)
}

// pids are the processes in the group, in any hierarchy, and in the groups
// nested in it, sorted.
func (m *Manager) pids(name string) ([]int, error) {
	var pids []int
	for _, d := range m.dirs(name) {
		groups, err := subgroups(d)
		if err != nil {
			return nil, err
		}
		for _, g := range groups {
			s, err := readString(filepath.Join(g, "cgroup.procs"))
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed meanwhile
			}
			if err != nil {
				return nil, err
			}
			for f := range strings.FieldsSeq(s) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					return nil, fmt.Errorf("parse %s: %w", filepath.Join(g, "cgroup.procs"), err)
				}
				if !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
		}
	}
	slices.Sort(pids)
	return pids, nil
}

// freezer is how a group is frozen: through cgroup2's cgroup.freeze or
// v1's freezer.state.
type freezer struct {
	v2  bool   // cgroup.freeze in dir, else freezer.state
	dir string // "" when the group cannot be frozen
}

func (m *Manager) freezer(name string) freezer {
	if d := m.v2Dir(name); d != "" && exists(filepath.Join(d, "cgroup.freeze")) {
		return freezer{v2: true, dir: d}
	}
	if d := m.v1Dir("freezer", name); d != "" {
		return freezer{dir: d}
	}
	return freezer{}
}

func (m *Manager) setFrozen(f freezer, frozen bool) error {
	if f.v2 {
		v := "0"
		if frozen {
			v = "1"
		}
		return classify(m.fs.WriteFile(filepath.Join(f.dir, "cgroup.freeze"), v))
	}
	v := "THAWED"
	if frozen {
		v = "FROZEN"
	}
	return classify(m.fs.WriteFile(filepath.Join(f.dir, "freezer.state"), v))
}

// isFrozen reports whether every process of the group is frozen.
func isFrozen(f freezer) (bool, error) {
	if f.v2 {
		n, err := readKey(filepath.Join(f.dir, "cgroup.events"), "frozen")
		return n == 1, err
	}
	s, err := readString(filepath.Join(f.dir, "freezer.state"))
	return s == "FROZEN", err
}

// Freeze stops every process of the group and returns once all are
// stopped. When ctx ends first it thaws the group again and fails.
func (m *Manager) Freeze(ctx context.Context, name string) error {
	return m.freeze(ctx, name, true)
}

// Thaw lets the processes of a frozen group run again and returns once
// the group is no longer frozen.
func (m *Manager) Thaw(ctx context.Context, name string) error {
	return m.freeze(ctx, name, false)
}

func (m *Manager) freeze(ctx context.Context, name string, frozen bool) error {
	op := "thaw"
	if frozen {
		op = "freeze"
	}
	if err := checkName(name); err != nil {
		return err
	}
	if !m.exists(name) {
		return notFound(name)
	}
	f := m.freezer(name)
	if f.dir == "" {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"cgroup %s cannot be frozen: the host has neither cgroup2's cgroup.freeze nor a v1 freezer hierarchy", name)
	}
	if err := m.setFrozen(f, frozen); err != nil {
		return fmt.Errorf("%s cgroup %s: %w", op, name, err)
	}
	err := waitFrozen(ctx, f, frozen)
	if err == nil {
		return nil
	}
	err = fmt.Errorf("%s cgroup %s: %w", op, name, err)
	if frozen {
		err = errors.Join(err, m.setFrozen(f, false))
	}
	return err
}

// waitFrozen waits until the group is frozen (or thawed). cgroup2 says so
// in cgroup.events, which wakes a poll(2) for POLLPRI when it changes: the
// wait ends as the kernel's change does, which polling with sleeps would
// miss by up to its sleep (a freeze takes from tens of microseconds to a
// few milliseconds, as the group's tasks get a CPU to stop on; a Go sleep
// of 20 µs on a busy node is often a millisecond). v1's freezer.state is
// polled.
func waitFrozen(ctx context.Context, f freezer, frozen bool) error {
	done := func() (bool, error) {
		is, err := isFrozen(f)
		return is == frozen, err
	}
	if !f.v2 {
		return pollFrom(ctx, 20*time.Microsecond, done)
	}
	ev, err := os.Open(filepath.Join(f.dir, "cgroup.events"))
	if err != nil {
		return classify(err)
	}
	defer ev.Close()
	want := []byte("frozen 0")
	if frozen {
		want = []byte("frozen 1")
	}
	buf := make([]byte, 256)
	wait := 20 * time.Microsecond
	for {
		n, err := ev.ReadAt(buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return classify(err)
		}
		if bytes.Contains(buf[:n], want) {
			return nil
		}
		// A change since the read above wakes the poll at once; the
		// kernel sends at most one such wake-up per file every 10 ms
		// (cgroup_file_notify), so the poll also times out, after 20 µs
		// and then twice as long each time, up to 2 ms.
		fds := []unix.PollFd{{Fd: int32(ev.Fd()), Events: unix.POLLPRI}}
		ts := unix.NsecToTimespec(int64(wait))
		if _, err := unix.Ppoll(fds, &ts, nil); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("poll %s: %w", ev.Name(), err)
		}
		wait = min(2*wait, 2*time.Millisecond)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
