//go:build linux && cgo

package nsexec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/testenv"
)

// startZygote starts a zygote of this binary; at the end of the test it is
// closed and must exit by itself.
func startZygote(t testing.TB) *Zygote {
	t.Helper()
	z, err := StartZygote(self(t))
	if err != nil {
		t.Fatalf("StartZygote(%q) = %v", self(t), err)
	}
	t.Cleanup(func() {
		if err := z.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
		// A test that killed the zygote has reaped it already.
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", z.Pid())); err != nil {
			return
		}
		ws, err := waitExit(z.Pid(), 10*time.Second)
		if err != nil {
			_ = syscall.Kill(z.Pid(), syscall.SIGKILL)
			_, _, _ = waitPid(z.Pid())
			t.Errorf("zygote %d after Close: %v", z.Pid(), err)
		} else if !ws.Exited() || ws.ExitStatus() != 0 {
			t.Errorf("zygote %d ended with %v after Close, want exit 0", z.Pid(), ws)
		}
	})
	return z
}

// waitExit waits up to timeout for our child pid to end, and reaps it.
func waitExit(pid int, timeout time.Duration) (syscall.WaitStatus, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(fd)
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, int(timeout.Milliseconds()))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("poll pidfd: %w", err)
		}
		if n == 0 {
			return 0, fmt.Errorf("still running after %v", timeout)
		}
		break
	}
	ws, _, err := waitPid(pid)
	return ws, err
}

// exitTime waits for pid to end (not reaping it) and returns when it did.
func exitTime(pid int) (time.Time, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return time.Time{}, fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(fd)
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(p, -1)
		if err == unix.EINTR {
			continue
		}
		return time.Now(), err
	}
}

// fdsOf lists the descriptors of pid.
func fdsOf(t testing.TB, pid int) []string {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	var fds []string
	for _, e := range entries {
		fds = append(fds, e.Name())
	}
	return fds
}

// rssKiB returns VmRSS of pid in KiB.
func rssKiB(t testing.TB, pid int) int {
	t.Helper()
	v := strings.TrimSuffix(procStatus(t, pid)["VmRSS"], " kB")
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("VmRSS of %d = %q", pid, v)
	}
	return n
}

var zygoteFDs = []string{"0", "1", "2", "3"}

// checkZygoteFDs checks that the zygote holds only fds 0-3. It closes a
// request's descriptors just after forking the worker, so a worker may
// answer before: allow a moment.
func checkZygoteFDs(t testing.TB, z *Zygote, when string) {
	t.Helper()
	var fds []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		fds = fdsOf(t, z.Pid())
		if cmp.Equal(fds, zygoteFDs) || time.Now().After(deadline) {
			break
		}
	}
	if !cmp.Equal(fds, zygoteFDs) {
		t.Errorf("fds of the zygote %s = %q, want %q", when, fds, zygoteFDs)
	}
}

// runTrue runs true through z and checks it exits 0; it returns how long
// Spawn took.
func runTrue(t testing.TB, z *Zygote, target int) time.Duration {
	t.Helper()
	start := time.Now()
	child, err := z.Spawn(ExecConfig{Pid: target, Argv: []string{"true"}, Env: defaultEnv}, [3]*os.File{})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Spawn(true) = %v", err)
	}
	if ws := wait4(t, child); !ws.Exited() || ws.ExitStatus() != 0 {
		t.Fatalf("true through the zygote = %v, want exit 0", ws)
	}
	return took
}

