package pageout

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/swap/swaptest"
	"github.com/dsecproject/dsec/internal/testenv"
)

// childEnv makes the test binary a child that, once a line comes on
// stdin, fills 64 MiB with a pattern and locks 4 MiB more (mlock), says
// "ready", and then for each further line checks the pattern (touching
// every page) and says "ok" or "bad".
const childEnv = "DSEC_PAGEOUT_TEST_CHILD"

const (
	childBytes  = 64 << 20
	lockedBytes = 4 << 20
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "" {
		os.Exit(m.Run())
	}
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		os.Exit(2)
	}
	b := make([]byte, childBytes)
	for i := range b {
		b[i] = byte(i*7 + i>>12)
	}
	locked, err := unix.Mmap(-1, 0, lockedBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		os.Exit(3)
	}
	if err := unix.Mlock(locked); err != nil {
		fmt.Println("mlock:", err)
		os.Exit(4)
	}
	fmt.Println("ready")
	for {
		if _, err := in.ReadString('\n'); err != nil {
			os.Exit(0)
		}
		ok := true
		for i := range b {
			if b[i] != byte(i*7+i>>12) {
				ok = false
				break
			}
		}
		if ok {
			fmt.Println("ok")
		} else {
			fmt.Println("bad")
		}
	}
}

// status reads a field of /proc/PID/status in bytes.
func status(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestPageOutAndBack pushes a process's memory out with PageOut (the
// locked part stays), has its cgroup drop the swap cache, brings back
// what was resident with WillNeed, and checks the memory is intact.
func TestPageOutAndBack(t *testing.T) {
	testenv.RequireRoot(t)
	swaptest.Enable(t, 256<<20)
	parent := fmt.Sprintf("dsec-test-%x", rand.Uint64())
	m, err := cgroup.New(cgroup.Config{Parent: parent})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Create("sb", cgroup.Resources{MemoryBytes: 256 << 20}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Delete(context.Background(), "sb"); err != nil {
			t.Errorf("delete cgroup: %v", err)
		}
		removeParent(t, parent)
	})
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	if err := m.Add("sb", pid); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(stdout)
	say := func(what string) string {
		t.Helper()
		fmt.Fprintln(stdin, what)
		line, err := out.ReadString('\n')
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		return strings.TrimSpace(line)
	}
	if got := say("go"); got != "ready" {
		t.Fatalf("child said %q, want ready", got)
	}
	p, err := Open(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res, err := p.Resident()
	if err != nil {
		t.Fatalf("Resident() = %v", err)
	}
	if got := Total(res); got < childBytes+lockedBytes {
		t.Fatalf("Resident() = %d bytes in %d ranges, want at least %d", got, len(res), childBytes+lockedBytes)
	}
	if err := m.AllowSwap("sb", true); err != nil {
		t.Fatal(err)
	}
	maps, err := p.Mappings()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Advise(ctx, maps, PageOut); err != nil {
		t.Fatalf("Advise(PageOut) = %v", err)
	}
	// Mapped no more: the pages are in swap (or its cache until written).
	if rss, swapped := status(t, pid, "VmRSS"), status(t, pid, "VmSwap"); rss > lockedBytes+8<<20 || swapped < childBytes*9/10 {
		t.Errorf("after PageOut: VmRSS %d MiB, VmSwap %d MiB; want the %d MiB locked left and %d MiB in swap", rss>>20, swapped>>20, lockedBytes>>20, childBytes>>20)
	}
	if locked := status(t, pid, "VmLck"); locked != lockedBytes {
		t.Errorf("VmLck after PageOut = %d, want %d", locked, lockedBytes)
	}
	// The cgroup drops the swap cache; what it holds then is the locked
	// part and little else.
	if err := m.Reclaim(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
	mem, err := m.Memory("sb")
	if err != nil {
		t.Fatal(err)
	}
	if mem.Resident > lockedBytes+16<<20 || mem.Swapped < childBytes*9/10 {
		t.Errorf("cgroup after PageOut and Reclaim: %+v", mem)
	}
	if _, err := p.Advise(ctx, res, WillNeed); err != nil {
		t.Fatalf("Advise(WillNeed) = %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		mem, err = m.Memory("sb")
		if err != nil {
			t.Fatal(err)
		}
		if mem.Resident >= childBytes+lockedBytes || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if mem.Resident < childBytes+lockedBytes {
		t.Errorf("cgroup 20 s after WillNeed: %+v, want its %d MiB back", mem, (childBytes+lockedBytes)>>20)
	}
	majBefore := majflt(t, pid)
	if got := say("check"); got != "ok" {
		t.Errorf("child's memory after the round trip: %q, want ok", got)
	}
	// Read back ahead: touching it takes (almost) no reads of its own.
	if maj := majflt(t, pid) - majBefore; maj > 64 {
		t.Errorf("touching the memory after WillNeed took %d major faults, want few", maj)
	}
}

// majflt reads a process's major page faults (/proc/PID/stat field 12).
func majflt(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	n, err := strconv.ParseInt(f[9], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// removeParent removes the test's cgroup parent in every hierarchy.
func removeParent(t *testing.T, parent string) {
	t.Helper()
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		if err := os.Remove(filepath.Join("/sys/fs/cgroup", e.Name(), parent)); err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup parent: %v", err)
		}
	}
}
