package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// usedV1 are the v1 controllers a group joins.
var usedV1 = []string{"cpu", "cpuacct", "cpuset", "memory", "pids", "freezer"}

// removeTimeout bounds Delete's retries of a busy rmdir when ctx has no
// earlier deadline.
const removeTimeout = 5 * time.Second

// fileOps are the operations whose effect on a cgroup file system differs
// from a plain directory's (mkdir makes the control files, rmdir removes a
// directory full of them, a write is a command). Tests replace them with a
// fake kernel; reads go straight to the files.
type fileOps interface {
	Mkdir(dir string) error
	Rmdir(dir string) error
	WriteFile(file, data string) error
	// Extended attributes of a directory (marks: mark_linux.go).
	Setxattr(path, attr string, value []byte) error
	Removexattr(path, attr string) error
	Getxattr(path, attr string) ([]byte, error)
}

// kernelFS is the real cgroup file system.
type kernelFS struct{}

func (kernelFS) Mkdir(dir string) error { return os.Mkdir(dir, 0o755) }

func (kernelFS) Rmdir(dir string) error {
	if err := unix.Rmdir(dir); err != nil {
		return &fs.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	return nil
}

func (kernelFS) Setxattr(path, attr string, value []byte) error {
	return unix.Setxattr(path, attr, value, 0)
}

func (kernelFS) Removexattr(path, attr string) error { return unix.Removexattr(path, attr) }

func (kernelFS) Getxattr(path, attr string) ([]byte, error) {
	buf := make([]byte, 64)
	n, err := unix.Getxattr(path, attr, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

func (kernelFS) WriteFile(file, data string) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(data)
	return errors.Join(err, f.Close())
}

// Manager creates and removes the groups under one parent group.
type Manager struct {
	parent string
	layout Layout
	// v1 are the distinct mountpoints of the v1 hierarchies groups join,
	// sorted; empty in Unified mode.
	v1 []string
	// ceiling limits the parent (Config.Ceiling).
	ceiling Resources
	fs      fileOps
}

// New returns a Manager of the groups under cfg.Parent. It makes nothing:
// the parent group is created by the first Create.
func New(cfg Config) (*Manager, error) {
	if cfg.Parent == "" {
		cfg.Parent = DefaultParent
	}
	if !ValidName(cfg.Parent) {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument,
			"cgroup parent %q is invalid: use one name of [a-z0-9._-]", cfg.Parent)
	}
	l := cfg.Layout
	if l.Mode == 0 {
		var err error
		if l, err = DetectLayout(); err != nil {
			return nil, err
		}
	}
	if err := cfg.Ceiling.Validate(); err != nil {
		return nil, fmt.Errorf("cgroup ceiling: %w", err)
	}
	if cfg.Ceiling.CPUs != 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "cgroup ceiling: a CPU ceiling is not supported: CPU limits are caps, overcommitted")
	}
	m := &Manager{parent: cfg.Parent, layout: l, ceiling: cfg.Ceiling, fs: kernelFS{}}
	switch l.Mode {
	case V1, Hybrid:
		for _, c := range usedV1 {
			if mp := l.V1[c]; mp != "" && !slices.Contains(m.v1, mp) {
				m.v1 = append(m.v1, mp)
			}
		}
		if len(m.v1) == 0 {
			return nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
				"no cgroup v1 hierarchy of %s is mounted", strings.Join(usedV1, ", "))
		}
		slices.Sort(m.v1)
	case Unified:
	default:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "cgroup layout mode %v is unknown", l.Mode)
	}
	if l.Mode != V1 && l.Unified == "" {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "cgroup layout in %v mode has no cgroup2 mountpoint", l.Mode)
	}
	return m, nil
}

// Layout returns the layout the Manager works on.
func (m *Manager) Layout() Layout { return m.layout }

// roots are the mountpoints of every hierarchy used, cgroup2 first.
func (m *Manager) roots() []string {
	if m.layout.Mode == V1 {
		return m.v1
	}
	return append([]string{m.layout.Unified}, m.v1...)
}

// dirs are the group's directories in every hierarchy, cgroup2 first.
func (m *Manager) dirs(name string) []string {
	var d []string
	for _, r := range m.roots() {
		d = append(d, filepath.Join(r, m.parent, name))
	}
	return d
}

// v1Dir is the group's directory in the v1 hierarchy of ctrl, "" when ctrl
// is not mounted (or in Unified mode).
func (m *Manager) v1Dir(ctrl, name string) string {
	mp := m.layout.V1[ctrl]
	if mp == "" || m.layout.Mode == Unified {
		return ""
	}
	return filepath.Join(mp, m.parent, name)
}

