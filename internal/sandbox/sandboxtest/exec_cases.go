package sandboxtest

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

func execCases() []Case {
	return []Case{
		{Name: "StdinStreamingAndClose", Run: testStdinStreaming},
		{Name: "InitialStdinBeforeWrites", Run: testInitialStdinFirst},
		{Name: "SignalProcessGroup", Run: testSignal},
		{Name: "TimeoutKillsProcessGroup", Run: testTimeoutGroup},
		{Name: "TTYExecAndResize", Needs: []sandbox.Capability{sandbox.CapTTY}, Run: testTTY},
		{Name: "OutputCapTruncatesYes", Run: testOutputCap},
		{Name: "ReadOutputFromOffsets", Run: testOffsets},
		{Name: "CommandJournal", Run: testJournal},
		{Name: "UnknownExecIsNotFound", Run: testUnknownExec},
		{Name: "StepKeysOncePerSandbox", Needs: []sandbox.Capability{sandbox.CapStepKeys}, Run: testStepKeys},
		// The container tier's syscall policy: new user namespaces and
		// mounts are refused (other tiers have a kernel of their own).
		{Name: "SyscallPolicy", Tiers: []sandbox.Tier{sandbox.TierContainer}, Run: testSyscallPolicy},
	}
}

// readAll reads a whole output stream of an exec.
func readAll(t *testing.T, f *Fixture, id, execID string, s sandbox.Stream) string {
	t.Helper()
	o, err := f.Backend.OpenOutput(ctxFor(t), id, execID, s)
	if err != nil {
		t.Fatalf("OpenOutput(%s) = %v", execID, err)
	}
	defer o.Close()
	n, _ := o.Size()
	buf := make([]byte, n)
	if _, err := o.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return string(buf)
}

func start(t *testing.T, f *Fixture, id string, spec sandbox.ExecSpec) string {
	t.Helper()
	seq := execSeq.Add(1)
	if spec.ID == "" {
		spec.ID = "s" + strings.ReplaceAll(t.Name(), "/", "-")[max(0, len(t.Name())-30):] + "-" + string(rune('a'+seq%26))
		spec.ID = strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
				return r
			}
			return '-'
		}, spec.ID)
		spec.ID = "x" + spec.ID + time.Now().Format("150405.000000")[7:]
	}
	if spec.Env == nil {
		spec.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	}
	if err := f.Backend.StartExec(ctxFor(t), id, spec); err != nil {
		t.Fatalf("StartExec(%q) = %v", spec.Argv, err)
	}
	return spec.ID
}

func wait(t *testing.T, f *Fixture, id, execID string) sandbox.ExitStatus {
	t.Helper()
	st, err := f.Backend.WaitExec(ctxFor(t), id, execID)
	if err != nil {
		t.Fatalf("WaitExec(%s) = %v", execID, err)
	}
	return st
}

func testStdinStreaming(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{})
	x := start(t, f, id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "while read l; do echo got:$l; done; echo eof"}, StdinOpen: true})
	for _, line := range []string{"one\n", "two\n"} {
		if err := f.Backend.WriteStdin(ctx, id, x, []byte(line), false); err != nil {
			t.Fatalf("WriteStdin = %v", err)
		}
	}
	if err := f.Backend.WriteStdin(ctx, id, x, []byte("three\n"), true); err != nil {
		t.Fatalf("WriteStdin(close) = %v", err)
	}
	st := wait(t, f, id, x)
	if got := readAll(t, f, id, x, sandbox.Stdout); got != "got:one\ngot:two\ngot:three\neof\n" || st.Code != 0 {
		t.Errorf("stdin streaming output = %q (exit %+v)", got, st)
	}
	if err := f.Backend.WriteStdin(ctx, id, x, []byte("late"), false); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("WriteStdin after exit = %v, want FailedPrecondition", err)
	}
	// Without StdinOpen, stdin is closed after the initial bytes.
	y := start(t, f, id, sandbox.ExecSpec{Argv: []string{"cat"}, Stdin: []byte("given")})
	wait(t, f, id, y)
	if got := readAll(t, f, id, y, sandbox.Stdout); got != "given" {
		t.Errorf("cat with stdin = %q", got)
	}
}

