package cgroup

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

var limits = Resources{MemoryBytes: 64 << 20, CPUs: 1.5, Pids: 100}

var v1ParentLog = []string{
	"mkdir cpu,cpuacct/dsec",
	"mkdir cpuset/dsec",
	"mkdir freezer/dsec",
	"mkdir memory/dsec",
	"mkdir pids/dsec",
	"write cpuset/dsec/cpuset.cpus 0-3",
	"write cpuset/dsec/cpuset.mems 0",
}

var v1GroupLog = []string{
	"mkdir cpu,cpuacct/dsec/sb",
	"mkdir cpuset/dsec/sb",
	"mkdir freezer/dsec/sb",
	"mkdir memory/dsec/sb",
	"mkdir pids/dsec/sb",
	"write cpuset/dsec/sb/cpuset.cpus 0-3",
	"write cpuset/dsec/sb/cpuset.mems 0",
}

func cat(s ...[]string) []string {
	var out []string
	for _, x := range s {
		out = append(out, x...)
	}
	return out
}

// TestCreateWrites checks exactly what Create makes and writes, in order,
// on each kind of host.
func TestCreateWrites(t *testing.T) {
	tests := []struct {
		name string
		o    fakeOptions
		r    Resources
		want []string
	}{{
		name: "v1 limits",
		o:    fakeOptions{mode: V1},
		r:    limits,
		want: cat(v1ParentLog, v1GroupLog, []string{
			"write memory/dsec/sb/memory.limit_in_bytes 67108864",
			"write memory/dsec/sb/memory.memsw.limit_in_bytes 67108864",
			"write memory/dsec/sb/memory.swappiness 0",
			"write cpu,cpuacct/dsec/sb/cpu.cfs_period_us 100000",
			"write cpu,cpuacct/dsec/sb/cpu.cfs_quota_us 150000",
			"write pids/dsec/sb/pids.max 100",
		}),
	}, {
		name: "v1 without swap accounting",
		o:    fakeOptions{mode: V1, noMemsw: true},
		r:    Resources{MemoryBytes: 1 << 30},
		want: cat(v1ParentLog, v1GroupLog, []string{
			"write memory/dsec/sb/memory.limit_in_bytes 1073741824",
			"write memory/dsec/sb/memory.swappiness 0",
		}),
	}, {
		name: "v1 no limits: still no swap of its own",
		o:    fakeOptions{mode: V1},
		want: cat(v1ParentLog, v1GroupLog, []string{"write memory/dsec/sb/memory.swappiness 0"}),
	}, {
		name: "v1 tiny cpu share is the kernel's minimum quota",
		o:    fakeOptions{mode: V1, v1: []string{"cpu"}},
		r:    Resources{CPUs: 0.001},
		want: []string{
			"mkdir cpu/dsec",
			"mkdir cpu/dsec/sb",
			"write cpu/dsec/sb/cpu.cfs_period_us 100000",
			"write cpu/dsec/sb/cpu.cfs_quota_us 1000",
		},
	}, {
		name: "hybrid limits go to v1",
		o:    fakeOptions{mode: Hybrid},
		r:    limits,
		want: cat([]string{"mkdir unified/dsec"}, v1ParentLog, []string{"mkdir unified/dsec/sb"}, v1GroupLog, []string{
			"write memory/dsec/sb/memory.limit_in_bytes 67108864",
			"write memory/dsec/sb/memory.memsw.limit_in_bytes 67108864",
			"write memory/dsec/sb/memory.swappiness 0",
			"write cpu,cpuacct/dsec/sb/cpu.cfs_period_us 100000",
			"write cpu,cpuacct/dsec/sb/cpu.cfs_quota_us 150000",
			"write pids/dsec/sb/pids.max 100",
		}),
	}, {
		name: "unified limits",
		o:    fakeOptions{mode: Unified},
		r:    limits,
		want: []string{
			"mkdir unified/dsec",
			"write unified/dsec/cgroup.subtree_control +cpu +memory +pids",
			"mkdir unified/dsec/sb",
			"write unified/dsec/sb/memory.max 67108864",
			"write unified/dsec/sb/memory.swap.max 0",
			"write unified/dsec/sb/cpu.max 150000 100000",
			"write unified/dsec/sb/pids.max 100",
		},
	}, {
		name: "unified without swap accounting, memory only",
		o:    fakeOptions{mode: Unified, noSwap: true},
		r:    Resources{MemoryBytes: 4096},
		want: []string{
			"mkdir unified/dsec",
			"write unified/dsec/cgroup.subtree_control +cpu +memory +pids",
			"mkdir unified/dsec/sb",
			"write unified/dsec/sb/memory.max 4096",
		},
	}, {
		name: "unified enables what the root offers",
		o:    fakeOptions{mode: Unified, subtree: "memory"},
		r:    Resources{MemoryBytes: 4096},
		want: []string{
			"mkdir unified/dsec",
			"write unified/dsec/cgroup.subtree_control +memory",
			"mkdir unified/dsec/sb",
			"write unified/dsec/sb/memory.max 4096",
			"write unified/dsec/sb/memory.swap.max 0",
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, k := newFake(t, tt.o)
			if err := m.Create("sb", tt.r); err != nil {
				t.Fatalf("Create(%q, %+v) = %v, want nil", "sb", tt.r, err)
			}
			if diff := cmp.Diff(tt.want, k.log); diff != "" {
				t.Errorf("Create(%q, %+v) log mismatch (-want +got):\n%s", "sb", tt.r, diff)
			}
		})
	}
}

