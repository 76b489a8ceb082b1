package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/testenv"
)

// childEnv makes the test binary act as a child process of a real test:
// "spin" burns CPU; "sleep" sleeps; "fork" starts "sleep" children every
// few milliseconds, forever; "alloc" waits for a byte on stdin, then
// allocates and touches 200 MiB and exits 0.
const childEnv = "DSEC_CGROUP_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "spin":
		//lint:ignore SA5002 the child must burn CPU until it is frozen or killed
		for {
		}
	case "sleep":
		time.Sleep(time.Hour)
	case "fork":
		for {
			c := exec.Command(os.Args[0])
			c.Env = append(os.Environ(), childEnv+"=sleep")
			_ = c.Start() // fails at the pids limit
			time.Sleep(2 * time.Millisecond)
		}
	case "hold":
		// Touches $DSEC_CGROUP_TEST_MIB MiB once a byte comes on stdin,
		// writes "ready" and sleeps.
		mib, _ := strconv.Atoi(os.Getenv("DSEC_CGROUP_TEST_MIB"))
		if _, err := io.ReadFull(os.Stdin, make([]byte, 1)); err != nil {
			os.Exit(2)
		}
		b := make([]byte, mib<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = byte(i >> 12)
		}
		os.Stdout.WriteString("ready\n")
		time.Sleep(time.Hour)
		os.Exit(int(b[4096]))
	case "alloc":
		if _, err := io.ReadFull(os.Stdin, make([]byte, 1)); err != nil {
			os.Exit(2)
		}
		b := make([]byte, 200<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		os.Exit(0)
	}
	os.Exit(3)
}

// newReal returns a Manager on this host's cgroups under a parent of its
// own, which it removes, with every group in it, when t ends.
func newReal(t *testing.T) *Manager {
	t.Helper()
	testenv.RequireRoot(t)
	l, err := DetectLayout()
	if err != nil {
		t.Fatalf("DetectLayout() = %v", err)
	}
	m, err := New(Config{Parent: fmt.Sprintf("dsec-test-%x", rand.Uint64()), Layout: l})
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	// Runs after the children's cleanups (t.Cleanup is last in, first
	// out), so the groups hold no process by then.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		names, err := m.List()
		if err != nil {
			t.Errorf("cleanup: List() = %v", err)
		}
		for _, n := range names {
			if err := m.Delete(ctx, n); err != nil {
				t.Errorf("cleanup: Delete(%q) = %v", n, err)
			}
		}
		// Whatever Delete left, and the parent, go without the Manager.
		for _, r := range m.roots() {
			groups, err := subgroups(filepath.Join(r, m.parent))
			if err != nil {
				t.Errorf("cleanup: %v", err)
			}
			for _, g := range groups {
				err := poll(ctx, func() (bool, error) {
					err := os.Remove(g)
					return !errors.Is(err, syscall.EBUSY), err
				})
				if err != nil && !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
	})
	return m
}

// child is a process a test started and reaps.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	done   chan struct{}
	err    error // of Wait, once done is closed
}

// start runs argv (the test binary itself when argv is empty, as the child
// named by mode) and kills and reaps it when t ends. Reaping starts only
// when wait or the cleanup asks for it.
func start(t *testing.T, mode string, argv ...string) *child {
	t.Helper()
	if len(argv) == 0 {
		argv = []string{os.Args[0]}
	}
	c := &child{cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), childEnv+"="+mode)
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if c.stdout, err = c.cmd.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %q: %v", argv, err)
	}
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		c.wait(t)
	})
	return c
}

// wait reaps the child, once, and returns how it ended.
func (c *child) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-c.done:
		return c.err
	default:
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	select {
	case <-c.done:
		return c.err
	case <-time.After(30 * time.Second):
		t.Fatalf("child %d did not end", c.cmd.Process.Pid)
		return nil
	}
}