func TestZygoteProcess(t *testing.T) {
	target := startTarget(t)
	z := startZygote(t)
	status := procStatus(t, z.Pid())
	got := map[string]string{"Name": status["Name"], "Threads": status["Threads"]}
	if want := map[string]string{"Name": "dsec-zygote", "Threads": "1"}; !cmp.Equal(got, want) {
		t.Errorf("zygote status = %v, want %v", got, want)
	}
	checkZygoteFDs(t, z, "at start")
	ignored, err := strconv.ParseUint(status["SigIgn"], 16, 64)
	if err != nil {
		t.Fatalf("SigIgn = %q", status["SigIgn"])
	}
	signals := []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGPIPE, syscall.SIGCHLD, syscall.SIGALRM, syscall.SIGTTOU}
	for _, sig := range signals {
		if ignored&(1<<(sig-1)) == 0 {
			t.Errorf("SigIgn of the zygote = %s: %v is not ignored", status["SigIgn"], sig)
		}
	}
	for _, sig := range signals {
		if err := syscall.Kill(z.Pid(), sig); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if st := procState(z.Pid()); st != 'S' {
		t.Fatalf("zygote after SIGTERM and others: state %q, want 'S' (sleeping)", st)
	}
	runTrue(t, z, target)
	t.Logf("zygote: VmRSS %s (anonymous %s)", status["VmRSS"], status["RssAnon"])
}

func TestZygoteConcurrentSpawns(t *testing.T) {
	target := startTarget(t)
	z := startZygote(t)
	const workers, perWorker = 8, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				want := fmt.Sprintf("request %d.%d", w, i)
				got, err := echo(z, target, want)
				if err != nil || got != want+"\n" {
					t.Errorf("exec echo %q = %q, %v, want %q", want, got, err, want+"\n")
				}
			}
		})
	}
	wg.Wait()
	// The kernel reaps workers as they exit: none stays a zombie.
	waitFor(t, "the zygote's workers to be gone", func() bool { return len(childrenOf(t, z.Pid())) == 0 })
	checkZygoteFDs(t, z, fmt.Sprintf("after %d requests", workers*perWorker))
}

// echo runs `busybox echo arg` through z and returns its output.
func echo(z *Zygote, target int, arg string) (string, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return "", err
	}
	defer r.Close()
	child, err := z.Spawn(ExecConfig{Pid: target, Argv: []string{"busybox", "echo", arg}, Env: defaultEnv}, [3]*os.File{nil, w, w})
	w.Close()
	if err != nil {
		return "", err
	}
	out, rerr := io.ReadAll(r)
	ws, _, err := waitPid(child)
	switch {
	case err != nil:
		return "", err
	case rerr != nil:
		return "", rerr
	case !ws.Exited() || ws.ExitStatus() != 0:
		return "", fmt.Errorf("echo ended with %v", ws)
	}
	return string(out), nil
}

func TestZygoteStaysSmall(t *testing.T) {
	target := startTarget(t)
	z := startZygote(t)
	const warm, total = 100, 2000
	times := make([]time.Duration, 0, total)
	for range warm {
		times = append(times, runTrue(t, z, target))
	}
	checkZygoteFDs(t, z, fmt.Sprintf("after %d requests", warm))
	rss := rssKiB(t, z.Pid())
	for range total - warm {
		times = append(times, runTrue(t, z, target))
	}
	checkZygoteFDs(t, z, fmt.Sprintf("after %d requests", total))
	rss2 := rssKiB(t, z.Pid())
	// Nothing is allocated per request; allow a few pages of noise.
	if rss2 > rss+16 {
		t.Errorf("VmRSS of the zygote = %d KiB after %d requests, %d KiB after %d, want no growth", rss, warm, rss2, total)
	}
	slices.Sort(times)
	t.Logf("zygote: VmRSS %d KiB after %d requests, %d KiB after %d; Spawn of true: median %v, p90 %v",
		rss, warm, rss2, total, times[len(times)/2], times[len(times)*9/10])
}

