package adversarial

import (
	"io"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// The bombs load the whole machine, so they do not call t.Parallel: they
// run one after another before the parallel attacks start.

// TestForkBomb forks without end in a sandbox with a pids limit of 64 and
// checks, while the bomb runs, that the sandbox holds at most 64 tasks
// and that the host, the API and another sandbox still answer; the exec's
// timeout then kills the bomb's process group and the sandbox works again.
// Protection: the sandbox cgroup's pids.max (--pids).
func TestForkBomb(t *testing.T) {
	Env(t)
	const pids = 64
	sb := NewSandbox(t, dsec.CreateOptions{Pids: pids})
	other := Shared(t)
	ctx := Ctx(t, 2*time.Minute)
	// awk goes on forking when a fork fails (a shell gives up); the exec
	// waits for them until its timeout kills its process group, sleepers
	// and all.
	x, err := sb.ExecDetached(ctx, dsec.ExecRequest{
		Shell:   `for i in 1 2 3 4; do awk 'BEGIN { while (1) system("sleep 1000 &") }' & done; wait`,
		Timeout: 4 * time.Second,
	})
	if err != nil {
		t.Fatalf("ExecDetached(fork bomb) = %v", err)
	}
	full := false
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && !full; time.Sleep(100 * time.Millisecond) {
		st, err := sb.Stats(ctx)
		if err != nil {
			t.Fatalf("Stats during the fork bomb = %v", err)
		}
		if st.Pids > pids || st.PidsLimit != pids {
			t.Fatalf("Stats during the fork bomb: pids %d / %d, want at most %d / %d", st.Pids, st.PidsLimit, pids, pids)
		}
		full = st.Pids >= pids-2
	}
	if !full {
		t.Errorf("the fork bomb never filled the sandbox's %d pids: the test cannot fail", pids)
	}
	HostAlive(t)
	if r := Sh(t, other, "echo fine"); r.Stdout != "fine\n" {
		t.Errorf("exec in another sandbox during the fork bomb = %q, %q, want fine", r.Stdout, r.Stderr)
	}
	end, err := sb.Attach(ctx, x, 0, 0, io.Discard, io.Discard)
	if err != nil || !end.TimedOut {
		t.Errorf("fork bomb exec = %+v, %v; want timed out", end, err)
	}
	if r := Sh(t, sb, "echo back"); r.Stdout != "back\n" {
		t.Errorf("exec after the fork bomb was killed = %q, %q; want back", r.Stdout, r.Stderr)
	}
}

// TestMemoryBomb doubles a string without end in a sandbox of 64 MiB and
// checks the command is OOM-killed with the oom flag, the sandbox and
// another sandbox still run commands, and the host answers. Protection:
// the sandbox cgroup's memory.max (--memory) and the keeper's OOM
// accounting.
func TestMemoryBomb(t *testing.T) {
	Env(t)
	sb := NewSandbox(t, dsec.CreateOptions{Memory: 64 << 20})
	r := Sh(t, sb, `awk 'BEGIN { s = "0123456789abcdef"; while (1) s = s s }'`)
	if !r.OOMKilled || r.Signal != int(syscall.SIGKILL) {
		t.Errorf("memory bomb = %+v; want OOM-killed by SIGKILL", r.ExitStatus)
	}
	st, err := sb.Stats(Ctx(t, time.Minute))
	if err != nil || st.OOMKills < 1 || st.MemoryLimit != 64<<20 {
		t.Errorf("Stats after the memory bomb = %+v, %v; want an OOM kill under a 64 MiB limit", st, err)
	}
	if r := Sh(t, sb, "echo alive"); r.Stdout != "alive\n" {
		t.Errorf("exec after the memory bomb = %q, %q; want alive", r.Stdout, r.Stderr)
	}
	if r := Sh(t, Shared(t), "echo fine"); r.Stdout != "fine\n" {
		t.Errorf("exec in another sandbox after the memory bomb = %q, %q; want fine", r.Stdout, r.Stderr)
	}
	HostAlive(t)
}

// TestDiskBomb writes 1 GiB into a sandbox whose writable layer is 64 MiB
// and checks the write stops with ENOSPC near 64 MiB, the host's file
// system of the state dir lost no more than the layer's size, and the
// sandbox still works once the file is removed. Protection: the writable
// layer's own size limit (--disk, a disk image of that size).
func TestDiskBomb(t *testing.T) {
	p := Env(t)
	sb := NewSandbox(t, dsec.CreateOptions{Disk: 64 << 20})
	before := freeBytes(t, p.StateDir)
	r := Sh(t, sb, "dd if=/dev/zero of=/big bs=1M count=1024; e=$?; stat -c %s /big; exit $e")
	if r.Code() == 0 || !strings.Contains(r.Stderr, "No space left on device") {
		t.Errorf("dd of 1 GiB into a 64 MiB disk = exit %d, stderr %q; want No space left on device", r.Code(), r.Stderr)
	}
	if f := strings.Fields(r.Stdout); len(f) != 1 || atoi(f[0]) <= 0 || atoi(f[0]) > 64<<20 {
		t.Errorf("size of the 1 GiB file = %q, want at most 64 MiB", r.Stdout)
	}
	after := freeBytes(t, p.StateDir)
	if used := before - after; used > 128<<20 {
		t.Errorf("the host's state dir file system lost %d MiB to a 64 MiB sandbox disk, want at most 128 MiB", used>>20)
	}
	if r := Sh(t, sb, "rm /big && echo ok > /small && cat /small"); r.Stdout != "ok\n" {
		t.Errorf("write after removing the big file = %q, %q; want ok", r.Stdout, r.Stderr)
	}
}

// TestShmBomb fills /dev/shm (a tmpfs charged to the sandbox's memory) and
// checks the write stops at 64 MiB or is OOM-killed, without taking the
// host's memory, and the sandbox still runs commands. Protection: the shm
// tmpfs's size=64M and the memory cgroup that shmem pages are charged to.
func TestShmBomb(t *testing.T) {
	Env(t)
	sb := NewSandbox(t, dsec.CreateOptions{Memory: 256 << 20})
	r := Sh(t, sb, "dd if=/dev/zero of=/dev/shm/big bs=1M count=1024")
	if r.Code() == 0 || !strings.Contains(r.Stderr, "No space left on device") && !r.OOMKilled {
		t.Errorf("dd of 1 GiB into /dev/shm = %+v, stderr %q; want ENOSPC or an OOM kill", r.ExitStatus, r.Stderr)
	}
	r = Sh(t, sb, "stat -c %s /dev/shm/big; df -k /dev/shm | tail -1")
	if f := strings.Fields(r.Stdout); len(f) < 4 || atoi(f[0]) > 64<<20 || atoi(f[3]) > 64<<10 {
		t.Errorf("/dev/shm after the bomb = %q, want at most 64 MiB used", r.Stdout)
	}
	if r := Sh(t, sb, "rm /dev/shm/big && echo alive"); r.Stdout != "alive\n" {
		t.Errorf("exec after the shm bomb = %q, %q; want alive", r.Stdout, r.Stderr)
	}
	HostAlive(t)
}

// TestOutputFlood writes 24 MiB on stdout and on stderr, and runs `yes`
// without end (the report's "a yes filled tens of GB"), and checks each
// stream keeps exactly its cap and says it was truncated, the command ran
// to its end or its timeout, and a command past a smaller cap of its own
// keeps running to its end. Protection: the keeper's per-exec output cap
// (16 MiB by default, OutputLimit per request).
func TestOutputFlood(t *testing.T) {
	Env(t)
	sb := NewSandbox(t, dsec.CreateOptions{})
	const defaultCap = 16 << 20
	for _, tt := range []struct {
		name, script string
		stderr       bool
	}{
		{name: "stdout", script: "yes | head -c 25165824"},
		{name: "stderr", script: "yes | head -c 25165824 >&2", stderr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut countWriter
			st, err := sb.ExecStream(Ctx(t, time.Minute), dsec.ExecRequest{Shell: tt.script}, &out, &errOut)
			if err != nil {
				t.Fatalf("ExecStream(%q) = %v", tt.script, err)
			}
			got, truncated := out.n, st.StdoutTruncated
			if tt.stderr {
				got, truncated = errOut.n, st.StderrTruncated
			}
			if got != defaultCap || !truncated || st.ExitCode != 0 {
				t.Errorf("ExecStream(%q) = %d bytes, truncated %v, exit %d; want %d, true, 0", tt.script, got, truncated, st.ExitCode, defaultCap)
			}
		})
	}
	var out countWriter
	st, err := sb.ExecStream(Ctx(t, time.Minute), dsec.ExecRequest{Shell: "yes", Timeout: 2 * time.Second}, &out, io.Discard)
	if err != nil || out.n > defaultCap || out.n == 0 || !st.TimedOut {
		t.Errorf("ExecStream(yes) for 2s = %d bytes, %+v, %v; want at most %d, timed out", out.n, st, err, defaultCap)
	}
	r := Sh(t, sb, "yes | head -c 4194304; echo finished >&2", dsec.WithOutputLimit(1<<20))
	if len(r.Stdout) != 1<<20 || !r.StdoutTruncated || r.Stderr != "finished\n" || r.ExitCode != 0 {
		t.Errorf("4 MiB under a 1 MiB cap = %d bytes, truncated %v, stderr %q, exit %d; want 1 MiB, true, finished, 0",
			len(r.Stdout), r.StdoutTruncated, r.Stderr, r.ExitCode)
	}
}