// TestCreateParentOnce checks a second group reuses the prepared parent.
func TestCreateParentOnce(t *testing.T) {
	for _, mode := range []Mode{V1, Hybrid, Unified} {
		t.Run(mode.String(), func(t *testing.T) {
			m, k := newFake(t, fakeOptions{mode: mode})
			if err := m.Create("a", limits); err != nil {
				t.Fatalf("Create(a) = %v", err)
			}
			k.log = nil
			if err := m.Create("b", limits); err != nil {
				t.Fatalf("Create(b) = %v", err)
			}
			for _, l := range k.log {
				if !strings.Contains(l, "/dsec/b") {
					t.Errorf("Create(b) did %q, want only changes in group b", l)
				}
			}
			if mode == Unified {
				got, _ := os.ReadFile(filepath.Join(k.base, "unified/dsec/cgroup.subtree_control"))
				if strings.TrimSpace(string(got)) != "cpu memory pids" {
					t.Errorf("parent subtree_control = %q, want %q", got, "cpu memory pids")
				}
			}
		})
	}
}

func TestCreateMissingController(t *testing.T) {
	tests := []struct {
		name string
		o    fakeOptions
		r    Resources
		ctrl string
	}{
		{"v2 memory", fakeOptions{mode: Unified, subtree: "cpu pids"}, Resources{MemoryBytes: 1 << 20}, "memory"},
		{"v2 pids", fakeOptions{mode: Unified, subtree: "cpu memory"}, Resources{Pids: 5}, "pids"},
		{"v1 pids", fakeOptions{mode: V1, v1: []string{"memory", "cpu"}}, Resources{Pids: 5}, "pids"},
		{"hybrid cpu", fakeOptions{mode: Hybrid, v1: []string{"memory", "pids"}}, Resources{CPUs: 1}, "cpu"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, k := newFake(t, tt.o)
			err := m.Create("sb", tt.r)
			if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "controller "+tt.ctrl) {
				t.Fatalf("Create(sb, %+v) = %v, want ErrFailedPrecondition naming controller %s", tt.r, err, tt.ctrl)
			}
			if d := k.groupDirs(t, "sb"); len(d) > 0 {
				t.Errorf("after failed Create, group directories %q remain", d)
			}
			if err := m.Create("sb", Resources{}); err != nil {
				t.Errorf("Create(sb) without limits = %v, want nil", err)
			}
		})
	}
}

func TestCreateFailureRemovesGroup(t *testing.T) {
	for _, tt := range []struct {
		mode Mode
		fail string
	}{{V1, "pids.max"}, {V1, "cpuset.mems"}, {Hybrid, "memory.memsw.limit_in_bytes"}, {Unified, "cpu.max"}} {
		t.Run(tt.mode.String()+" "+tt.fail, func(t *testing.T) {
			m, k := newFake(t, fakeOptions{mode: tt.mode})
			if err := m.Create("keep", Resources{}); err != nil {
				t.Fatalf("Create(keep) = %v", err)
			}
			k.failWrite = tt.fail
			if err := m.Create("sb", limits); err == nil {
				t.Fatalf("Create(sb) with failing %s = nil, want an error", tt.fail)
			}
			if d := k.groupDirs(t, "sb"); len(d) > 0 {
				t.Errorf("after failed Create, group directories %q remain", d)
			}
			if got, err := m.List(); err != nil || !cmp.Equal(got, []string{"keep"}) {
				t.Errorf("List() = %q, %v, want [keep]", got, err)
			}
		})
	}
}