// v2Dir is the group's cgroup2 directory, "" in V1 mode.
func (m *Manager) v2Dir(name string) string {
	if m.layout.Mode == V1 {
		return ""
	}
	return filepath.Join(m.layout.Unified, m.parent, name)
}

// Create makes the group name in every hierarchy and sets its limits. It
// fails with ErrAlreadyExists when the group (or part of it) exists, and
// ErrFailedPrecondition when a limit needs a controller the host does not
// offer; on failure it removes what it made.
func (m *Manager) Create(name string, r Resources) (err error) {
	if err := checkName(name); err != nil {
		return err
	}
	if err := r.Validate(); err != nil {
		return err
	}
	if err := m.prepareParent(r); err != nil {
		return fmt.Errorf("create cgroup %s: %w", name, err)
	}
	var made []string
	defer func() {
		if err == nil {
			return
		}
		for _, d := range slices.Backward(made) {
			if rerr := m.fs.Rmdir(d); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = errors.Join(err, fmt.Errorf("remove partial cgroup: %w", rerr))
			}
		}
	}()
	for _, d := range m.dirs(name) {
		if err := m.fs.Mkdir(d); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("create cgroup %s: %s: %w", name, d, errdefs.ErrAlreadyExists)
			}
			return fmt.Errorf("create cgroup %s: %w", name, classify(err))
		}
		made = append(made, d)
	}
	if m.layout.Mode == Unified {
		err = m.setupV2(name, r)
	} else {
		err = m.setupV1(name, r)
	}
	if err != nil {
		return fmt.Errorf("create cgroup %s: %w", name, err)
	}
	return nil
}

// prepareParent makes the parent group in every hierarchy and readies it
// for children that have the controllers r needs.
func (m *Manager) prepareParent(r Resources) error {
	_, err := m.prepareParentMade(r)
	return err
}

// prepareParentMade is prepareParent, reporting whether it made the parent
// in a hierarchy (and so wrote the ceiling).
func (m *Manager) prepareParentMade(r Resources) (made bool, err error) {
	if m.layout.Mode != Unified {
		if err := m.checkV1(r); err != nil {
			return false, err
		}
	}
	for _, root := range m.roots() {
		d := filepath.Join(root, m.parent)
		err := m.fs.Mkdir(d)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return false, fmt.Errorf("create parent: %w", classify(err))
		}
		made = made || err == nil
	}
	if m.layout.Mode == Unified {
		err = m.prepareV2Parent(r)
	} else {
		err = m.prepareV1Parent()
	}
	if err == nil && made {
		// A parent made again (removed by hand or by dsec purge) gets
		// the ceiling back before any group joins it.
		err = m.writeCeiling()
	}
	return made, err
}

// ProcsFiles are the cgroup.procs files a process is written into to join
// the group in every hierarchy.
func (m *Manager) ProcsFiles(name string) ([]string, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	var f []string
	for _, d := range m.dirs(name) {
		f = append(f, filepath.Join(d, "cgroup.procs"))
	}
	return f, nil
}

// Add moves the process pid (all its threads) into the group in every
// hierarchy. It fails with ErrNotFound when the group or the process does
// not exist.
func (m *Manager) Add(name string, pid int) error {
	files, err := m.ProcsFiles(name)
	if err != nil {
		return err
	}
	if pid <= 0 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "pid %d is invalid", pid)
	}
	if !m.exists(name) {
		return notFound(name)
	}
	for _, f := range files {
		if err := m.fs.WriteFile(f, strconv.Itoa(pid)); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("add process %d to cgroup %s: %w", pid, name, errdefs.ErrNotFound)
			}
			return fmt.Errorf("add process %d to cgroup %s: %w", pid, name, classify(err))
		}
	}
	return nil
}

// exists reports whether the group exists in its first hierarchy.
func (m *Manager) exists(name string) bool {
	fi, err := os.Stat(m.dirs(name)[0])
	return err == nil && fi.IsDir()
}

// List returns the names of the groups under the parent, sorted: every
// name that exists in at least one hierarchy, so that groups half removed
// by a crash are listed too.
func (m *Manager) List() ([]string, error) {
	var names []string
	for _, root := range m.roots() {
		ents, err := os.ReadDir(filepath.Join(root, m.parent))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list cgroups: %w", classify(err))
		}
		for _, e := range ents {
			if e.IsDir() && ValidName(e.Name()) && !slices.Contains(names, e.Name()) {
				names = append(names, e.Name())
			}
		}
	}
	slices.Sort(names)
	return names, nil
}

