package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// fakeKernel stands in for cgroupfs over a plain directory tree: Mkdir
// makes the control files the kernel would make in a new group, Rmdir
// refuses groups with children or processes and removes the files, and
// WriteFile writes only files that exist, interpreting the few whose
// effect a test reads back. It logs what it made and wrote.
type fakeKernel struct {
	base string
	// memsw says v1 memory groups have memory.memsw.* (swap accounting).
	memsw bool
	// swap says cgroup2 memory groups have memory.swap.max.
	swap bool
	// failWrite names a file (base name) whose writes fail with EIO,
	// busyWrite one whose writes fail with EBUSY.
	failWrite, busyWrite string
	// log is "mkdir <dir>" and "write <file> <data>", paths relative to base.
	log []string
	// xattrs are the extended attributes set, by path and name.
	xattrs map[string]string
}

// fakeOptions shape a fake host.
type fakeOptions struct {
	mode Mode
	// v1 are the v1 hierarchies (directory names), by default
	// "cpu,cpuacct", cpuset, freezer, memory, pids and devices.
	v1 []string
	// subtree is the cgroup2 root's cgroup.subtree_control, by default
	// "cpu memory pids".
	subtree string
	noMemsw bool
	noSwap  bool
}

// newFake returns a Manager of groups under "dsec" on a fake host.
func newFake(t *testing.T, o fakeOptions) (*Manager, *fakeKernel) {
	t.Helper()
	k := &fakeKernel{base: t.TempDir(), memsw: !o.noMemsw, swap: !o.noSwap}
	if o.v1 == nil {
		o.v1 = []string{"cpu,cpuacct", "cpuset", "freezer", "memory", "pids", "devices"}
	}
	if o.subtree == "" {
		o.subtree = "cpu memory pids"
	}
	put := func(file, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if o.mode != Unified {
		for _, h := range o.v1 {
			put(filepath.Join(k.base, h, "cgroup.procs"), "")
			if h == "cpuset" {
				put(filepath.Join(k.base, h, "cpuset.cpus"), "0-3\n")
				put(filepath.Join(k.base, h, "cpuset.mems"), "0\n")
			}
		}
	}
	if o.mode != V1 {
		u := filepath.Join(k.base, "unified")
		put(filepath.Join(u, "cgroup.procs"), "")
		put(filepath.Join(u, "cgroup.controllers"), "cpu io memory pids\n")
		put(filepath.Join(u, "cgroup.subtree_control"), o.subtree+"\n")
	}
	l, err := LayoutAt(k.base)
	if err != nil {
		t.Fatalf("LayoutAt(fake) error = %v", err)
	}
	if l.Mode != o.mode {
		t.Fatalf("LayoutAt(fake).Mode = %v, want %v", l.Mode, o.mode)
	}
	m, err := New(Config{Layout: l})
	if err != nil {
		t.Fatalf("New() error = %v", err)
	}
	m.fs = k
	return m, k
}

func (k *fakeKernel) rel(p string) string {
	r, err := filepath.Rel(k.base, p)
	if err != nil {
		panic(err)
	}
	return r
}

// hierarchy returns the directory name of the hierarchy p is in.
func (k *fakeKernel) hierarchy(p string) string {
	h, _, _ := strings.Cut(k.rel(p), string(filepath.Separator))
	return h
}

func (k *fakeKernel) Mkdir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	k.log = append(k.log, "mkdir "+k.rel(dir))
	files := map[string]string{"cgroup.procs": ""}
	h := k.hierarchy(dir)
	if h == "unified" {
		parent, err := os.ReadFile(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control"))
		if err != nil {
			return err
		}
		ctrls := strings.Fields(string(parent))
		files["cgroup.controllers"] = strings.Join(ctrls, " ") + "\n"
		files["cgroup.subtree_control"] = "\n"
		files["cgroup.events"] = "populated 0\nfrozen 0\n"
		files["cgroup.freeze"] = "0\n"
		files["cgroup.kill"] = ""
		files["cpu.stat"] = "usage_usec 0\nuser_usec 0\nsystem_usec 0\n"
		for _, c := range ctrls {
			switch c {
			case "memory":
				files["memory.max"] = "max\n"
				files["memory.current"] = "0\n"
				files["memory.reclaim"] = ""
				files["memory.stat"] = "anon 0\nfile 0\n"
				files["memory.events"] = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"
				if k.swap {
					files["memory.swap.max"] = "max\n"
					files["memory.swap.current"] = "0\n"
				}
			case "cpu":
				files["cpu.max"] = "max 100000\n"
			case "pids":
				files["pids.max"] = "max\n"
				files["pids.current"] = "0\n"
			}
		}
	}
	for c := range strings.SplitSeq(h, ",") {
		switch c {
		case "cpu":
			files["cpu.cfs_period_us"] = "100000\n"
			files["cpu.cfs_quota_us"] = "-1\n"
		case "cpuacct":
			files["cpuacct.usage"] = "0\n"
		case "cpuset":
			files["cpuset.cpus"] = "\n"
			files["cpuset.mems"] = "\n"
		case "memory":
			files["memory.limit_in_bytes"] = "9223372036854771712\n"
			files["memory.usage_in_bytes"] = "0\n"
			files["memory.oom_control"] = "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"
			files["memory.swappiness"] = "60\n"
			files["memory.force_empty"] = ""
			files["memory.stat"] = "cache 0\nrss 0\ntotal_cache 0\ntotal_rss 0\ntotal_swap 0\n"
			if k.memsw {
				files["memory.memsw.limit_in_bytes"] = "9223372036854771712\n"
			}
		case "pids":
			files["pids.max"] = "max\n"
			files["pids.current"] = "0\n"
		case "freezer":
			files["freezer.state"] = "THAWED\n"
		}
	}
	for f, data := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (k *fakeKernel) Rmdir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if len(strings.TrimSpace(string(procs))) > 0 || slices.ContainsFunc(ents, fs.DirEntry.IsDir) {
		return &fs.PathError{Op: "rmdir", Path: dir, Err: syscall.EBUSY}
	}
	return os.RemoveAll(dir)
}

func (k *fakeKernel) Setxattr(path, attr string, value []byte) error {
	if _, err := os.Stat(path); err != nil {
		return err
	}
	if k.xattrs == nil {
		k.xattrs = map[string]string{}
	}
	k.xattrs[k.rel(path)+" "+attr] = string(value)
	k.log = append(k.log, fmt.Sprintf("setxattr %s %s", k.rel(path), attr))
	return nil
}

func (k *fakeKernel) Removexattr(path, attr string) error {
	if _, ok := k.xattrs[k.rel(path)+" "+attr]; !ok {
		return syscall.ENODATA
	}
	delete(k.xattrs, k.rel(path)+" "+attr)
	k.log = append(k.log, fmt.Sprintf("removexattr %s %s", k.rel(path), attr))
	return nil
}

func (k *fakeKernel) Getxattr(path, attr string) ([]byte, error) {
	v, ok := k.xattrs[k.rel(path)+" "+attr]
	if !ok {
		return nil, syscall.ENODATA
	}
	return []byte(v), nil
}

func (k *fakeKernel) WriteFile(file, data string) error {
	if filepath.Base(file) == k.failWrite {
		return &fs.PathError{Op: "write", Path: file, Err: syscall.EIO}
	}
	if filepath.Base(file) == k.busyWrite {
		return &fs.PathError{Op: "write", Path: file, Err: syscall.EBUSY}
	}
	old, err := os.ReadFile(file)
	if err != nil {
		return err // the kernel makes every control file; writes create none
	}
	k.log = append(k.log, fmt.Sprintf("write %s %s", k.rel(file), data))
	switch filepath.Base(file) {
	case "cgroup.subtree_control":
		on := strings.Fields(string(old))
		for w := range strings.FieldsSeq(data) {
			c := w[1:]
			if w[0] == '+' && !slices.Contains(on, c) {
				on = append(on, c)
			} else if w[0] == '-' {
				on = slices.DeleteFunc(on, func(s string) bool { return s == c })
			}
		}
		data = strings.Join(on, " ")
	case "cgroup.freeze":
		ev := "populated 0\nfrozen " + data + "\n"
		if err := os.WriteFile(filepath.Join(filepath.Dir(file), "cgroup.events"), []byte(ev), 0o644); err != nil {
			return err
		}
	case "cgroup.procs":
		data = string(old) + data + "\n"
	}
	return os.WriteFile(file, []byte(data+"\n"), 0o644)
}

// groupDirs lists, relative to base, the directories named name that exist
// anywhere in the fake tree.
func (k *fakeKernel) groupDirs(t *testing.T, name string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(k.base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == name {
			found = append(found, k.rel(p))
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return found
}