func TestCreateExisting(t *testing.T) {
	m, k := newFake(t, fakeOptions{mode: Hybrid})
	if err := m.Create("a", limits); err != nil {
		t.Fatalf("Create(a) = %v", err)
	}
	if err := m.Create("a", limits); !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Create(a) = %v, want ErrAlreadyExists", err)
	}
	if got := len(k.groupDirs(t, "a")); got != 6 {
		t.Errorf("after second Create(a), group a is in %d hierarchies, want 6", got)
	}

	// A group left in one hierarchy by a crash blocks Create, which
	// removes only what it made itself; List finds it and Delete removes it.
	orphan := filepath.Join(k.base, "memory", "dsec", "b")
	if err := k.Mkdir(orphan); err != nil {
		t.Fatal(err)
	}
	if err := m.Create("b", limits); !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Create(b) over an orphan = %v, want ErrAlreadyExists", err)
	}
	if got, want := k.groupDirs(t, "b"), []string{"memory/dsec/b"}; !cmp.Equal(got, want) {
		t.Errorf("after Create(b) over an orphan, b is at %q, want %q", got, want)
	}
	if got, err := m.List(); err != nil || !cmp.Equal(got, []string{"a", "b"}) {
		t.Errorf("List() = %q, %v, want [a b]", got, err)
	}
	if err := m.Delete(t.Context(), "b"); err != nil {
		t.Errorf("Delete(b) = %v", err)
	}
	if err := m.Create("b", limits); err != nil {
		t.Errorf("Create(b) after Delete(b) = %v", err)
	}
}

func TestDelete(t *testing.T) {
	for _, mode := range []Mode{V1, Hybrid, Unified} {
		t.Run(mode.String(), func(t *testing.T) {
			m, k := newFake(t, fakeOptions{mode: mode})
			ctx := t.Context()
			for _, n := range []string{"a", "b"} {
				if err := m.Create(n, limits); err != nil {
					t.Fatalf("Create(%q) = %v", n, err)
				}
			}
			// A group the sandbox nested in its own.
			inner := filepath.Join(m.dirs("a")[0], "inner")
			if err := k.Mkdir(inner); err != nil {
				t.Fatal(err)
			}
			if err := m.Delete(ctx, "a"); err != nil {
				t.Fatalf("Delete(a) = %v", err)
			}
			if d := append(k.groupDirs(t, "a"), k.groupDirs(t, "inner")...); len(d) > 0 {
				t.Errorf("after Delete(a), %q remain", d)
			}
			if got, err := m.List(); err != nil || !cmp.Equal(got, []string{"b"}) {
				t.Errorf("List() = %q, %v, want [b]", got, err)
			}
			for range 2 {
				if err := m.Delete(ctx, "a"); err != nil {
					t.Errorf("Delete(a) again = %v, want nil", err)
				}
			}
		})
	}
}

func TestProcsFilesAndAdd(t *testing.T) {
	m, k := newFake(t, fakeOptions{mode: Hybrid})
	got, err := m.ProcsFiles("sb")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, h := range []string{"unified", "cpu,cpuacct", "cpuset", "freezer", "memory", "pids"} {
		want = append(want, filepath.Join(k.base, h, "dsec", "sb", "cgroup.procs"))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ProcsFiles(sb) mismatch (-want +got):\n%s", diff)
	}

	if err := m.Add("sb", 42); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Add(sb, 42) before Create = %v, want ErrNotFound", err)
	}
	if err := m.Create("sb", Resources{}); err != nil {
		t.Fatal(err)
	}
	k.log = nil
	if err := m.Add("sb", 42); err != nil {
		t.Fatalf("Add(sb, 42) = %v", err)
	}
	var wantLog []string
	for _, f := range want {
		wantLog = append(wantLog, "write "+k.rel(f)+" 42")
	}
	if diff := cmp.Diff(wantLog, k.log); diff != "" {
		t.Errorf("Add(sb, 42) log mismatch (-want +got):\n%s", diff)
	}
	if err := m.Add("sb", 0); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Add(sb, 0) = %v, want ErrInvalidArgument", err)
	}
}