func TestZygoteLargeConfig(t *testing.T) {
	target := startTarget(t)
	z := startZygote(t)
	runTrue(t, z, target)
	rss := rssKiB(t, z.Pid())

	// 9 variables of 100 KiB: 900 KiB of config, 15 chunks. (One string
	// may not pass 128 KiB in execve.)
	env := slices.Clone(defaultEnv)
	for i := range 9 {
		env = append(env, fmt.Sprintf("V%d=%s", i, strings.Repeat(strconv.Itoa(i), 100<<10)))
	}
	cfg := ExecConfig{Pid: target, Argv: []string{"busybox", "sh", "-c", `echo ${#V0} ${#V8} ${V8:0:3}`}, Env: env}
	if b, err := cfg.Encode(); err != nil || len(b) < 900<<10 {
		t.Fatalf("Encode() = %d bytes, %v, want over 900 KiB", len(b), err)
	}
	stdout, stderr, ws := run(t, zygoteSpawner(z), cfg)
	if want := "102400 102400 888\n"; ws.ExitStatus() != 0 || stdout != want {
		t.Errorf("exec with 900 KiB of environment = %q, %v (stderr %q), want %q, exit 0", stdout, ws, stderr, want)
	}
	// The pages past the first chunk went back.
	if rss2 := rssKiB(t, z.Pid()); rss2 > rss+zygoteChunk/1024+16 {
		t.Errorf("VmRSS of the zygote = %d KiB after a 900 KiB request, %d before, want at most a chunk more", rss2, rss)
	}
	runTrue(t, z, target)
}

func TestZygoteKilled(t *testing.T) {
	target := startTarget(t)

	t.Run("idle", func(t *testing.T) {
		z := startZygote(t)
		runTrue(t, z, target)
		if err := syscall.Kill(z.Pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if ws, err := waitExit(z.Pid(), 5*time.Second); err != nil || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("zygote after SIGKILL = %v, %v", ws, err)
		}
		for range 2 {
			start := time.Now()
			child, err := z.Spawn(ExecConfig{Pid: target, Argv: []string{"true"}, Env: defaultEnv}, [3]*os.File{})
			if !errors.Is(err, errdefs.ErrUnavailable) || child != 0 || time.Since(start) > time.Second {
				t.Errorf("Spawn to a dead zygote = %d, %v after %v, want an Unavailable error at once", child, err, time.Since(start))
			}
		}
	})

	t.Run("with a request pending", func(t *testing.T) {
		z := startZygote(t)
		if err := syscall.Kill(z.Pid(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		type result struct {
			child int
			err   error
		}
		done := make(chan result, 1)
		go func() {
			child, err := z.Spawn(ExecConfig{Pid: target, Argv: []string{"true"}, Env: defaultEnv}, [3]*os.File{})
			done <- result{child, err}
		}()
		select {
		case r := <-done:
			t.Fatalf("Spawn to a stopped zygote = %d, %v, want it to wait", r.child, r.err)
		case <-time.After(100 * time.Millisecond):
		}
		if err := syscall.Kill(z.Pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			if !errors.Is(r.err, errdefs.ErrUnavailable) || r.child != 0 {
				t.Errorf("Spawn pending when the zygote was killed = %d, %v, want an Unavailable error", r.child, r.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Spawn pending when the zygote was killed did not return")
		}
		if _, err := waitExit(z.Pid(), 5*time.Second); err != nil {
			t.Fatal(err)
		}
	})
}

func TestZygoteExitsOnClose(t *testing.T) {
	z, err := StartZygote(self(t))
	if err != nil {
		t.Fatalf("StartZygote = %v", err)
	}
	if err := z.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
	// Exit 0, not a signal: the zygote saw its socket's end.
	if ws, err := waitExit(z.Pid(), 5*time.Second); err != nil || !ws.Exited() || ws.ExitStatus() != 0 {
		t.Errorf("zygote after Close = %v, %v, want exit 0", ws, err)
	}
	if child, err := z.Spawn(ExecConfig{Pid: 1, Argv: []string{"true"}}, [3]*os.File{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Spawn after Close = %d, %v, want an Unavailable error", child, err)
	}
	if err := z.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}
}

func TestStartZygoteErrors(t *testing.T) {
	prog, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true in PATH")
	}
	tests := []struct {
		name string
		self string
		want string
	}{
		{"no such binary", "/nonexistent/dsec", "no such file or directory"},
		{"not a zygote", prog, "did not start as a zygote: it exited"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := childrenOf(t, os.Getpid())
			z, err := StartZygote(tt.self)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("StartZygote(%q) = %v, %v, want an error with %q", tt.self, z, err, tt.want)
			}
			// What StartZygote started and killed is the caller's to reap.
			for _, pid := range childrenOf(t, os.Getpid()) {
				if !slices.Contains(before, pid) {
					if _, err := waitExit(pid, 5*time.Second); err != nil {
						t.Errorf("child %d left by StartZygote: %v", pid, err)
					}
				}
			}
		})
	}
}

// rawMsg is a message of the zygote protocol, well formed or not. nfds
// descriptors go with it: a new status pipe, then /dev/null.
type rawMsg struct {
	data []byte
	nfds int
}

func zygoteMsg(magic, arg uint32, payload []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, magic)
	b = binary.LittleEndian.AppendUint32(b, arg)
	return append(b, payload...)
}