// killedBy reports whether err says a child was killed by sig.
func killedBy(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// recordFS is the kernel's file system, logging the base name of each file
// written and the data.
type recordFS struct {
	kernelFS
	log []string
}

func (r *recordFS) WriteFile(file, data string) error {
	r.log = append(r.log, filepath.Base(file)+" "+data)
	return r.kernelFS.WriteFile(file, data)
}

func readTrim(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestRealDetectLayout(t *testing.T) {
	testenv.RequireRoot(t)
	l, err := DetectLayout()
	if err != nil {
		t.Fatalf("DetectLayout() = %v", err)
	}
	t.Logf("layout: %+v", l)
	for c, mp := range l.V1 {
		if _, err := os.Stat(filepath.Join(mp, "cgroup.procs")); err != nil {
			t.Errorf("DetectLayout().V1[%q] = %q, not a cgroup hierarchy: %v", c, mp, err)
		}
	}
	if l.Unified != "" {
		if _, err := os.Stat(filepath.Join(l.Unified, "cgroup.controllers")); err != nil {
			t.Errorf("DetectLayout().Unified = %q, not a cgroup2 hierarchy: %v", l.Unified, err)
		}
	}
}

// TestRealCreate checks the limits land in the kernel's files.
func TestRealCreate(t *testing.T) {
	m := newReal(t)
	r := Resources{MemoryBytes: 64 << 20, CPUs: 0.5, Pids: 50}
	if err := m.Create("sb", r); err != nil {
		t.Fatalf("Create(sb, %+v) = %v", r, err)
	}
	want := map[string]string{}
	if m.layout.Mode == Unified {
		d := m.v2Dir("sb")
		want[filepath.Join(d, "memory.max")] = "67108864"
		want[filepath.Join(d, "cpu.max")] = "50000 100000"
		want[filepath.Join(d, "pids.max")] = "50"
		if exists(filepath.Join(d, "memory.swap.max")) {
			want[filepath.Join(d, "memory.swap.max")] = "0"
		}
	} else {
		want[filepath.Join(m.v1Dir("memory", "sb"), "memory.limit_in_bytes")] = "67108864"
		if f := filepath.Join(m.v1Dir("memory", "sb"), "memory.memsw.limit_in_bytes"); exists(f) {
			want[f] = "67108864"
		}
		want[filepath.Join(m.v1Dir("cpu", "sb"), "cpu.cfs_period_us")] = "100000"
		want[filepath.Join(m.v1Dir("cpu", "sb"), "cpu.cfs_quota_us")] = "50000"
		want[filepath.Join(m.v1Dir("pids", "sb"), "pids.max")] = "50"
		if d := m.v1Dir("cpuset", "sb"); d != "" {
			for _, f := range cpusetFiles {
				want[filepath.Join(d, f)] = readTrim(t, filepath.Join(m.layout.V1["cpuset"], f))
			}
		}
	}
	for f, v := range want {
		if got := readTrim(t, f); got != v {
			t.Errorf("after Create, %s = %q, want %q", f, got, v)
		}
	}
	for _, d := range m.dirs("sb") {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("after Create, group directory: %v", err)
		}
	}
	if err := m.Create("sb", r); !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Create(sb) again = %v, want ErrAlreadyExists", err)
	}
}

