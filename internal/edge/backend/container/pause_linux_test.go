package container

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
	"github.com/dsecproject/dsec/internal/swap/swaptest"
	"github.com/dsecproject/dsec/internal/testenv"
)

// probeBin is test/adversarial/probe, built once (static) for the
// sandboxes: its memhold command holds memory and counts.
var probeBin struct {
	once sync.Once
	data []byte
	err  error
}

// installProbe writes the probe to /usr/bin/probe in sandbox id.
func installProbe(t *testing.T, b *Backend, id string) {
	t.Helper()
	probeBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "dsec-pause-probe-")
		if err != nil {
			probeBin.err = err
			return
		}
		defer os.RemoveAll(dir)
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "probe"), "./test/adversarial/probe")
		cmd.Dir = testenv.ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			probeBin.err = fmt.Errorf("build probe: %v\n%s", err, out)
			return
		}
		probeBin.data, probeBin.err = os.ReadFile(filepath.Join(dir, "probe"))
	})
	if probeBin.err != nil {
		t.Fatal(probeBin.err)
	}
	if _, err := b.WriteFile(context.Background(), id, "/usr/bin/probe", sandbox.WriteOptions{Mode: 0o755, MakeParents: true}, bytes.NewReader(probeBin.data)); err != nil {
		t.Fatalf("WriteFile(/usr/bin/probe) = %v", err)
	}
}