// TestZygoteMalformedRequests sends what the Go side never sends: each
// request is answered on its status descriptor, if it has one, and the
// zygote goes on serving with no descriptor left behind.
func TestZygoteMalformedRequests(t *testing.T) {
	target := startTarget(t)
	z := startZygote(t)
	first := func(n uint32, payload []byte) []byte { return zygoteMsg(zygoteMagicFirst, n, payload) }
	next := func(off uint32, payload []byte) []byte { return zygoteMsg(zygoteMagicNext, off, payload) }
	ten := make([]byte, 10)
	tests := []struct {
		name string
		msgs []rawMsg
		want []string // the status line of each message that has descriptors
	}{
		{"bad magic", []rawMsg{{zygoteMsg(0xdeadbeef, 0, nil), 4}}, []string{"err 22 zygote request: bad header\n"}},
		{"short header", []rawMsg{{[]byte{1, 2, 3}, 4}}, []string{"err 22 zygote request: bad header\n"}},
		{"empty with descriptors", []rawMsg{{nil, 4}}, []string{"err 22 zygote request: bad header\n"}},
		{"empty", []rawMsg{{nil, 0}}, nil},
		{"no descriptors", []rawMsg{{first(0, nil), 0}}, nil},
		{"two descriptors", []rawMsg{{first(0, nil), 2}}, []string{"err 22 zygote request: want 4 descriptors\n"}},
		{"five descriptors", []rawMsg{{first(0, nil), 5}}, []string{"err 22 zygote request: more than 4 descriptors\n"}},
		{"config too large", []rawMsg{{first(MaxConfigSize+1, nil), 4}}, []string{"err 27 zygote request: config larger than 1 MiB\n"}},
		{"more bytes than announced", []rawMsg{{first(2, ten), 4}}, []string{"err 22 zygote request: more bytes than announced\n"}},
		{
			"message longer than a chunk",
			[]rawMsg{{first(zygoteChunk+1, make([]byte, zygoteChunk+1)), 4}},
			[]string{"err 90 zygote request: message longer than a chunk\n"},
		},
		{"continuation at the wrong offset", []rawMsg{{first(100, ten), 4}, {next(5, ten), 0}}, []string{"err 22 zygote request: config ended early\n"}},
		{"empty continuation", []rawMsg{{first(100, ten), 4}, {next(10, nil), 0}}, []string{"err 22 zygote request: config ended early\n"}},
		{
			"new request before the end",
			[]rawMsg{{first(100, ten), 4}, {first(10, ten), 4}},
			[]string{"err 22 zygote request: config ended early\n", "err 22 zygote request: a request came before the previous one ended\n"},
		},
		{"continuation alone", []rawMsg{{next(0, ten), 0}}, nil},
		{"bad config", []rawMsg{{first(10, ten), 4}}, []string{"err 22 config: unknown record tag: 0\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var statuses []*os.File
			for _, m := range tt.msgs {
				var files []*os.File
				if m.nfds > 0 {
					r, w := pipe(t)
					defer r.Close()
					statuses = append(statuses, r)
					files = append(files, w)
				}
				for len(files) < m.nfds {
					null, err := os.Open(os.DevNull)
					if err != nil {
						t.Fatal(err)
					}
					files = append(files, null)
				}
				sendRaw(t, z, m.data, files)
			}
			var got []string
			for _, r := range statuses {
				if err := r.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(r)
				if err != nil {
					t.Fatalf("read status: %v", err)
				}
				got = append(got, string(b))
			}
			if !cmp.Equal(got, tt.want) {
				t.Errorf("statuses = %q, want %q", got, tt.want)
			}
			runTrue(t, z, target)
			checkZygoteFDs(t, z, "after the request")
		})
	}
}

