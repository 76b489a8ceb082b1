package adversarial

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Finding 5: host-wide ceilings. The sandboxes' cgroup parent carries
// pids.max and a memory limit below the host's, and the edge admits
// writable disks and output quotas against the state dir's free space.

// parentFiles returns the control files of the platform's cgroup parent
// that hold its pids and memory ceilings and their use, for the host's
// cgroup layout (v1 and hybrid: the v1 pids and memory hierarchies;
// unified: cgroup2).
func parentFiles(t *testing.T, parent string) (pidsMax, pidsCur, memMax string) {
	t.Helper()
	l, err := cgroup.DetectLayout()
	if err != nil {
		t.Fatalf("DetectLayout() = %v", err)
	}
	if l.Mode == cgroup.Unified {
		d := filepath.Join(l.Unified, parent)
		return filepath.Join(d, "pids.max"), filepath.Join(d, "pids.current"), filepath.Join(d, "memory.max")
	}
	if l.V1["pids"] == "" || l.V1["memory"] == "" {
		t.Fatalf("cgroup layout %+v has no v1 pids or memory hierarchy", l)
	}
	p := filepath.Join(l.V1["pids"], parent)
	return filepath.Join(p, "pids.max"), filepath.Join(p, "pids.current"), filepath.Join(l.V1["memory"], parent, "memory.limit_in_bytes")
}

func readNum(t *testing.T, file string) (int64, bool) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read %s: %v", file, err)
	}
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v >= 1<<62 {
		return 0, false // "max", or v1's unlimited
	}
	return v, true
}

// wantCeilings is what docs/ceilings.md says the parent's ceilings are:
// pid_max (or threads-max) minus the reserve (the shared platform's
// hostPidsReserve, the larger of 50% and 4,096, where the default is 25%),
// and MemTotal minus the default reserve, the larger of 10% and 1 GiB.
func wantCeilings(t *testing.T) (ceiling.Host, ceiling.Sandboxes) {
	t.Helper()
	h, err := ceiling.ReadHost()
	if err != nil {
		t.Fatalf("ReadHost() = %v", err)
	}
	pids := h.Tasks - max((h.Tasks+1)/2, 4096) // hostPidsReserve
	mem := h.MemoryBytes - max((h.MemoryBytes+9)/10, 1<<30)
	return h, ceiling.Sandboxes{Pids: pids, MemoryBytes: mem}
}

// TestHostCeilingsSet checks that the sandboxes' cgroup parent has
// pids.max and a memory limit of the host's totals minus the documented
// reserves, in the files the kernel enforces for this host's layout.
// Protection: the keeper's host ceilings (--host-pids-reserve,
// --host-memory-reserve).
func TestHostCeilingsSet(t *testing.T) {
	p := Env(t)
	NewSandbox(t, dsec.CreateOptions{}) // the parent exists once a sandbox does
	h, want := wantCeilings(t)
	pidsMax, _, memMax := parentFiles(t, p.CgroupParent)
	if v, ok := readNum(t, pidsMax); !ok || v != want.Pids {
		t.Errorf("%s = %d (set %v), want %d: the host's %d tasks minus the larger of 50%% and 4096 (the shared platform's --host-pids-reserve)", pidsMax, v, ok, want.Pids, h.Tasks)
	}
	// 10% rounds up to a whole byte, and v1 rounds limits down to pages.
	if v, ok := readNum(t, memMax); !ok || v > want.MemoryBytes || v < want.MemoryBytes-4096 {
		t.Errorf("%s = %d (set %v), want %d: the host's %d bytes minus the larger of 10%% and 1 GiB", memMax, v, ok, want.MemoryBytes, h.MemoryBytes)
	}
}