// readFile reads a file of sandbox id whole ("" when it is not there).
func readFile(t *testing.T, b *Backend, id, path string) string {
	t.Helper()
	r, _, err := b.ReadFile(context.Background(), id, path)
	if err != nil {
		return ""
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// waitFile waits up to d for a file of sandbox id to be there.
func waitFile(t *testing.T, b *Backend, id, path string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if s := readFile(t, b, id, path); s != "" {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in sandbox %s after %v", path, id, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitMoved polls the keeper until the memory of sandbox id no longer
// moves, and returns where it is.
func waitMoved(t *testing.T, b *Backend, id string) keeper.PauseInfo {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := b.Keeper().PauseState(context.Background(), id)
		if err != nil {
			t.Fatalf("PauseState(%s) = %v", id, err)
		}
		if !p.Moving {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the memory of %s still moves after a minute: %+v", id, p)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// swapUsed is the host's swap in use (/proc/meminfo), in bytes.
func swapUsed(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var total, free int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var k string
		var v int64
		if _, err := fmt.Sscan(sc.Text(), &k, &v); err != nil {
			continue
		}
		switch k {
		case "SwapTotal:":
			total = v << 10
		case "SwapFree:":
			free = v << 10
		}
	}
	return total - free
}

// memSandbox is a sandbox running `probe memhold` as a background exec.
type memSandbox struct {
	id, exec string
	sum      string // the checksum memhold wrote
}

// startMemhold makes a sandbox of limit bytes of memory that holds mib
// MiB (memhold's extra flags in args) and waits until it does.
func startMemhold(t *testing.T, n *node, b *Backend, name string, limit int64, mib int, args ...string) memSandbox {
	t.Helper()
	ctx := context.Background()
	id := fmt.Sprintf("%s-%d", name, time.Now().UnixNano()%1_000_000)
	if _, err := b.Create(ctx, sandbox.Spec{ID: id, Layers: n.layers, Resources: sandbox.Resources{MemoryBytes: limit, CPUs: 1, Pids: 64, DiskBytes: 256 << 20}}); err != nil {
		t.Fatalf("Create(%s) = %v", id, err)
	}
	t.Cleanup(func() {
		if err := b.Delete(context.Background(), id); err != nil {
			t.Errorf("Delete(%s) = %v", id, err)
		}
	})
	installProbe(t, b, id)
	// Its output goes to a file of its own, not the exec's pipes, which
	// end with a killed keeper (and a write to them would end it).
	cmd := fmt.Sprintf("exec /usr/bin/probe memhold %s %d > /tmp/memhold.out 2>&1", strings.Join(args, " "), mib)
	ms := memSandbox{id: id, exec: "memhold"}
	if err := b.StartExec(ctx, id, sandbox.ExecSpec{ID: ms.exec, Argv: []string{"/bin/sh", "-c", cmd}, Env: []string{"PATH=/bin:/usr/bin"}}); err != nil {
		t.Fatalf("StartExec(memhold) = %v", err)
	}
	ms.sum = waitFile(t, b, id, "/tmp/memhold.sum", time.Minute)
	waitFile(t, b, id, "/tmp/counter", 10*time.Second)
	return ms
}

// checkIntact has memhold read all of its memory again (SIGUSR1, sent by
// a command in the sandbox: the exec that started memhold ends lost with
// a keeper) and compares the checksum with the one it wrote at start.
func (ms memSandbox) checkIntact(t *testing.T, b *Backend) {
	t.Helper()
	ctx := context.Background()
	_ = b.Remove(ctx, ms.id, "/tmp/memhold.check", false) // of an earlier check
	r, err := sandboxtest.ExecErr(ctx, b, ms.id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "kill -USR1 $(cat /tmp/memhold.pid)"}})
	if err != nil || r.Code != 0 {
		t.Fatalf("kill -USR1 memhold = %+v, %v", r, err)
	}
	if got := waitFile(t, b, ms.id, "/tmp/memhold.check", time.Minute); got != ms.sum {
		t.Errorf("memory checksum after resume = %s, want %s", got, ms.sum)
	}
}

// stands checks memhold's counter does not move for d, and returns it.
func (ms memSandbox) stands(t *testing.T, b *Backend, d time.Duration) string {
	t.Helper()
	a := readFile(t, b, ms.id, "/tmp/counter")
	time.Sleep(d)
	if c := readFile(t, b, ms.id, "/tmp/counter"); c != a {
		t.Errorf("counter of paused %s went from %s to %s in %v", ms.id, a, c, d)
	}
	return a
}

// moves checks memhold's counter goes past from within 10 s.
func (ms memSandbox) moves(t *testing.T, b *Backend, from string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for readFile(t, b, ms.id, "/tmp/counter") == from {
		if time.Now().After(deadline) {
			t.Errorf("counter of resumed %s stays at %s", ms.id, from)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPauseMovesMemoryOut pauses a sandbox holding 256 MiB of dirty
// anonymous memory on a node with swap: at least 90% of it leaves RAM,
// as its cgroup and the host's /proc/meminfo both say; its counter stands
// while paused; after the resume it counts on and its memory is intact.
func TestPauseMovesMemoryOut(t *testing.T) {
	n := newNode(t)
	swaptest.Enable(t, 512<<20)
	b := n.open(t)
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	const mib = 256
	ms := startMemhold(t, n, b, "pause-mem", 512<<20, mib)
	before, err := b.Keeper().PauseState(ctx, ms.id)
	if err != nil || before.Paused || before.Resident < mib<<20 {
		t.Fatalf("PauseState before = %+v, %v; want running with %d MiB resident", before, err, mib)
	}
	swap0 := swapUsed(t)
	t0 := time.Now()
	info, err := b.Pause(ctx, ms.id)
	took := time.Since(t0)
	if err != nil {
		t.Fatalf("Pause = %v", err)
	}
	if st, err := b.Status(ctx, ms.id); err != nil || !st.Paused {
		t.Errorf("Status after Pause = %+v, %v; want paused", st, err)
	}
	p := waitMoved(t, b, ms.id)
	moved := time.Since(t0)
	swapped := swapUsed(t) - swap0
	t.Logf("pause returned in %v (%+v); memory moved in %v: %+v; host swap +%d MiB", took, info, moved, p, swapped>>20)
	if p.Swapped < mib<<20*9/10 || p.Resident > mib<<20/10 {
		t.Errorf("after the move: %+v, want >= 90%% of %d MiB in swap and <= 10%% in RAM (cgroup)", p, mib)
	}
	if swapped < mib<<20*9/10 {
		t.Errorf("host swap in use grew by %d MiB, want >= 90%% of %d MiB (/proc/meminfo)", swapped>>20, mib)
	}
	if p.Warning != "" {
		t.Errorf("warning after a pause with swap to spare: %q", p.Warning)
	}
	if st, err := b.Stats(ctx, ms.id); err != nil || st.SwappedBytes < mib<<20*9/10 {
		t.Errorf("Stats of the paused sandbox = %+v, %v; want its swapped memory", st, err)
	}
	at := ms.stands(t, b, 300*time.Millisecond)
	if _, err := b.Resume(ctx, ms.id); err != nil {
		t.Fatalf("Resume = %v", err)
	}
	ms.moves(t, b, at)
	ms.checkIntact(t, b)
	r := waitMoved(t, b, ms.id)
	if r.Paused || r.Resident < mib<<20*9/10 {
		t.Errorf("after the resume's read-back: %+v, want running with its %d MiB in RAM", r, mib)
	}
}

// TestPauseKeepsFilesAndExecs pauses a sandbox with files in its
// writable layer and a command running in the background: the files read
// the same after the resume, and the command's output goes on.
func TestPauseKeepsFilesAndExecs(t *testing.T) {
	n := newNode(t)
	swaptest.Enable(t, 256<<20)
	b := n.open(t)
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	ms := startMemhold(t, n, b, "pause-files", 256<<20, 64)
	r, err := sandboxtest.ExecErr(ctx, b, ms.id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c",
		"mkdir -p /data && head -c 33554432 /dev/urandom > /data/blob && for i in $(seq 100); do echo line $i > /data/f$i; done && cat /data/* | md5sum"}})
	if err != nil || r.Code != 0 {
		t.Fatalf("write files = %+v, %v", r, err)
	}
	sum := r.Stdout
	if err := b.StartExec(ctx, ms.id, sandbox.ExecSpec{ID: "ticker", Argv: []string{"/bin/sh", "-c", "while :; do echo tick; sleep 0.02; done"}, Env: []string{"PATH=/bin"}}); err != nil {
		t.Fatal(err)
	}
	outSize := func() int64 {
		o, err := b.OpenOutput(ctx, ms.id, "ticker", sandbox.Stdout)
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		n, err := o.Size()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := b.Pause(ctx, ms.id); err != nil {
		t.Fatalf("Pause = %v", err)
	}
	waitMoved(t, b, ms.id)
	a := outSize()
	at := ms.stands(t, b, 300*time.Millisecond)
	if s := outSize(); s != a {
		t.Errorf("the background command wrote %d bytes while paused", s-a)
	}
	if _, err := b.Resume(ctx, ms.id); err != nil {
		t.Fatalf("Resume = %v", err)
	}
	ms.moves(t, b, at)
	deadline := time.Now().Add(10 * time.Second)
	for outSize() == a && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if outSize() == a {
		t.Errorf("the background command's output stands after the resume")
	}
	r, err = sandboxtest.ExecErr(ctx, b, ms.id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "cat /data/* | md5sum"}})
	if err != nil || r.Stdout != sum {
		t.Errorf("files after the resume: %+v, %v; want md5 %s", r, err, sum)
	}
	ms.checkIntact(t, b)
}

// TestPausedSurvivesKeeperKill kills the keeper with SIGKILL while
// sandboxes are paused: the new keeper adopts them paused (never thawed),
// their memory stays out, and they resume intact.
func TestPausedSurvivesKeeperKill(t *testing.T) {
	n := newNode(t)
	swaptest.Enable(t, 256<<20)
	b := n.open(t)
	ctx := context.Background()
	var boxes []memSandbox
	for i := range 2 {
		boxes = append(boxes, startMemhold(t, n, b, fmt.Sprintf("pause-kill%d", i), 256<<20, 48))
	}
	for _, ms := range boxes {
		if _, err := b.Pause(ctx, ms.id); err != nil {
			t.Fatalf("Pause(%s) = %v", ms.id, err)
		}
	}
	// The second is killed while its memory may still be moving.
	waitMoved(t, b, boxes[0].id)
	var at []string
	for _, ms := range boxes {
		at = append(at, ms.stands(t, b, 100*time.Millisecond))
	}
	v, err := b.Keeper().Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b.Close() // its watcher would start a keeper at once
	if err := syscall.Kill(v.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, v.Pid)
	time.Sleep(200 * time.Millisecond) // no keeper: nothing may thaw them
	b2 := n.open(t)                    // a new keeper, which adopts them
	t.Cleanup(func() { b2.Close() })
	for i, ms := range boxes {
		st, err := b2.Status(ctx, ms.id)
		if err != nil || !st.Paused {
			t.Errorf("Status(%s) after the keeper's kill = %+v, %v; want paused", ms.id, st, err)
		}
		if c := ms.stands(t, b2, 300*time.Millisecond); c != at[i] {
			t.Errorf("counter of %s moved from %s to %s across the keeper's kill", ms.id, at[i], c)
		}
		p := waitMoved(t, b2, ms.id)
		if p.Swapped < 48<<20*9/10 {
			t.Errorf("paused %s after the new keeper's move: %+v, want its memory in swap", ms.id, p)
		}
	}
	for i, ms := range boxes {
		if _, err := b2.Resume(ctx, ms.id); err != nil {
			t.Fatalf("Resume(%s) = %v", ms.id, err)
		}
		ms.moves(t, b2, at[i])
		ms.checkIntact(t, b2)
	}
	// The deletes of startMemhold's cleanups go through b, closed: the
	// client still reaches the new keeper.
}