// testInitialStdinFirst checks that an exec's initial stdin reaches it
// before what WriteStdin sends right after the start.
func testInitialStdinFirst(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{})
	for _, tt := range []struct {
		name    string
		initial string
		tries   int
	}{
		{"Short", "a", 30},
		// More than a pipe holds: the initial bytes are still being
		// written when the next write arrives.
		{"LargerThanAPipe", strings.Repeat("a", 256<<10), 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for i := range tt.tries {
				x := start(t, f, id, sandbox.ExecSpec{Argv: []string{"cat"}, Stdin: []byte(tt.initial), StdinOpen: true})
				if err := f.Backend.WriteStdin(ctx, id, x, []byte("b"), true); err != nil {
					t.Fatalf("WriteStdin = %v", err)
				}
				if st := wait(t, f, id, x); st.Code != 0 {
					t.Fatalf("cat = %+v", st)
				}
				if got := readAll(t, f, id, x, sandbox.Stdout); got != tt.initial+"b" {
					t.Fatalf("try %d: cat got %d bytes with b at %d, want the %d initial bytes, then b",
						i, len(got), strings.IndexByte(got, 'b'), len(tt.initial))
				}
			}
		})
	}
	// A command that does not read yet holds up neither its start nor a
	// WriteStdin's turn for ever.
	t.Run("SlowReader", func(t *testing.T) {
		initial := strings.Repeat("a", 1<<20)
		x := start(t, f, id, sandbox.ExecSpec{
			Argv:  []string{"/bin/sh", "-c", "while [ ! -e /tmp/read ]; do sleep 0.05; done; exec cat"},
			Stdin: []byte(initial), StdinOpen: true,
		})
		written := make(chan error, 1)
		go func() { written <- f.Backend.WriteStdin(ctx, id, x, []byte("b"), true) }()
		Exec(t, f, id, sh("touch /tmp/read"))
		if err := <-written; err != nil {
			t.Fatalf("WriteStdin = %v", err)
		}
		wait(t, f, id, x)
		if got := readAll(t, f, id, x, sandbox.Stdout); got != initial+"b" {
			t.Errorf("cat got %d bytes with b at %d, want the %d initial bytes, then b", len(got), strings.IndexByte(got, 'b'), len(initial))
		}
	})
}

func testSignal(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{})
	x := start(t, f, id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "trap 'echo term; exit 3' TERM; echo ready; while :; do sleep 0.05; done"}})
	waitFor(t, func() bool { return strings.Contains(readAll(t, f, id, x, sandbox.Stdout), "ready") })
	if err := f.Backend.Signal(ctx, id, x, 15); err != nil {
		t.Fatalf("Signal(TERM) = %v", err)
	}
	st := wait(t, f, id, x)
	if st.Code != 3 || !strings.Contains(readAll(t, f, id, x, sandbox.Stdout), "term") {
		t.Errorf("after SIGTERM: %+v, output %q", st, readAll(t, f, id, x, sandbox.Stdout))
	}
	if err := f.Backend.Signal(ctx, id, x, 9); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Signal after exit = %v, want FailedPrecondition", err)
	}
	y := start(t, f, id, sandbox.ExecSpec{Argv: []string{"sleep", "30"}})
	if err := f.Backend.Signal(ctx, id, y, 9); err != nil {
		t.Fatal(err)
	}
	if st := wait(t, f, id, y); st.Signal != 9 {
		t.Errorf("after SIGKILL: %+v, want signal 9", st)
	}
}

func testTimeoutGroup(t *testing.T, f *Fixture) {
	id := create(t, f, sandbox.Resources{})
	// The shell and its child both die: nothing of the group survives.
	x := start(t, f, id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "sleep 300 & sleep 301"}, Timeout: 300 * time.Millisecond})
	st := wait(t, f, id, x)
	if !st.TimedOut || st.Signal != 9 || st.Code != 0 {
		t.Errorf("exit = %+v, want timed out by signal 9, no exit code", st)
	}
	r := Exec(t, f, id, sh("ps | grep -c '[s]leep 30' || true"))
	if strings.TrimSpace(r.Stdout) != "0" {
		t.Errorf("after the timeout %s sleeps of the group survive", strings.TrimSpace(r.Stdout))
	}
}

