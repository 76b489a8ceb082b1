package cgroup

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

var ceiling = Resources{MemoryBytes: 20 << 30, Pids: 24576}

// newFakeCeiling is newFake with Config.Ceiling c.
func newFakeCeiling(t *testing.T, o fakeOptions, c Resources) (*Manager, *fakeKernel) {
	t.Helper()
	m, k := newFake(t, o)
	m.ceiling = c
	return m, k
}

// TestApplyCeilingWrites checks what ApplyCeiling makes and writes on each
// kind of host, and that the limits land in the files the kernel enforces.
func TestApplyCeilingWrites(t *testing.T) {
	tests := []struct {
		name  string
		o     fakeOptions
		c     Resources
		want  []string
		files map[string]string // file under the fake root -> content
	}{{
		name: "v1",
		o:    fakeOptions{mode: V1},
		c:    ceiling,
		want: cat(v1ParentLog, []string{
			"write pids/dsec/pids.max 24576",
			"write memory/dsec/memory.limit_in_bytes 21474836480",
		}),
		files: map[string]string{"memory/dsec/memory.limit_in_bytes": "21474836480", "pids/dsec/pids.max": "24576"},
	}, {
		name: "hybrid limits go to v1",
		o:    fakeOptions{mode: Hybrid},
		c:    ceiling,
		want: cat([]string{"mkdir unified/dsec"}, v1ParentLog, []string{
			"write pids/dsec/pids.max 24576",
			"write memory/dsec/memory.limit_in_bytes 21474836480",
		}),
		files: map[string]string{"memory/dsec/memory.limit_in_bytes": "21474836480", "pids/dsec/pids.max": "24576"},
	}, {
		name: "unified",
		o:    fakeOptions{mode: Unified},
		c:    ceiling,
		want: []string{
			"mkdir unified/dsec",
			"write unified/dsec/cgroup.subtree_control +cpu +memory +pids",
			"write unified/dsec/pids.max 24576",
			"write unified/dsec/memory.max 21474836480",
		},
		files: map[string]string{"unified/dsec/memory.max": "21474836480", "unified/dsec/pids.max": "24576"},
	}, {
		name: "unified pids only",
		o:    fakeOptions{mode: Unified},
		c:    Resources{Pids: 100},
		want: []string{
			"mkdir unified/dsec",
			"write unified/dsec/cgroup.subtree_control +cpu +memory +pids",
			"write unified/dsec/pids.max 100",
		},
		files: map[string]string{"unified/dsec/memory.max": "max", "unified/dsec/pids.max": "100"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, k := newFakeCeiling(t, tt.o, tt.c)
			if err := m.ApplyCeiling(); err != nil {
				t.Fatalf("ApplyCeiling() = %v, want nil", err)
			}
			if diff := cmp.Diff(tt.want, k.log); diff != "" {
				t.Errorf("ApplyCeiling() log mismatch (-want +got):\n%s", diff)
			}
			for f, want := range tt.files {
				if got := readTrim(t, filepath.Join(k.base, f)); got != want {
					t.Errorf("%s = %q, want %q", f, got, want)
				}
			}
			st, err := m.Ceiling()
			if err != nil {
				t.Fatalf("Ceiling() = %v", err)
			}
			if st.PidsLimit != tt.c.Pids || st.MemoryLimit != tt.c.MemoryBytes {
				t.Errorf("Ceiling() limits = pids %d, memory %d; want %d, %d", st.PidsLimit, st.MemoryLimit, tt.c.Pids, tt.c.MemoryBytes)
			}
		})
	}
}

// TestCeilingSurvivesParentRemoval checks that a parent made again by
// Create (after dsec purge or a hand removed it) gets the ceiling again
// before its first group, and that a parent already there is not written.
func TestCeilingSurvivesParentRemoval(t *testing.T) {
	for _, mode := range []Mode{V1, Hybrid, Unified} {
		t.Run(mode.String(), func(t *testing.T) {
			m, k := newFakeCeiling(t, fakeOptions{mode: mode}, ceiling)
			if err := m.ApplyCeiling(); err != nil {
				t.Fatalf("ApplyCeiling() = %v", err)
			}
			k.log = nil
			if err := m.Create("a", limits); err != nil {
				t.Fatalf("Create(a) = %v", err)
			}
			for _, l := range k.log {
				if !strings.Contains(l, "/dsec/a") {
					t.Errorf("Create(a) under an existing parent did %q, want only changes in group a", l)
				}
			}
			if err := m.Delete(t.Context(), "a"); err != nil {
				t.Fatalf("Delete(a) = %v", err)
			}
			for _, r := range m.roots() {
				if err := k.Rmdir(filepath.Join(r, "dsec")); err != nil {
					t.Fatalf("remove parent: %v", err)
				}
			}
			k.log = nil
			if err := m.Create("b", limits); err != nil {
				t.Fatalf("Create(b) = %v", err)
			}
			first := -1
			for i, l := range k.log {
				if strings.HasPrefix(l, "mkdir ") && strings.HasSuffix(l, "/dsec/b") {
					first = i
					break
				}
			}
			pidsFile := "pids/dsec/pids.max"
			if mode == Unified {
				pidsFile = "unified/dsec/pids.max"
			}
			wrote := -1
			for i, l := range k.log {
				if l == "write "+pidsFile+" 24576" {
					wrote = i
				}
			}
			if wrote < 0 || first >= 0 && wrote > first {
				t.Errorf("Create(b) after the parent was removed did %q, want the ceiling written to %s before group b is made", k.log, pidsFile)
			}
		})
	}
}