// Delete kills the group's processes and removes the group, with any
// groups nested in it, from every hierarchy. Deleting a group that does
// not exist returns nil.
func (m *Manager) Delete(ctx context.Context, name string) error {
	if err := m.Kill(ctx, name); err != nil {
		return fmt.Errorf("delete cgroup: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, removeTimeout)
	defer cancel()
	for _, d := range slices.Backward(m.dirs(name)) {
		groups, err := subgroups(d)
		if err != nil {
			return fmt.Errorf("delete cgroup %s: %w", name, err)
		}
		for _, g := range groups {
			if err := m.rmdir(ctx, g); err != nil {
				return fmt.Errorf("delete cgroup %s: %w", name, err)
			}
		}
	}
	return nil
}

// rmdir removes one group, retrying while the kernel reports it busy (its
// last tasks are still exiting). A missing group is success.
func (m *Manager) rmdir(ctx context.Context, dir string) error {
	var last error
	err := poll(ctx, func() (bool, error) {
		last = m.fs.Rmdir(dir)
		switch {
		case last == nil || errors.Is(last, fs.ErrNotExist):
			return true, nil
		case errors.Is(last, syscall.EBUSY):
			return false, nil
		}
		return false, classify(last)
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w: %w", last, err)
	}
	return err
}

// subgroups returns dir and every group nested in it, deepest first; none
// when dir does not exist.
func subgroups(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, classify(err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		sub, err := subgroups(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, sub...)
	}
	return append(out, dir), nil
}

// OOMKills reports how many of the group's processes the OOM killer
// killed, from one file: for watchers that look at every group often.
// A group that does not exist has none.
func (m *Manager) OOMKills(name string) (int64, error) {
	if err := checkName(name); err != nil {
		return 0, err
	}
	if m.layout.Mode == Unified {
		return readKey(filepath.Join(m.v2Dir(name), "memory.events"), "oom_kill")
	}
	if d := m.v1Dir("memory", name); d != "" {
		return readKey(filepath.Join(d, "memory.oom_control"), "oom_kill")
	}
	return 0, nil
}

// Stats reports what the group uses. It fails with ErrNotFound when the
// group does not exist.
func (m *Manager) Stats(name string) (Stats, error) {
	if err := checkName(name); err != nil {
		return Stats{}, err
	}
	if !m.exists(name) {
		return Stats{}, notFound(name)
	}
	var (
		s   Stats
		err error
	)
	if m.layout.Mode == Unified {
		s, err = m.v2Stats(name)
	} else {
		s, err = m.v1Stats(name)
	}
	if err != nil {
		return Stats{}, fmt.Errorf("cgroup %s stats: %w", name, err)
	}
	return s, nil
}

// readString reads a control file, without surrounding space.
func readString(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", classify(err)
	}
	return strings.TrimSpace(string(b)), nil
}

// statFile is one number of Stats: the whole of file, or the value of key
// in it. An empty file is skipped.
type statFile struct {
	dst       *int64
	file, key string
}

// readStats reads each statFile.
func readStats(sf []statFile) error {
	for _, f := range sf {
		if f.file == "" {
			continue
		}
		var err error
		if f.key != "" {
			*f.dst, err = readKey(f.file, f.key)
		} else {
			*f.dst, err = readInt(f.file)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readInt reads a control file holding one number or "max"; "max", a
// missing file and v1's "unlimited" (a number near 2^63) read as 0.
func readInt(file string) (int64, error) {
	s, err := readString(file)
	switch {
	case errors.Is(err, fs.ErrNotExist) || s == "max":
		return 0, nil
	case err != nil:
		return 0, err
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", file, err)
	}
	if v >= 1<<62 || v < 0 {
		return 0, nil
	}
	return v, nil
}

// readKey reads the value of key in a control file of "key value" lines; a
// missing file or key reads as 0.
func readKey(file, key string) (int64, error) {
	s, err := readString(file)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s of %s: %w", key, file, err)
			}
			return n, nil
		}
	}
	return 0, nil
}

// poll calls done until it reports true or fails, or ctx ends, sleeping
// from 1ms up to 20ms between calls.
func poll(ctx context.Context, done func() (bool, error)) error {
	return pollFrom(ctx, time.Millisecond, done)
}

// pollFrom is poll with a first sleep of first.
func pollFrom(ctx context.Context, first time.Duration, done func() (bool, error)) error {
	const maxDelay = 20 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for delay := first; ; delay = min(2*delay, maxDelay) {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		t.Reset(delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