func testTTY(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{})
	x := start(t, f, id, sandbox.ExecSpec{Argv: []string{"/bin/sh"}, TTY: true, Rows: 30, Cols: 100, UID: 1000, GID: 1000})
	send := func(s string) {
		if err := f.Backend.WriteStdin(ctx, id, x, []byte(s), false); err != nil {
			t.Fatalf("WriteStdin(%q) = %v", s, err)
		}
	}
	send("tty; stty size; id -u\n")
	waitFor(t, func() bool { return strings.Contains(readAll(t, f, id, x, sandbox.Stdout), "30 100") })
	if err := f.Backend.ResizeTTY(ctx, id, x, 40, 120); err != nil {
		t.Fatalf("ResizeTTY = %v", err)
	}
	send("stty size; exit 5\n")
	st := wait(t, f, id, x)
	out := readAll(t, f, id, x, sandbox.Stdout)
	if st.Code != 5 || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "40 120") || !strings.Contains(out, "1000") {
		t.Errorf("TTY session = %+v, output %q; want a /dev/pts name, both sizes, uid 1000, exit 5", st, out)
	}
	if got := readAll(t, f, id, x, sandbox.Stderr); got != "" {
		t.Errorf("a TTY exec's stderr = %q, want empty (one stream)", got)
	}
	// A non-TTY exec cannot be resized.
	y := start(t, f, id, sandbox.ExecSpec{Argv: []string{"sleep", "5"}})
	if err := f.Backend.ResizeTTY(ctx, id, y, 10, 10); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("ResizeTTY of a non-TTY exec = %v, want FailedPrecondition", err)
	}
	_ = f.Backend.Signal(ctx, id, y, 9)
}

func testOutputCap(t *testing.T, f *Fixture) {
	id := create(t, f, sandbox.Resources{})
	x := start(t, f, id, sandbox.ExecSpec{Argv: []string{"yes"}, OutputLimit: 1 << 20, Timeout: 2 * time.Second})
	st := wait(t, f, id, x)
	out := readAll(t, f, id, x, sandbox.Stdout)
	if !st.TimedOut || !st.StdoutTruncated || len(out) != 1<<20 {
		t.Errorf("yes with a 1 MiB cap: %+v, kept %d bytes; want timed out, truncated, exactly 1 MiB", st, len(out))
	}
	// The sandbox and the node are fine afterwards.
	if r := Exec(t, f, id, sh("echo ok")); r.Stdout != "ok\n" {
		t.Errorf("after yes: %q", r.Stdout)
	}
}

func testOffsets(t *testing.T, f *Fixture) {
	id := create(t, f, sandbox.Resources{})
	x := start(t, f, id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "for i in 1 2 3; do echo line$i; echo err$i >&2; done"}})
	wait(t, f, id, x)
	o, err := f.Backend.OpenOutput(ctxFor(t), id, x, sandbox.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	buf := make([]byte, 6)
	if n, _ := o.ReadAt(buf, 6); string(buf[:n]) != "line2\n" {
		t.Errorf("stdout from offset 6 = %q, want line2", buf[:n])
	}
	if got := readAll(t, f, id, x, sandbox.Stderr); got != "err1\nerr2\nerr3\n" {
		t.Errorf("stderr = %q", got)
	}
}

