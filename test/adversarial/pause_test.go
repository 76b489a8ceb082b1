package adversarial

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/swap/swaptest"
	"github.com/dsecproject/dsec/sdk/go/dsec"
	"golang.org/x/sys/unix"
)

// Attacks on pause (issue 15) by the code in the sandbox being paused:
// resisting or outrunning the freeze, keeping its memory resident, and
// filling the node's swap, and reaching the pause's record. The tests
// pause through the node keeper of the shared platform (its state dir),
// and read the sandbox's files from the host through its init's root, so
// that nothing they do resumes it (the edge's API resumes on any file
// operation).

// pauseKeeper returns a client of the shared platform's keeper.
func pauseKeeper(t *testing.T) *keeper.Client {
	t.Helper()
	kc := keeper.NewClient(Env(t).StateDir)
	t.Cleanup(kc.Close)
	return kc
}

// hostRead reads a file of sandbox id from the host, through its init's
// root ("" when it is not there).
func hostRead(t *testing.T, kc *keeper.Client, id, path string) string {
	t.Helper()
	info, err := kc.Status(Ctx(t, time.Minute), id)
	if err != nil {
		t.Fatalf("keeper Status(%s) = %v", id, err)
	}
	b, err := os.ReadFile(filepath.Join(fmt.Sprintf("/proc/%d/root", info.Pid), path))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// hostWait waits up to d for a file of sandbox id to be there.
func hostWait(t *testing.T, kc *keeper.Client, id, path string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if s := hostRead(t, kc, id, path); s != "" {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in sandbox %s after %v", path, id, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pauseAndWait pauses sandbox id and waits until its memory has moved.
func pauseAndWait(t *testing.T, kc *keeper.Client, id string) keeper.PauseInfo {
	t.Helper()
	p, err := kc.Pause(Ctx(t, 2*time.Minute), id, true)
	if err != nil {
		t.Fatalf("Pause(%s) = %v", id, err)
	}
	return p
}

func resume(t *testing.T, kc *keeper.Client, id string) {
	t.Helper()
	if _, err := kc.Resume(Ctx(t, time.Minute), id, false); err != nil {
		t.Fatalf("Resume(%s) = %v", id, err)
	}
}

// stands fails t if a file of sandbox id changes within d; it returns it.
func stands(t *testing.T, kc *keeper.Client, id, path string, d time.Duration) string {
	t.Helper()
	a := hostRead(t, kc, id, path)
	time.Sleep(d)
	if b := hostRead(t, kc, id, path); b != a {
		t.Errorf("%s of paused %s went from %q to %q in %v", path, id, a, b, d)
	}
	return a
}

// movesOn fails t unless a file of sandbox id changes from from within
// 10 s.
func movesOn(t *testing.T, kc *keeper.Client, id, path, from string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for hostRead(t, kc, id, path) == from {
		if time.Now().After(deadline) {
			t.Errorf("%s of resumed %s stays at %q", path, id, from)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// memhold starts `probe memhold ARGS` in the background of sb, with its
// files in dir, and returns once it holds its memory.
func memhold(t *testing.T, kc *keeper.Client, sb *dsec.Sandbox, dir, args string) {
	t.Helper()
	MustSh(t, sb, fmt.Sprintf("mkdir -p %s && (probe memhold -dir %s %s > %s/out 2>&1 &)", dir, dir, args, dir))
	hostWait(t, kc, sb.ID, dir+"/memhold.sum", time.Minute)
}

// intact has the memhold of dir read its memory again and compares the
// checksum with the one it wrote at start.
func intact(t *testing.T, kc *keeper.Client, sb *dsec.Sandbox, dir string) {
	t.Helper()
	want := hostWait(t, kc, sb.ID, dir+"/memhold.sum", time.Minute)
	MustSh(t, sb, fmt.Sprintf("rm -f %s/memhold.check && kill -USR1 $(cat %s/memhold.pid)", dir, dir))
	if got := hostWait(t, kc, sb.ID, dir+"/memhold.check", time.Minute); got != want {
		t.Errorf("memory of %s's memhold in %s after the pause = %s, want %s", sb.ID, dir, got, want)
	}
}

// TestPauseCannotBeResisted: a process that ignores every signal it can
// and forks all the time is stopped by a pause all the same (the cgroup
// freezer stops its tasks in the kernel, new children included, with no
// signal it could handle): while paused it uses no CPU, its count of
// forks stands, and it has no more processes than when it was paused.
func TestPauseCannotBeResisted(t *testing.T) {
	Env(t)
	t.Parallel()
	kc := pauseKeeper(t)
	sb := NewSandbox(t, dsec.CreateOptions{})
	MustSh(t, sb, `(trap '' HUP INT QUIT PIPE TERM TSTP TTIN TTOU USR1 USR2 CONT; i=0; while :; do i=$((i+1)); echo $i > /tmp/forks; true & wait; done) > /dev/null 2>&1 &`)
	hostWait(t, kc, sb.ID, "/tmp/forks", 10*time.Second)
	pauseAndWait(t, kc, sb.ID)
	before, err := kc.Stats(Ctx(t, time.Minute), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	at := stands(t, kc, sb.ID, "/tmp/forks", 500*time.Millisecond)
	after, err := kc.Stats(Ctx(t, time.Minute), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if used := after.CPUUsage - before.CPUUsage; used > 20*time.Millisecond {
		t.Errorf("the paused sandbox used %v of CPU in 500 ms", used)
	}
	if after.Pids > before.Pids {
		t.Errorf("the paused sandbox went from %d to %d processes", before.Pids, after.Pids)
	}
	resume(t, kc, sb.ID)
	movesOn(t, kc, sb.ID, "/tmp/forks", at)
}

// TestPauseReachesSharedAndGrowingMemory: memory a process shares with
// a child it forked (copy-on-write pages, which MADV_PAGEOUT skips) and
// memory a process is still filling when the pause comes both leave RAM
// (the group's reclaim reaches them), and both are intact after the
// resume, the second finishing its fill.
func TestPauseReachesSharedAndGrowingMemory(t *testing.T) {
	Env(t)
	t.Parallel()
	swaptest.Enable(t, 512<<20)
	kc := pauseKeeper(t)
	sb := NewSandbox(t, dsec.CreateOptions{Memory: 512 << 20})
	InstallProbe(t, sb)
	memhold(t, kc, sb, "/tmp/shared", "-fork 96")
	// Paused while it fills its memory (the balloon right before a pause).
	MustSh(t, sb, "mkdir -p /tmp/grow && (probe memhold -dir /tmp/grow 192 > /tmp/grow/out 2>&1 &)")
	p := pauseAndWait(t, kc, sb.ID)
	if total := p.Resident + p.Swapped; p.Resident > max(16<<20, total/10) || p.Swapped < 96<<20 {
		t.Errorf("after the pause: %+v, want at most a tenth of its memory in RAM", p)
	}
	resume(t, kc, sb.ID)
	intact(t, kc, sb, "/tmp/shared")
	intact(t, kc, sb, "/tmp/grow")
}

// TestPauseLockedMemory: memory a sandbox locks (mlock) stays in RAM
// through a pause, and the pause says how much; the rest still leaves
// RAM. The sandbox cannot lock more than its RLIMIT_MEMLOCK (8 MiB) per
// process: it has no CAP_IPC_LOCK of the host.
func TestPauseLockedMemory(t *testing.T) {
	Env(t)
	t.Parallel()
	swaptest.Enable(t, 256<<20)
	kc := pauseKeeper(t)
	sb := NewSandbox(t, dsec.CreateOptions{Memory: 256 << 20})
	InstallProbe(t, sb)
	memhold(t, kc, sb, "/tmp/locked", "-lock 8 64")
	if out := hostRead(t, kc, sb.ID, "/tmp/locked/out"); !strings.Contains(out, "mlock ok") {
		t.Fatalf("memhold -lock 8: %q, want mlock ok", out)
	}
	memhold(t, kc, sb, "/tmp/toomuch", "-lock 16 1")
	if out := hostRead(t, kc, sb.ID, "/tmp/toomuch/out"); strings.Contains(out, "mlock ok") {
		t.Errorf("memhold -lock 16 in a sandbox: %q, want mlock refused beyond its 8 MiB", out)
	}
	p := pauseAndWait(t, kc, sb.ID)
	if p.Locked < 8<<20 || p.Swapped < 64<<20*9/10 || p.Resident > p.Locked+16<<20 {
		t.Errorf("after the pause: %+v, want its 8 MiB locked in RAM, reported, and the rest in swap", p)
	}
	resume(t, kc, sb.ID)
	intact(t, kc, sb, "/tmp/locked")
}

// TestPauseSwapExhaustion: one paused sandbox fills most of the node's
// swap; a second one's pause still stops it, leaves what does not fit in
// RAM with a warning that says so, and OOM-kills nothing; both resume
// intact. (No sandbox has a share of the swap of its own: each is
// bounded by its memory limit, v1's memsw.) Not parallel: it needs to
// know the node's swap.
func TestPauseSwapExhaustion(t *testing.T) {
	Env(t)
	swaptest.Enable(t, 256<<20)
	kc := pauseKeeper(t)
	var sbs []*dsec.Sandbox
	for range 2 {
		sb := NewSandbox(t, dsec.CreateOptions{Memory: 256 << 20})
		InstallProbe(t, sb)
		memhold(t, kc, sb, "/tmp/m", "192")
		sbs = append(sbs, sb)
	}
	pauseAndWait(t, kc, sbs[0].ID)
	free := swapFree(t)
	p := pauseAndWait(t, kc, sbs[1].ID)
	t.Logf("second pause with %d MiB of swap free: %+v", free>>20, p)
	if !p.Paused {
		t.Errorf("the second sandbox is not paused: %+v", p)
	}
	if free < 160<<20 {
		if p.Warning == "" || !strings.Contains(p.Warning, "swap") || p.Resident < 192<<20-free-16<<20 {
			t.Errorf("second pause with %d MiB of swap free: %+v, want its memory left in RAM with a warning about swap", free>>20, p)
		}
		// What did fit went out: with no swap left at all the kernel's
		// reclaim passes over anonymous memory, and the pages already
		// written would stay in RAM too (and hold swap).
		if p.Swapped < free-48<<20 {
			t.Errorf("second pause with %d MiB of swap free moved %d MiB to swap, want what fits", free>>20, p.Swapped>>20)
		}
	} else {
		t.Logf("the host had %d MiB of swap free (another swap file is on): no warning to check", free>>20)
	}
	for _, sb := range sbs {
		st, err := kc.Stats(Ctx(t, time.Minute), sb.ID)
		if err != nil || st.OOMKills != 0 {
			t.Errorf("Stats(%s) = %+v, %v; want no OOM kill", sb.ID, st, err)
		}
		resume(t, kc, sb.ID)
		intact(t, kc, sb, "/tmp/m")
	}
}

// swapFree is the host's free swap (/proc/meminfo).
func swapFree(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var v int64
		if _, err := fmt.Sscanf(sc.Text(), "SwapFree: %d kB", &v); err == nil {
			return v << 10
		}
	}
	t.Fatal("no SwapFree in /proc/meminfo")
	return 0
}

// TestPauseMarkOutOfReach: the record of a pause is an extended attribute
// of the sandbox's cgroup (trusted.dsec.paused), which a restarted keeper
// obeys by freezing the group. A sandbox that could set it on another
// sandbox's group would have that sandbox frozen at the next keeper
// start. From inside, as the sandbox's root, it tries on every cgroup
// directory it can see or mount: none takes it, and the other sandbox's
// group has no mark until the platform pauses it (which shows the check
// reads the right place).
func TestPauseMarkOutOfReach(t *testing.T) {
	Env(t)
	t.Parallel()
	kc := pauseKeeper(t)
	attacker := NewSandbox(t, dsec.CreateOptions{})
	victim := NewSandbox(t, dsec.CreateOptions{})
	InstallProbe(t, attacker)
	got := probe(t, attacker, "mark", "trusted.dsec.paused", "freezer", "memory", "cpu,cpuacct", "pids")
	for k, v := range got {
		if strings.HasPrefix(k, "set:") || strings.HasPrefix(k, "mount:") && v == "ok" {
			t.Errorf("from inside: %s %s", k, v)
		}
	}
	t.Logf("from inside: %v", got)
	if got["tried"] == "" {
		t.Errorf("the probe tried no directory: %v", got)
	}
	marked := func() bool {
		t.Helper()
		info, err := kc.Status(Ctx(t, time.Minute), victim.ID)
		if err != nil {
			t.Fatal(err)
		}
		dir := hostCgroup2Dir(t, info.Pid)
		_, err = unix.Getxattr(dir, "trusted.dsec.paused", make([]byte, 16))
		if err != nil && !errors.Is(err, unix.ENODATA) {
			t.Fatalf("getxattr %s: %v", dir, err)
		}
		return err == nil
	}
	if marked() {
		t.Errorf("the running sandbox %s is marked paused after the attack", victim.ID)
	}
	pauseAndWait(t, kc, victim.ID)
	if !marked() {
		t.Errorf("the paused sandbox %s has no mark: the check reads the wrong place", victim.ID)
	}
	resume(t, kc, victim.ID)
	if marked() {
		t.Errorf("the resumed sandbox %s is still marked paused", victim.ID)
	}
}

// hostCgroup2Dir is process pid's cgroup2 directory on the host.
func hostCgroup2Dir(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	rel := ""
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel = p
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if ok && strings.HasPrefix(post, "cgroup2 ") && len(f) > 4 && f[3] == "/" {
			return filepath.Join(f[4], rel)
		}
	}
	t.Fatal("no cgroup2 mount on the host")
	return ""
}