// TestRealAddStatsKill adds a process, sees it in Stats, kills it and
// deletes the group.
func TestRealAddStatsKill(t *testing.T) {
	m := newReal(t)
	sleep, err := exec.LookPath("sleep")
	testenv.Require(t, err == nil, "needs sleep in PATH")
	if err := m.Create("sb", Resources{MemoryBytes: 64 << 20, Pids: 50}); err != nil {
		t.Fatalf("Create() = %v", err)
	}
	c := start(t, "", sleep, "100")
	pid := c.cmd.Process.Pid
	if err := m.Add("sb", pid); err != nil {
		t.Fatalf("Add(sb, %d) = %v", pid, err)
	}
	cg := readTrim(t, fmt.Sprintf("/proc/%d/cgroup", pid))
	n := 0
	for line := range strings.Lines(cg) {
		if strings.HasSuffix(strings.TrimSpace(line), ":/"+m.parent+"/sb") {
			n++
		}
	}
	if n != len(m.dirs("sb")) {
		t.Errorf("/proc/%d/cgroup lists the group %d times, want %d (every hierarchy):\n%s", pid, n, len(m.dirs("sb")), cg)
	}
	s, err := m.Stats("sb")
	if err != nil {
		t.Fatalf("Stats(sb) = %v", err)
	}
	if s.Pids != 1 || s.PidsLimit != 50 || s.MemoryLimit != 64<<20 {
		t.Errorf("Stats(sb) = %+v, want Pids 1, PidsLimit 50, MemoryLimit %d", s, 64<<20)
	}

	// Kill returns once the group is empty, without waiting for the
	// child to be reaped; where cgroup.kill exists, it alone does it.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	rec := &recordFS{}
	m.fs = rec
	if err := m.Kill(ctx, "sb"); err != nil {
		t.Fatalf("Kill(sb) = %v", err)
	}
	m.fs = kernelFS{}
	if exists(filepath.Join(m.v2Dir("sb"), "cgroup.kill")) && !slices.Equal(rec.log, []string{"cgroup.kill 1"}) {
		t.Errorf("Kill(sb) wrote %q, want only cgroup.kill", rec.log)
	}
	if pids, err := m.pids("sb"); err != nil || len(pids) > 0 {
		t.Errorf("after Kill, pids = %v, %v, want none", pids, err)
	}
	if err := c.wait(t); !killedBy(err, syscall.SIGKILL) {
		t.Errorf("child after Kill: %v, want killed by SIGKILL", err)
	}
	if s, err := m.Stats("sb"); err != nil || s.Pids != 0 {
		t.Errorf("Stats(sb) after Kill = %+v, %v, want Pids 0", s, err)
	}

	// Delete removes every directory, and again is a no-op.
	c2 := start(t, "", sleep, "100")
	if err := m.Add("sb", c2.cmd.Process.Pid); err != nil {
		t.Fatalf("Add(sb) = %v", err)
	}
	for range 2 {
		if err := m.Delete(ctx, "sb"); err != nil {
			t.Fatalf("Delete(sb) = %v", err)
		}
	}
	for _, d := range m.dirs("sb") {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after Delete, %s: %v, want it gone", d, err)
		}
	}
	if err := c2.wait(t); !killedBy(err, syscall.SIGKILL) {
		t.Errorf("child after Delete: %v, want killed by SIGKILL", err)
	}
	if names, err := m.List(); err != nil || len(names) > 0 {
		t.Errorf("List() after Delete = %q, %v, want none", names, err)
	}
}

// TestRealKillV1 kills through the v1 freezer alone, as on a host without
// cgroup2, a group where a process keeps forking.
func TestRealKillV1(t *testing.T) {
	m := newReal(t)
	if m.layout.Mode != Hybrid {
		t.Skipf("needs a hybrid host to compare; this one is %v", m.layout.Mode)
	}
	v1 := m.layout
	v1.Mode, v1.Unified, v1.UnifiedControllers = V1, "", nil
	mv1, err := New(Config{Parent: m.parent, Layout: v1})
	if err != nil {
		t.Fatal(err)
	}
	const limit = 80
	if err := mv1.Create("sb", Resources{Pids: limit}); err != nil {
		t.Fatalf("Create() = %v", err)
	}
	spin, fork := start(t, "spin"), start(t, "fork")
	for _, c := range []*child{spin, fork} {
		if err := mv1.Add("sb", c.cmd.Process.Pid); err != nil {
			t.Fatalf("Add() = %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err = poll(ctx, func() (bool, error) {
		s, err := mv1.Stats("sb")
		return s.Pids >= limit/2, err
	})
	if err != nil {
		t.Fatalf("waiting for the forking child to fill the group: %v", err)
	}
	if err := mv1.Kill(ctx, "sb"); err != nil {
		t.Fatalf("Kill(sb) through v1 = %v", err)
	}
	if pids, err := mv1.pids("sb"); err != nil || len(pids) > 0 {
		t.Errorf("after Kill, pids = %v, %v, want none", pids, err)
	}
	for _, c := range []*child{spin, fork} {
		if err := c.wait(t); !killedBy(err, syscall.SIGKILL) {
			t.Errorf("child after Kill: %v, want killed by SIGKILL", err)
		}
	}
	if got := readTrim(t, filepath.Join(mv1.v1Dir("freezer", "sb"), "freezer.state")); got != "THAWED" {
		t.Errorf("after Kill, freezer.state = %q, want THAWED", got)
	}
	if err := mv1.Delete(ctx, "sb"); err != nil {
		t.Errorf("Delete(sb) = %v", err)
	}
}

// cpuTicks is the CPU time, in clock ticks, process pid has used.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	s := readTrim(t, fmt.Sprintf("/proc/%d/stat", pid))
	// Fields after the command name, which ends at the last ')': state is
	// the first, utime and stime the 12th and 13th.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	return u + k
}