func TestCeilingMissingController(t *testing.T) {
	tests := []struct {
		name string
		o    fakeOptions
		c    Resources
		ctrl string
	}{
		{"v2 pids", fakeOptions{mode: Unified, subtree: "cpu memory"}, ceiling, "pids"},
		{"v2 memory", fakeOptions{mode: Unified, subtree: "cpu pids"}, ceiling, "memory"},
		{"v1 pids", fakeOptions{mode: V1, v1: []string{"memory", "cpu"}}, ceiling, "pids"},
		{"hybrid memory", fakeOptions{mode: Hybrid, v1: []string{"pids", "cpu"}}, ceiling, "memory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _ := newFakeCeiling(t, tt.o, tt.c)
			err := m.ApplyCeiling()
			if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "controller "+tt.ctrl) {
				t.Fatalf("ApplyCeiling() = %v, want ErrFailedPrecondition naming controller %s", err, tt.ctrl)
			}
		})
	}
}

// TestCeilingMemoryBusy checks that a memory ceiling below what the groups
// use (v1 refuses it with EBUSY) is ResourceExhausted, after pids.max is
// set.
func TestCeilingMemoryBusy(t *testing.T) {
	for _, mode := range []Mode{V1, Unified} {
		m, k := newFakeCeiling(t, fakeOptions{mode: mode}, ceiling)
		k.busyWrite = "memory.limit_in_bytes"
		pids := "pids/dsec/pids.max"
		if mode == Unified {
			k.busyWrite, pids = "memory.max", "unified/dsec/pids.max"
		}
		err := m.ApplyCeiling()
		if !errdefs.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "more memory than the ceiling") {
			t.Errorf("%v: ApplyCeiling() with the memory limit busy = %v, want ResourceExhausted", mode, err)
		}
		if got := readTrim(t, filepath.Join(k.base, pids)); got != "24576" {
			t.Errorf("%v: %s = %q after a busy memory limit, want 24576", mode, pids, got)
		}
	}
}

func TestNewCeilingInvalid(t *testing.T) {
	_, k := newFake(t, fakeOptions{mode: V1})
	l, err := LayoutAt(k.base)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []Resources{{CPUs: 2}, {Pids: -1}, {MemoryBytes: -5}} {
		if _, err := New(Config{Layout: l, Ceiling: c}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("New(Ceiling: %+v) = %v, want InvalidArgument", c, err)
		}
	}
}

func TestCeilingNoParent(t *testing.T) {
	m, _ := newFake(t, fakeOptions{mode: Hybrid})
	if _, err := m.Ceiling(); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Ceiling() before the parent exists = %v, want NotFound", err)
	}
}

// TestRealCeiling sets a small pids ceiling on a real parent and checks
// the kernel holds a group with a far higher limit of its own under it:
// the parent's ceiling binds all its groups together.
func TestRealCeiling(t *testing.T) {
	m := newReal(t)
	const ceil = 40
	m.ceiling = Resources{Pids: ceil, MemoryBytes: 1 << 30}
	if err := m.ApplyCeiling(); err != nil {
		t.Fatalf("ApplyCeiling() = %v", err)
	}
	pidsDir, memDir := m.v1Dir("pids", ""), m.v1Dir("memory", "")
	memFile := "memory.limit_in_bytes"
	if m.layout.Mode == Unified {
		pidsDir, memDir, memFile = m.v2Dir(""), m.v2Dir(""), "memory.max"
	}
	if got := readTrim(t, filepath.Join(pidsDir, "pids.max")); got != "40" {
		t.Errorf("%s/pids.max = %q, want 40", pidsDir, got)
	}
	if got := readTrim(t, filepath.Join(memDir, memFile)); got != "1073741824" {
		t.Errorf("%s/%s = %q, want 1073741824", memDir, memFile, got)
	}
	// Two groups whose own limits add up to far more than the ceiling.
	var forkers []*child
	for _, name := range []string{"a", "b"} {
		if err := m.Create(name, Resources{Pids: 1000}); err != nil {
			t.Fatalf("Create(%s) = %v", name, err)
		}
		c := start(t, "fork")
		if err := m.Add(name, c.cmd.Process.Pid); err != nil {
			t.Fatalf("Add(%s) = %v", name, err)
		}
		forkers = append(forkers, c)
	}
	deadline := time.Now().Add(20 * time.Second)
	var st Stats
	for {
		var err error
		if st, err = m.Ceiling(); err != nil {
			t.Fatalf("Ceiling() = %v", err)
		}
		if st.Pids >= ceil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Let the forkers go on trying for a while at the ceiling.
	time.Sleep(300 * time.Millisecond)
	if st, err := m.Ceiling(); err != nil || st.Pids > ceil || st.PidsLimit != ceil {
		t.Errorf("Ceiling() = %+v, %v; want at most %d tasks under a limit of %d", st, err, ceil, ceil)
	}
	if st.Pids < ceil {
		t.Errorf("the forkers reached %d tasks in 20s, want the ceiling of %d", st.Pids, ceil)
	}
	for _, name := range []string{"a", "b"} {
		if s, err := m.Stats(name); err != nil || s.PidsLimit != 1000 {
			t.Errorf("Stats(%s) = %+v, %v; want its own limit of 1000 untouched", name, s, err)
		}
	}
	for _, c := range forkers {
		_ = c.cmd.Process.Kill()
	}
	for _, name := range []string{"a", "b"} {
		if err := m.Delete(t.Context(), name); err != nil {
			t.Errorf("Delete(%s) = %v", name, err)
		}
	}
}
