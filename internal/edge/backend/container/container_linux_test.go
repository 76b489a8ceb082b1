package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/layer"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
	"github.com/dsecproject/dsec/internal/testenv"
)

// node is a keeper with its own state directory and cgroup parent, so the
// tests never touch a dsec that runs on the machine.
type node struct {
	stateDir, cgroupParent, self, runtime string
	layers                                []sandbox.Layer
}

func newNode(t *testing.T) *node {
	testenv.RequireRoot(t)
	self := testenv.NodeBinary(t)
	rootfs := testenv.BusyboxRootfs(t)
	// Not t.TempDir(): the runtime sets roots up as the sandbox's
	// unprivileged root, which must be able to traverse the path.
	dir, err := os.MkdirTemp("", "dsec-container-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	n := &node{stateDir: dir, cgroupParent: "dsec-test-" + hex.EncodeToString(b), self: self}
	img := filepath.Join(dir, "busybox.erofs")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	info, err := layer.BuildFromDir(context.Background(), rootfs, f, layer.Options{})
	f.Close()
	if err != nil {
		t.Fatalf("build busybox layer: %v", err)
	}
	n.layers = []sandbox.Layer{{Digest: info.Digest, Path: img}}
	t.Cleanup(func() { n.teardown(t) })
	return n
}

func (n *node) open(t *testing.T) *Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{
		StateDir: n.stateDir, Self: n.self, CgroupParent: n.cgroupParent, Runtime: n.runtime,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(n.stateDir, "logs", "keeper.log"))
		t.Fatalf("New = %v\nkeeper log:\n%s", err, log)
	}
	return b
}

// teardown stops the keeper with its sandboxes and checks nothing is left.
func (n *node) teardown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := keeper.NewClient(n.stateDir)
	v, verr := c.Version(ctx)
	if err := c.Shutdown(ctx, true); err != nil && verr == nil {
		t.Errorf("keeper shutdown: %v", err)
	}
	if verr == nil {
		waitGone(t, v.Pid)
	}
	for _, h := range hierarchies() {
		p := filepath.Join(h, n.cgroupParent)
		if ents, err := os.ReadDir(p); err == nil {
			var left []string
			for _, e := range ents {
				if e.IsDir() {
					left = append(left, e.Name())
				}
			}
			if len(left) > 0 {
				t.Errorf("cgroups left in %s: %v", p, left)
			}
			if err := os.Remove(p); err != nil {
				t.Errorf("remove cgroup parent: %v", err)
			}
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(n.stateDir, "sandboxes")); len(ents) > 0 {
		t.Errorf("sandbox dirs left after shutdown: %d", len(ents))
	}
	if log, err := os.ReadFile(filepath.Join(n.stateDir, "logs", "keeper.log")); err == nil && t.Failed() {
		t.Logf("keeper log:\n%s", log)
	}
	os.RemoveAll(n.stateDir)
}

func waitGone(t *testing.T, pid int) {
	for range 200 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("keeper %d still runs after shutdown", pid)
}

func hierarchies() []string {
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range ents {
		out = append(out, filepath.Join("/sys/fs/cgroup", e.Name()))
	}
	if len(out) == 0 {
		out = []string{"/sys/fs/cgroup"}
	}
	return out
}