// FuzzZygoteFraming sends the zygote sequences of messages, well or badly
// framed, whose configs are all zero bytes: the worker's decoder rejects
// such a config before it does anything (tag 0, a truncated record or no
// target pid), so nothing runs and no root is needed. Every message that
// carries a status descriptor must get exactly one "err" line, and the
// zygote must go on serving with only its own descriptors.
//
// The input is a plan of up to 8 messages of 8 bytes each: the kind (0 a
// first message, 1 a continuation, 2 a bad magic word), the number of
// descriptors (0-5) in the low and bits 16-19 of the payload length in the
// high nibble, the payload length's low 16 bits (little-endian; the length
// is at most a chunk and a byte) and the header's second word
// (little-endian u32).
func FuzzZygoteFraming(f *testing.F) {
	plan := func(msgs ...[8]byte) []byte {
		var b []byte
		for _, m := range msgs {
			b = append(b, m[:]...)
		}
		return b
	}
	msg := func(kind, nfds byte, n, arg uint32) [8]byte {
		var m [8]byte
		m[0], m[1] = kind, nfds|byte(n>>16)<<4
		binary.LittleEndian.PutUint16(m[2:], uint16(n))
		binary.LittleEndian.PutUint32(m[4:], arg)
		return m
	}
	f.Add(plan(msg(0, 4, 10, 10)))
	f.Add(plan(msg(0, 4, 0, 0)))
	f.Add(plan(msg(0, 4, 100, 300), msg(1, 0, 100, 100), msg(1, 0, 100, 200)))
	f.Add(plan(msg(0, 4, 100, 300), msg(1, 0, 100, 50)))
	f.Add(plan(msg(0, 4, 100, 300), msg(0, 4, 10, 10)))
	f.Add(plan(msg(0, 5, 10, 10), msg(0, 2, 10, 10), msg(2, 4, 3, 0)))
	f.Add(plan(msg(0, 4, 0, MaxConfigSize+1), msg(1, 0, 10, 0)))
	f.Add(plan(msg(0, 4, zygoteChunk+1, zygoteChunk+1)))

	z := startZygote(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		var statuses []*os.File
		defer func() {
			for _, r := range statuses {
				r.Close()
			}
		}()
		// send sends one message with nfds descriptors, the first a new
		// status pipe.
		send := func(data []byte, nfds int) {
			var files []*os.File
			if nfds > 0 {
				r, w := pipe(t)
				statuses = append(statuses, r)
				files = append(files, w)
			}
			for len(files) < nfds {
				null, err := os.Open(os.DevNull)
				if err != nil {
					t.Fatal(err)
				}
				files = append(files, null)
			}
			sendRaw(t, z, data, files)
		}
		for i := 0; i+8 <= len(in) && i < 8*8; i += 8 {
			m := in[i : i+8]
			n := (int(m[1]>>4)<<16 | int(binary.LittleEndian.Uint16(m[2:]))) % (zygoteChunk + 2)
			magic := []uint32{zygoteMagicFirst, zygoteMagicNext, 0x12345678}[int(m[0])%3]
			send(zygoteMsg(magic, binary.LittleEndian.Uint32(m[4:]), make([]byte, n)), int(m[1]&0xf)%6)
		}
		// Two empty requests: the first ends whatever the plan left
		// pending, the second must reach a worker.
		send(zygoteMsg(zygoteMagicFirst, 0, nil), 4)
		send(zygoteMsg(zygoteMagicFirst, 0, nil), 4)

		for i, r := range statuses {
			if err := r.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(r)
			if err != nil {
				t.Fatalf("status %d of plan %x: %v", i, in, err)
			}
			if !strings.HasPrefix(string(b), "err ") || strings.Count(string(b), "\n") != 1 || !strings.HasSuffix(string(b), "\n") {
				t.Errorf("status %d of plan %x = %q, want one err line", i, in, b)
			}
			if want := "err 22 config: no target pid\n"; i == len(statuses)-1 && string(b) != want {
				t.Errorf("status of a request after plan %x = %q, want %q", in, b, want)
			}
		}
		checkZygoteFDs(t, z, fmt.Sprintf("after plan %x", in))
	})
}