func TestStats(t *testing.T) {
	tests := []struct {
		mode  Mode
		files map[string]string
		want  Stats
	}{{
		mode: Hybrid,
		files: map[string]string{
			"memory/dsec/sb/memory.usage_in_bytes": "1234\n",
			"memory/dsec/sb/memory.oom_control":    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
			"cpu,cpuacct/dsec/sb/cpuacct.usage":    "1500000000\n",
			"pids/dsec/sb/pids.current":            "3\n",
		},
		want: Stats{MemoryBytes: 1234, MemoryLimit: 64 << 20, CPUUsage: 1500 * time.Millisecond,
			Pids: 3, PidsLimit: 100, OOMKills: 2},
	}, {
		mode: Unified,
		files: map[string]string{
			"unified/dsec/sb/memory.current": "4321\n",
			"unified/dsec/sb/memory.events":  "low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\noom_group_kill 0\n",
			"unified/dsec/sb/cpu.stat":       "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n",
			"unified/dsec/sb/pids.current":   "7\n",
		},
		want: Stats{MemoryBytes: 4321, MemoryLimit: 64 << 20, CPUUsage: 2500 * time.Microsecond,
			Pids: 7, PidsLimit: 100, OOMKills: 1},
	}}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			m, k := newFake(t, fakeOptions{mode: tt.mode})
			if _, err := m.Stats("sb"); !errdefs.Is(err, errdefs.ErrNotFound) {
				t.Errorf("Stats(sb) before Create = %v, want ErrNotFound", err)
			}
			if err := m.Create("sb", limits); err != nil {
				t.Fatal(err)
			}
			if got, err := m.Stats("sb"); err != nil || got.MemoryLimit != limits.MemoryBytes || got.Pids != 0 {
				t.Errorf("Stats(sb) of a new group = %+v, %v, want limit %d and no pids", got, err, limits.MemoryBytes)
			}
			for f, data := range tt.files {
				if err := os.WriteFile(filepath.Join(k.base, f), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := m.Stats("sb")
			if err != nil {
				t.Fatalf("Stats(sb) = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Stats(sb) mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFreezeFake(t *testing.T) {
	for _, tt := range []struct {
		mode           Mode
		file           string
		frozen, thawed string
	}{
		{V1, "freezer/dsec/sb/freezer.state", "FROZEN", "THAWED"},
		{Hybrid, "unified/dsec/sb/cgroup.freeze", "1", "0"},
		{Unified, "unified/dsec/sb/cgroup.freeze", "1", "0"},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			m, k := newFake(t, fakeOptions{mode: tt.mode})
			ctx := t.Context()
			if err := m.Freeze(ctx, "sb"); !errdefs.Is(err, errdefs.ErrNotFound) {
				t.Errorf("Freeze(sb) before Create = %v, want ErrNotFound", err)
			}
			if err := m.Create("sb", Resources{}); err != nil {
				t.Fatal(err)
			}
			for _, step := range []struct {
				f    func(context.Context, string) error
				want string
			}{{m.Freeze, tt.frozen}, {m.Thaw, tt.thawed}} {
				if err := step.f(ctx, "sb"); err != nil {
					t.Fatalf("freeze/thaw(sb) = %v", err)
				}
				got, _ := os.ReadFile(filepath.Join(k.base, tt.file))
				if strings.TrimSpace(string(got)) != step.want {
					t.Errorf("%s = %q, want %q", tt.file, got, step.want)
				}
			}
		})
	}
}

// TestFreezeTimeout checks a freeze that does not settle is undone.
func TestFreezeTimeout(t *testing.T) {
	m, k := newFake(t, fakeOptions{mode: V1})
	if err := m.Create("sb", Resources{}); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(k.base, "freezer/dsec/sb/freezer.state")
	m.fs = stuckFreezer{k} // writes succeed, but the state stays FREEZING
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := m.Freeze(ctx, "sb"); !errdefs.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("Freeze(sb) that never settles = %v, want ErrDeadlineExceeded", err)
	}
	if got, _ := os.ReadFile(state); strings.TrimSpace(string(got)) != "THAWED" {
		t.Errorf("after a failed Freeze, freezer.state = %q, want THAWED", got)
	}
}

// stuckFreezer reports FREEZING forever after FROZEN is written.
type stuckFreezer struct{ *fakeKernel }

func (s stuckFreezer) WriteFile(file, data string) error {
	if data == "FROZEN" {
		data = "FREEZING"
	}
	return s.fakeKernel.WriteFile(file, data)
}

func TestInvalidNames(t *testing.T) {
	m, _ := newFake(t, fakeOptions{mode: Hybrid})
	ctx := t.Context()
	ops := map[string]func(string) error{
		"Create":     func(n string) error { return m.Create(n, Resources{}) },
		"Add":        func(n string) error { return m.Add(n, 1) },
		"ProcsFiles": func(n string) error { _, err := m.ProcsFiles(n); return err },
		"Stats":      func(n string) error { _, err := m.Stats(n); return err },
		"Kill":       func(n string) error { return m.Kill(ctx, n) },
		"Freeze":     func(n string) error { return m.Freeze(ctx, n) },
		"Thaw":       func(n string) error { return m.Thaw(ctx, n) },
		"Delete":     func(n string) error { return m.Delete(ctx, n) },
	}
	for _, name := range []string{"", ".", "..", "../../etc", "a/b", "Sb"} {
		for op, f := range ops {
			if err := f(name); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s(%q) = %v, want ErrInvalidArgument", op, name, err)
			}
		}
	}
}