// footprint lists the mounts, cgroups, processes and directories the node
// holds for its sandboxes; not the keeper's pools of ready disks and warm
// sandboxes, which it fills in the background (teardown checks that they
// go with the keeper).
func (n *node) footprint(t *testing.T, b *Backend) []string {
	t.Helper()
	v, err := b.Keeper().Version(context.Background())
	if err != nil {
		t.Fatalf("keeper version: %v", err)
	}
	var out []string
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", v.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], n.stateDir) && !strings.HasSuffix(f[4], "/run/cgroup2") && !pooled(f[4]) {
			out = append(out, "mount "+strings.TrimPrefix(f[4], n.stateDir))
		}
	}
	for _, h := range hierarchies() {
		ents, _ := os.ReadDir(filepath.Join(h, n.cgroupParent))
		for _, e := range ents {
			if e.IsDir() && !pooled(e.Name()) {
				out = append(out, "cgroup "+filepath.Base(h)+"/"+e.Name())
			}
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err == nil && strings.Contains(string(cg), "/"+n.cgroupParent+"/") && !strings.Contains(string(cg), "/"+n.cgroupParent+"/warm_") {
			out = append(out, "process in a sandbox cgroup")
		}
	}
	blocks, _ := os.ReadDir("/sys/block")
	for _, e := range blocks {
		bf, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(bf)), n.stateDir+"/") && !pooled(string(bf)) {
			out = append(out, "loop device for "+strings.TrimPrefix(strings.TrimSpace(string(bf)), n.stateDir))
		}
	}
	for _, d := range []string{"sandboxes", "run/crun", "run/runc", "run/layers", "run/disks", "run/disks/.images"} {
		ents, _ := os.ReadDir(filepath.Join(n.stateDir, d))
		for _, e := range ents {
			if pooled(e.Name()) || strings.HasPrefix(e.Name(), ".") {
				continue // the keeper's pools and the disk store's own files
			}
			out = append(out, "dir "+d+"/"+e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// pooled reports whether a name is of the keeper's pool of ready disks or
// its warm sandboxes.
func pooled(name string) bool {
	return strings.Contains(name, "pool-") || strings.Contains(name, "warm_")
}

func TestConformance(t *testing.T) {
	for _, rt := range []string{"crun", "runc"} {
		t.Run(rt, func(t *testing.T) { testConformance(t, rt) })
	}
}

func testConformance(t *testing.T, runtime string) {
	n := newNode(t)
	n.runtime = runtime
	b := n.open(t)
	t.Cleanup(func() { b.Close() })
	sandboxtest.Run(t, func(t *testing.T) *sandboxtest.Fixture {
		f := &sandboxtest.Fixture{Backend: b, Layers: n.layers}
		f.Footprint = func(t *testing.T) []string { return n.footprint(t, f.Backend.(*Backend)) }
		f.Pids = func(t *testing.T, id string) int64 {
			s, err := f.Backend.(*Backend).Stats(context.Background(), id)
			if err != nil {
				t.Fatalf("Stats(%s) = %v", id, err)
			}
			return s.Pids
		}
		f.Reopen = func(t *testing.T) sandbox.Backend {
			f.Backend.Close()
			nb := n.open(t)
			t.Cleanup(func() { nb.Close() })
			return nb
		}
		return f
	})
}

// TestKeeperRestartReportsLostExecs restarts the keeper itself (not just
// the edge) while a command runs: the sandbox is adopted and keeps
// working, and the command whose end nobody saw is reported lost, never
// dropped silently.
func TestKeeperRestartReportsLostExecs(t *testing.T) {
	n := newNode(t)
	b := n.open(t)
	ctx := context.Background()
	id := "lost-" + hex.EncodeToString([]byte{byte(time.Now().UnixNano())})
	if _, err := b.Create(ctx, sandbox.Spec{ID: id, Layers: n.layers, Resources: sandbox.Resources{MemoryBytes: 64 << 20, CPUs: 1, Pids: 64, DiskBytes: 64 << 20}}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	if err := b.StartExec(ctx, id, sandbox.ExecSpec{ID: "slow", Argv: []string{"sleep", "2"}, Env: []string{"PATH=/bin"}}); err != nil {
		t.Fatal(err)
	}
	v, _ := b.Keeper().Version(ctx)
	if err := b.Keeper().Shutdown(ctx, false); err != nil {
		t.Fatalf("keeper shutdown = %v", err)
	}
	waitGone(t, v.Pid)
	b.Close()
	b2 := n.open(t) // starts a new keeper, which adopts the sandbox
	defer b2.Close()
	st, err := b2.WaitExec(ctx, id, "slow")
	if err != nil || !st.Lost {
		t.Errorf("WaitExec after a keeper restart = %+v, %v; want lost", st, err)
	}
	r, err := sandboxtest.ExecErr(ctx, b2, id, sandbox.ExecSpec{Argv: []string{"echo", "adopted"}})
	if err != nil || r.Stdout != "adopted\n" {
		t.Errorf("exec in the adopted sandbox = %+v, %v", r, err)
	}
	if err := b2.Delete(ctx, id); err != nil {
		t.Errorf("Delete of the adopted sandbox = %v", err)
	}
}