// sendRaw sends one message with files on z's socket, then closes files.
func sendRaw(t testing.TB, z *Zygote, data []byte, files []*os.File) {
	t.Helper()
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	z.sendMu.Lock()
	_, _, err := z.conn.WriteMsgUnix(data, oob, nil)
	z.sendMu.Unlock()
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		t.Fatalf("send %d bytes and %d fds: %v", len(data), len(fds), err)
	}
}

// BenchmarkZygoteSpawnTrue is BenchmarkSpawnTrue through a zygote: one exec
// of `true` in a sandbox, from Spawn to the command's exit.
func BenchmarkZygoteSpawnTrue(b *testing.B) {
	target := startTarget(b)
	z := startZygote(b)
	cfg := ExecConfig{Pid: target, Argv: []string{"true"}, Env: defaultEnv, KeepCaps: DefaultCaps}
	var exited, started []time.Duration
	for b.Loop() {
		start := time.Now()
		child, err := z.Spawn(cfg, [3]*os.File{})
		if err != nil {
			b.Fatal(err)
		}
		started = append(started, time.Since(start))
		end, err := exitTime(child)
		if err != nil {
			b.Fatal(err)
		}
		exited = append(exited, end.Sub(start))
		if ws := wait4(b, child); ws.ExitStatus() != 0 {
			b.Fatalf("true = %v", ws)
		}
	}
	reportMedian(b, "", exited)
	reportMedian(b, "started-", started)
}

// BenchmarkSpawnVsZygote alternates Spawn and Zygote.Spawn of `true` in
// one sandbox and reports, for each, the median time to the command's exit
// and to Spawn's return (the command started). Both run the static dsec
// binary, as the keeper does ($DSEC_BIN, or built once).
func BenchmarkSpawnVsZygote(b *testing.B) {
	target := startTarget(b)
	bin := testenv.NodeBinary(b)
	z, err := StartZygote(bin)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		z.Close()
		if _, err := waitExit(z.Pid(), 10*time.Second); err != nil {
			b.Errorf("zygote after Close: %v", err)
		}
	})
	cfg := ExecConfig{Pid: target, Argv: []string{"true"}, Env: defaultEnv, KeepCaps: DefaultCaps}
	var helperExit, helperStarted, zygoteExit, zygoteStarted []time.Duration
	for b.Loop() {
		start := time.Now()
		helper, child, err := Spawn(bin, cfg, [3]*os.File{})
		if err != nil {
			b.Fatal(err)
		}
		helperStarted = append(helperStarted, time.Since(start))
		end, err := exitTime(child)
		if err != nil {
			b.Fatal(err)
		}
		helperExit = append(helperExit, end.Sub(start))
		reapHelper(b, helper)
		if ws := wait4(b, child); ws.ExitStatus() != 0 {
			b.Fatalf("true = %v", ws)
		}

		start = time.Now()
		child, err = z.Spawn(cfg, [3]*os.File{})
		if err != nil {
			b.Fatal(err)
		}
		zygoteStarted = append(zygoteStarted, time.Since(start))
		if end, err = exitTime(child); err != nil {
			b.Fatal(err)
		}
		zygoteExit = append(zygoteExit, end.Sub(start))
		if ws := wait4(b, child); ws.ExitStatus() != 0 {
			b.Fatalf("true = %v", ws)
		}
	}
	reportMedian(b, "helper-exit-", helperExit)
	reportMedian(b, "helper-started-", helperStarted)
	reportMedian(b, "zygote-exit-", zygoteExit)
	reportMedian(b, "zygote-started-", zygoteStarted)
}

func reportMedian(b *testing.B, prefix string, times []time.Duration) {
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds()), prefix+"median-µs")
	b.ReportMetric(float64(times[len(times)*9/10].Microseconds()), prefix+"p90-µs")
}