// advances reports whether process pid uses CPU during d.
func advances(t *testing.T, pid int, d time.Duration) bool {
	t.Helper()
	before := cpuTicks(t, pid)
	time.Sleep(d)
	return cpuTicks(t, pid) > before
}

func TestRealFreezeThaw(t *testing.T) {
	m := newReal(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := m.Create("sb", Resources{}); err != nil {
		t.Fatalf("Create() = %v", err)
	}
	c := start(t, "spin")
	pid := c.cmd.Process.Pid
	if err := m.Add("sb", pid); err != nil {
		t.Fatalf("Add() = %v", err)
	}
	if !advances(t, pid, 300*time.Millisecond) {
		t.Fatalf("spinning child %d uses no CPU before Freeze", pid)
	}
	if err := m.Freeze(ctx, "sb"); err != nil {
		t.Fatalf("Freeze(sb) = %v", err)
	}
	if f := m.freezer("sb"); f.v2 {
		if got := readTrim(t, filepath.Join(f.dir, "cgroup.events")); !strings.Contains(got, "frozen 1") {
			t.Errorf("after Freeze, cgroup.events = %q, want frozen 1", got)
		}
	}
	if advances(t, pid, 300*time.Millisecond) {
		t.Errorf("child %d uses CPU while frozen", pid)
	}
	if err := m.Thaw(ctx, "sb"); err != nil {
		t.Fatalf("Thaw(sb) = %v", err)
	}
	if !advances(t, pid, 300*time.Millisecond) {
		t.Errorf("child %d uses no CPU after Thaw", pid)
	}

	// A frozen group is still killed and deleted.
	if err := m.Freeze(ctx, "sb"); err != nil {
		t.Fatalf("Freeze(sb) = %v", err)
	}
	if err := m.Delete(ctx, "sb"); err != nil {
		t.Fatalf("Delete(frozen sb) = %v", err)
	}
	if err := c.wait(t); !killedBy(err, syscall.SIGKILL) {
		t.Errorf("frozen child after Delete: %v, want killed by SIGKILL", err)
	}
}

// TestRealOOM runs a child that touches 200 MiB in a 64 MiB group: the
// kernel kills it, and Stats counts the kill.
func TestRealOOM(t *testing.T) {
	m := newReal(t)
	if err := m.Create("sb", Resources{MemoryBytes: 64 << 20}); err != nil {
		t.Fatalf("Create() = %v", err)
	}
	before, err := m.Stats("sb")
	if err != nil || before.OOMKills != 0 {
		t.Fatalf("Stats(sb) of a new group = %+v, %v, want no OOM kills", before, err)
	}
	c := start(t, "alloc")
	if err := m.Add("sb", c.cmd.Process.Pid); err != nil {
		t.Fatalf("Add() = %v", err)
	}
	if _, err := c.stdin.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if err := c.wait(t); !killedBy(err, syscall.SIGKILL) {
		t.Fatalf("child touching 200 MiB in a 64 MiB group: %v, want killed by SIGKILL", err)
	}
	after, err := m.Stats("sb")
	if err != nil || after.OOMKills < 1 {
		t.Errorf("Stats(sb) after the OOM kill = %+v, %v, want OOMKills >= 1", after, err)
	}
	if after.MemoryLimit != 64<<20 {
		t.Errorf("Stats(sb).MemoryLimit = %d, want %d", after.MemoryLimit, 64<<20)
	}
	if n, err := m.OOMKills("sb"); err != nil || n != after.OOMKills {
		t.Errorf("OOMKills(sb) = %d, %v, want %d as Stats says", n, err, after.OOMKills)
	}
	if n, err := m.OOMKills("nosuch"); err != nil || n != 0 {
		t.Errorf("OOMKills(nosuch) = %d, %v, want 0, nil", n, err)
	}
}

// TestRealList checks List and Delete find groups left in part.
func TestRealList(t *testing.T) {
	m := newReal(t)
	for _, n := range []string{"b", "a"} {
		if err := m.Create(n, Resources{}); err != nil {
			t.Fatalf("Create(%q) = %v", n, err)
		}
	}
	// As after a crash during Delete: c exists in one hierarchy only.
	if err := os.Mkdir(m.dirs("c")[len(m.dirs("c"))-1], 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := m.List()
	if err != nil || !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("List() = %q, %v, want [a b c]", got, err)
	}
	for _, n := range got {
		if err := m.Delete(t.Context(), n); err != nil {
			t.Errorf("Delete(%q) = %v", n, err)
		}
	}
	if got, err := m.List(); err != nil || len(got) > 0 {
		t.Errorf("List() after Delete = %q, %v, want none", got, err)
	}
}

// TestRealUnifiedOnly runs a Manager on the cgroup2 hierarchy alone, as on
// a unified host; on a hybrid host that hierarchy has no resource
// controllers, so limits are refused.
func TestRealUnifiedOnly(t *testing.T) {
	mh := newReal(t)
	if mh.layout.Unified == "" {
		t.Skip("needs a cgroup2 hierarchy")
	}
	l := Layout{Mode: Unified, Unified: mh.layout.Unified, UnifiedControllers: mh.layout.UnifiedControllers}
	m, err := New(Config{Parent: mh.parent, Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if !slices.Contains(l.UnifiedControllers, "memory") {
		err := m.Create("sb", Resources{MemoryBytes: 64 << 20})
		if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "controller memory") {
			t.Errorf("Create(sb, memory limit) without a v2 memory controller = %v, want ErrFailedPrecondition naming memory", err)
		}
		if _, err := os.Stat(m.v2Dir("sb")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after a failed Create, %s: %v, want it gone", m.v2Dir("sb"), err)
		}
	}
	if err := m.Create("sb", Resources{}); err != nil {
		t.Fatalf("Create(sb) = %v", err)
	}
	c := start(t, "spin")
	if err := m.Add("sb", c.cmd.Process.Pid); err != nil {
		t.Fatalf("Add() = %v", err)
	}
	if err := m.Freeze(ctx, "sb"); err != nil {
		t.Fatalf("Freeze(sb) = %v", err)
	}
	if advances(t, c.cmd.Process.Pid, 300*time.Millisecond) {
		t.Errorf("child uses CPU while frozen")
	}
	if err := m.Delete(ctx, "sb"); err != nil {
		t.Fatalf("Delete(sb) = %v", err)
	}
	if err := c.wait(t); !killedBy(err, syscall.SIGKILL) {
		t.Errorf("child after Delete: %v, want killed by SIGKILL", err)
	}
	if _, err := os.Stat(m.v2Dir("sb")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Delete, %s: %v, want it gone", m.v2Dir("sb"), err)
	}
}