func testJournal(t *testing.T, f *Fixture) {
	id := create(t, f, sandbox.Resources{})
	a := start(t, f, id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "echo hi; exit 4"}})
	wait(t, f, id, a)
	b := start(t, f, id, sandbox.ExecSpec{Argv: []string{"sleep", "30"}})
	defer f.Backend.Signal(context.Background(), id, b, 9)
	execs, err := f.Backend.ListExecs(ctxFor(t), id)
	if err != nil {
		t.Fatalf("ListExecs = %v", err)
	}
	var seenA, seenB bool
	for _, e := range execs {
		switch e.ID {
		case a:
			seenA = e.Exit != nil && e.Exit.Code == 4 && !e.Running && e.StdoutBytes == 3 && e.Argv[0] == "/bin/sh"
		case b:
			seenB = e.Running && e.Exit == nil
		}
	}
	if !seenA || !seenB {
		t.Errorf("ListExecs = %+v; want %s ended with 4 (3 bytes out) and %s running", execs, a, b)
	}
}

// testStepKeys: an exec's step key is in the journal, and a second exec
// with it is refused with AlreadyExists naming the first, while the
// first runs and after it ended; other sandboxes are not affected.
func testStepKeys(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id, other := create(t, f, sandbox.Resources{}), create(t, f, sandbox.Resources{})
	long := start(t, f, id, sandbox.ExecSpec{Argv: []string{"sleep", "30"}, StepKey: "step/1"})
	defer f.Backend.Signal(context.Background(), id, long, 9)
	spec := sh("echo again")
	spec.ID, spec.StepKey = "again1", "step/1"
	if err := f.Backend.StartExec(ctx, id, spec); !errdefs.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), long) {
		t.Errorf("StartExec(step/1 while its exec runs) = %v, want AlreadyExists naming %s", err, long)
	}
	done := start(t, f, id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "exit 3"}, StepKey: "step/2"})
	wait(t, f, id, done)
	spec.ID, spec.StepKey = "again2", "step/2"
	if err := f.Backend.StartExec(ctx, id, spec); !errdefs.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), done) {
		t.Errorf("StartExec(step/2 after its exec ended) = %v, want AlreadyExists naming %s", err, done)
	}
	if r := Exec(t, f, other, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "exit 0"}, StepKey: "step/1"}); r.Code != 0 {
		t.Errorf("step/1 in another sandbox = %+v, want it run", r.ExitStatus)
	}
	execs, err := f.Backend.ListExecs(ctx, id)
	if err != nil {
		t.Fatalf("ListExecs = %v", err)
	}
	keys := map[string]string{}
	for _, e := range execs {
		keys[e.ID] = e.StepKey
	}
	if keys[long] != "step/1" || keys[done] != "step/2" || len(keys) != 2 {
		t.Errorf("ListExecs step keys = %v, want %s: step/1 and %s: step/2 only", keys, long, done)
	}
}

func testUnknownExec(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{})
	if _, err := f.Backend.WaitExec(ctx, id, "nope"); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("WaitExec(unknown) = %v, want NotFound", err)
	}
	if _, err := f.Backend.OpenOutput(ctx, id, "nope", sandbox.Stdout); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("OpenOutput(unknown) = %v, want NotFound", err)
	}
	if err := f.Backend.WriteStdin(ctx, id, "nope", []byte("x"), false); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("WriteStdin(unknown) = %v, want NotFound", err)
	}
	if err := f.Backend.Signal(ctx, id, "nope", 9); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Signal(unknown) = %v, want NotFound", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("condition not met within 5s")
}

// testSyscallPolicy checks the sandbox's seccomp policy reaches commands:
// new user namespaces and mounts are refused, ordinary work is not.
func testSyscallPolicy(t *testing.T, f *Fixture) {
	id := create(t, f, sandbox.Resources{})
	r := Exec(t, f, id, sh("unshare -U true; echo rc=$?; mount -t tmpfs x /mnt; echo rc=$?; echo a | cat | tr a b"))
	if !strings.Contains(r.Stdout, "rc=1\nrc=") || strings.Contains(r.Stdout, "rc=0") || !strings.HasSuffix(r.Stdout, "b\n") {
		t.Errorf("policy probe = %q (stderr %q); want unshare -U and mount refused, pipelines working", r.Stdout, r.Stderr)
	}
	r = Exec(t, f, id, sh("grep Seccomp: /proc/self/status"))
	if !strings.Contains(r.Stdout, "2") {
		t.Errorf("commands run without a seccomp filter: %q", r.Stdout)
	}
}