// TestOutputQuota writes more output than a sandbox may keep in all (256
// MiB) through a command whose own cap is higher, and checks the sandbox
// keeps no more than its quota, says so, and drops the output of later
// commands while they still run. Protection: the keeper's per-sandbox
// output quota.
func TestOutputQuota(t *testing.T) {
	Env(t)
	sb := NewSandbox(t, dsec.CreateOptions{})
	ctx := Ctx(t, 2*time.Minute)
	before, err := sb.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	quota := before.OutputLimit
	if quota <= 0 || quota > 1<<30 {
		t.Fatalf("Stats().OutputLimit = %d, want a quota of at most 1 GiB", quota)
	}
	// Detached, so that the flood is not streamed to the test.
	x, err := sb.ExecDetached(ctx, dsec.ExecRequest{Shell: "head -c " + strconv.FormatInt(quota+64<<20, 10) + " /dev/zero", OutputLimit: 2 * quota})
	if err != nil {
		t.Fatalf("ExecDetached(quota + 64 MiB) = %v", err)
	}
	var flood dsec.ExecInfo
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		execs, err := sb.ListExecs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if i := slices.IndexFunc(execs, func(e dsec.ExecInfo) bool { return e.ID == x }); i >= 0 && !execs[i].Running {
			flood = execs[i]
			break
		}
	}
	if flood.Exit == nil || flood.StdoutBytes > quota || !flood.Exit.StdoutTruncated || flood.Exit.ExitCode != 0 {
		t.Errorf("quota + 64 MiB of output = %d bytes kept, exit %+v; want at most %d, truncated, exit 0", flood.StdoutBytes, flood.Exit, quota)
	}
	after, err := sb.Stats(ctx)
	if err != nil || after.Output > quota {
		t.Errorf("Stats().Output after the flood = %+v, %v; want at most %d", after, err, quota)
	}
	r := Sh(t, sb, "echo more; echo done > /tmp/done")
	if r.Stdout == "more\n" || !r.StdoutTruncated {
		t.Errorf("exec past the quota = %q, truncated %v; want its output dropped", r.Stdout, r.StdoutTruncated)
	}
	if b, err := sb.ReadFile(ctx, "/tmp/done"); err != nil || string(b) != "done\n" {
		t.Errorf("ReadFile(/tmp/done) = %q, %v; want the command past the quota to have run", b, err)
	}
}

// countWriter counts what is written to it.
type countWriter struct{ n int64 }

func (w *countWriter) Write(b []byte) (int, error) {
	w.n += int64(len(b))
	return len(b), nil
}

// atoi is strconv.ParseInt for output that should hold a number; -1 when
// it does not.
func atoi(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// freeBytes is the space left to root on the file system of path.
func freeBytes(t *testing.T, path string) int64 {
	t.Helper()
	var s syscall.Statfs_t
	if err := syscall.Statfs(path, &s); err != nil {
		t.Fatalf("statfs(%s) = %v", path, err)
	}
	return int64(s.Bfree) * s.Bsize
}