func TestNew(t *testing.T) {
	l := Layout{Mode: Unified, Unified: t.TempDir()}
	for _, tt := range []struct {
		cfg  Config
		want error
	}{
		{Config{Layout: l}, nil},
		{Config{Parent: "x-1", Layout: l}, nil},
		{Config{Parent: "../x", Layout: l}, errdefs.ErrInvalidArgument},
		{Config{Parent: "a/b", Layout: l}, errdefs.ErrInvalidArgument},
		{Config{Layout: Layout{Mode: Hybrid, V1: map[string]string{"memory": "/m"}}}, errdefs.ErrInvalidArgument},
		{Config{Layout: Layout{Mode: V1, V1: map[string]string{"devices": "/d"}}}, errdefs.ErrFailedPrecondition},
		{Config{Layout: Layout{Mode: 9, Unified: "/u"}}, errdefs.ErrInvalidArgument},
	} {
		if _, err := New(tt.cfg); errdefs.Kind(err) != tt.want {
			t.Errorf("New(%+v) = %v, want %v", tt.cfg, err, tt.want)
		}
	}
}

// TestKillFake checks Kill uses cgroup.kill where it exists, and that an
// empty or missing group needs no freezing.
func TestKillFake(t *testing.T) {
	for _, tt := range []struct {
		mode Mode
		want []string
	}{
		{V1, nil},
		{Hybrid, []string{"write unified/dsec/sb/cgroup.kill 1"}},
		{Unified, []string{"write unified/dsec/sb/cgroup.kill 1"}},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			m, k := newFake(t, fakeOptions{mode: tt.mode})
			if err := m.Kill(t.Context(), "sb"); err != nil {
				t.Errorf("Kill(sb) of a missing group = %v, want nil", err)
			}
			if err := m.Create("sb", Resources{}); err != nil {
				t.Fatal(err)
			}
			k.log = nil
			if err := m.Kill(t.Context(), "sb"); err != nil {
				t.Fatalf("Kill(sb) = %v", err)
			}
			if diff := cmp.Diff(tt.want, k.log); diff != "" {
				t.Errorf("Kill(sb) log mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKillDeadline checks Kill gives up when ctx ends, thawing the group.
func TestKillDeadline(t *testing.T) {
	m, k := newFake(t, fakeOptions{mode: V1})
	if err := m.Create("sb", Resources{}); err != nil {
		t.Fatal(err)
	}
	// A process that never leaves: no pid is this large (pid_max <= 2^22),
	// so the signal finds nothing and the fake file keeps listing it.
	if err := os.WriteFile(filepath.Join(k.base, "freezer/dsec/sb/cgroup.procs"), []byte("2147483647\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := m.Kill(ctx, "sb"); !errdefs.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("Kill(sb) of a group that never empties = %v, want ErrDeadlineExceeded", err)
	}
	if got, _ := os.ReadFile(filepath.Join(k.base, "freezer/dsec/sb/freezer.state")); strings.TrimSpace(string(got)) != "THAWED" {
		t.Errorf("after a failed Kill, freezer.state = %q, want THAWED", got)
	}
	if err := m.Delete(ctx, "sb"); !errdefs.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("Delete(sb) after the deadline = %v, want ErrDeadlineExceeded", err)
	}
	if got, err := m.List(); err != nil || !cmp.Equal(got, []string{"sb"}) {
		t.Errorf("List() after a failed Delete = %q, %v, want [sb]", got, err)
	}
}