// TestForkBombsTogether runs a fork bomb in each of eight sandboxes with
// the default pids limit (4,096: together 32,768, pid_max here) at once
// and checks, while they all push, that the sandboxes together never hold
// more than the parent's ceiling, that the host can still fork and run a
// program, and that the platform answers. Protection: pids.max of the
// sandboxes' cgroup parent, below pid_max, with the keeper and its exec
// helpers outside it. Without the ceiling it refuses to bomb: eight bombs
// on a host without one would take every pid of the machine.
func TestForkBombsTogether(t *testing.T) {
	p := Env(t)
	const n = 8
	pidsLimit := dsec.CreateOptions{}.Pids
	if pidsLimit == 0 {
		pidsLimit = 4096 // CONTRACT.md's default
	}
	h, want := wantCeilings(t)
	sbs := make([]*dsec.Sandbox, n)
	for i := range sbs {
		// A small CPU cap each: the bombs are about tasks, and the test
		// packages that run beside this one need the machine's cores.
		sbs[i] = NewSandbox(t, dsec.CreateOptions{Memory: 1 << 30, CPUs: 0.15})
	}
	calm := Shared(t)
	pidsMax, pidsCur, _ := parentFiles(t, p.CgroupParent)
	ceil, ok := readNum(t, pidsMax)
	if !ok || ceil >= h.Tasks {
		t.Fatalf("%s = %d (set %v), want below the host's %d tasks: not fork-bombing a host without a ceiling", pidsMax, ceil, ok, h.Tasks)
	}
	if ceil != want.Pids {
		t.Errorf("%s = %d, want %d", pidsMax, ceil, want.Pids)
	}
	if int64(n)*pidsLimit <= ceil {
		t.Logf("%d sandboxes × %d pids fit the ceiling of %d on this host: the bombs stop at their own limits", n, pidsLimit, ceil)
	}
	ctx := Ctx(t, 3*time.Minute)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Forks until refused, then keeps trying, until the exec's
			// timeout kills its process group.
			_, err := sb.ExecDetached(ctx, dsec.ExecRequest{
				Shell:   "b() { while :; do sleep 1000 & done; }; b 2>/dev/null & b 2>/dev/null & b 2>/dev/null & b 2>/dev/null & wait",
				Timeout: 2 * time.Minute, // a safety net: the cleanup deletes the sandboxes
			})
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("ExecDetached(fork bomb) in %s = %w", sb.ID, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// Wait for the bombs to reach the ceiling (or every sandbox its own
	// limit, where the host's pid_max is larger).
	full := min(ceil, int64(n)*pidsLimit) * 9 / 10
	var peak int64
	start := time.Now()
	for time.Since(start) < time.Minute && peak < full {
		v, _ := readNum(t, pidsCur)
		peak = max(peak, v)
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the bombs reached %d tasks of a ceiling of %d (host: %d) in %v", peak, ceil, h.Tasks, time.Since(start).Round(time.Millisecond))
	if peak < full {
		t.Errorf("eight fork bombs reached %d tasks in a minute, want %d: the test cannot show the ceiling holds", peak, full)
	}
	// While they push at the ceiling: the host forks, the platform answers.
	for i := range 5 {
		if v, _ := readNum(t, pidsCur); v > ceil {
			t.Errorf("%s = %d, above the ceiling of %d", pidsCur, v, ceil)
		}
		if out, err := Host(t, "sh", "-c", "true && echo forked"); err != nil || out != "forked\n" {
			t.Errorf("host sh -c true #%d during the bombs = %q, %v; want it to run", i+1, out, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	HostAlive(t)
	// Not asserted: an exec in a calm sandbox needs a task under the same
	// ceiling, which the bombs hold (pids are overcommitted), so it may be
	// refused with ResourceExhausted until they end.
	if r, err := calm.Shell(ctx, "echo calm", dsec.WithTimeout(10*time.Second)); err != nil {
		t.Logf("exec in a calm sandbox during the bombs: %v", err)
	} else {
		t.Logf("exec in a calm sandbox during the bombs: %q", r.Stdout)
	}
	if _, err := sbs[0].Stats(ctx); err != nil {
		t.Errorf("Stats of a bombing sandbox = %v, want the platform to answer", err)
	}
	// The cleanup deletes the sandboxes, bombs and all.
}

// TestDiskBeyondFreeSpace asks for a writable disk larger than the state
// dir's file system could ever hold (the finding: disk 10T on 79 GiB free
// was admitted) and checks the create is InvalidArgument at once, names
// disk and has no retry hint; then for one larger than what is free now
// but that fits once space is freed: ResourceExhausted naming the space
// left, with a retry hint. Protection: the edge's disk admission
// (--disk-reserve, --disk-overcommit).
func TestDiskBeyondFreeSpace(t *testing.T) {
	p := Env(t)
	t.Parallel()
	sp, err := ceiling.DiskSpace(p.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	create := func(disk int64) *dsec.Error {
		t.Helper()
		opts := dsec.CreateOptions{Image: "busybox", Disk: disk, Labels: map[string]string{LabelKey: labelValue(t.Name())}}
		sb, err := Admin(t).Create(Ctx(t, time.Minute), opts)
		if err == nil {
			_ = sb.Delete(Ctx(t, time.Minute))
			t.Fatalf("Create(disk %s) with %s free of %s on the state dir's file system = %s, want a refusal",
				ceiling.FormatBytes(disk), ceiling.FormatBytes(sp.Free), ceiling.FormatBytes(sp.Size), sb.ID)
		}
		var de *dsec.Error
		if !errors.As(err, &de) {
			t.Fatalf("Create(disk %s) = %v, want a *dsec.Error", ceiling.FormatBytes(disk), err)
		}
		return de
	}

	disk := max(int64(10<<40), sp.Size+1<<40)
	de := create(disk)
	if !errors.Is(de, dsec.ErrInvalidArgument) || de.RetryAfter != 0 || !strings.Contains(de.Message, "disk ") || !strings.Contains(de.Message, "can ever give a") {
		t.Errorf("Create(disk %s) on a file system of %s = %v, want InvalidArgument naming disk, without a retry hint", ceiling.FormatBytes(disk), ceiling.FormatBytes(sp.Size), de)
	}

	// Between what is left now and what the file system holds for
	// sandboxes at most (the default reserve, the edge's output quota).
	reserve, quota := ceiling.DiskReserve.Of(sp.Size), int64(256<<20)
	left, most := sp.Free-reserve-quota, sp.Size-reserve-quota
	if most-left < 2<<30 {
		t.Logf("the state dir's file system is nearly empty (%s free of %s): no disk fits later but not now", ceiling.FormatBytes(sp.Free), ceiling.FormatBytes(sp.Size))
		return
	}
	disk = left + (most-left)/2
	de = create(disk)
	if !errors.Is(de, dsec.ErrResourceExhausted) {
		t.Fatalf("Create(disk %s) with %s left now, at most %s = %v, want ResourceExhausted", ceiling.FormatBytes(disk), ceiling.FormatBytes(left), ceiling.FormatBytes(most), de)
	}
	for _, want := range []string{"disk: ", "asked", "left on the state dir's file system"} {
		if !strings.Contains(de.Message, want) {
			t.Errorf("Create(disk %s) = %q, want it to say %q", ceiling.FormatBytes(disk), de.Message, want)
		}
	}
	if de.RetryAfter <= 0 {
		t.Errorf("Create(disk %s) = %v, want a retry hint", ceiling.FormatBytes(disk), de)
	}
}
