package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestGrading drives shell sessions, sealed execs and GradeFrom (issue 12)
// through the Go SDK and the CLI of one dsec up.
func TestGrading(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	t.Run("SDKSessions", func(t *testing.T) { testSDKSessions(t, c) })
	t.Run("CLISessions", func(t *testing.T) { testCLISessions(t, p) })
	t.Run("Sealed", func(t *testing.T) { testSealed(t, p, c) })
	t.Run("GradeFrom", func(t *testing.T) { testGradeFrom(t, p, c) })
	t.Run("NothingLeft", func(t *testing.T) {
		if left := p.Footprint(); len(left) > 0 {
			t.Errorf("after the tests deleted their sandboxes, left: %v", left)
		}
	})
}

// newSandbox creates a busybox sandbox deleted when the test ends.
func newSandbox(t *testing.T, c *dsec.Client, job string) *dsec.Sandbox {
	t.Helper()
	sb, err := c.Create(ctxT(t), dsec.CreateOptions{Image: "busybox", Memory: 128 << 20, Labels: map[string]string{"job": job}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Delete(ctx); err != nil && !errors.Is(err, dsec.ErrNotFound) {
			t.Errorf("delete sandbox %s: %v", sb.ID, err)
		}
	})
	return sb
}

// run runs cmdline in ss and fails the test when the call fails.
func run(t *testing.T, ss *dsec.Session, cmdline string, opts ...dsec.ExecOption) *dsec.ExecResult {
	t.Helper()
	r, err := ss.Run(ctxT(t), cmdline, opts...)
	if err != nil {
		t.Fatalf("session %s: Run(%q): %v", ss.Name, cmdline, err)
	}
	return r
}

func testSDKSessions(t *testing.T, c *dsec.Client) {
	ctx := ctxT(t)
	sb := newSandbox(t, c, "sessions")
	ss := sb.Session("main")

	// State carries over: cwd, environment, functions, aliases, a
	// background job.
	r := run(t, ss, `mkdir -p /tmp/w && cd /tmp/w && export FOO=bar && greet() { echo "hi $1"; } && alias ll='echo aliased'; sleep 60 & echo $! > /tmp/bgpid`)
	if r.ExitCode != 0 || r.SessionLost || r.SessionRestarted {
		t.Fatalf("first command = %+v, stderr %q", r.ExitStatus, r.Stderr)
	}
	first := r.ExecID
	r = run(t, ss, "pwd; echo $FOO; greet you; ll; kill -0 $(cat /tmp/bgpid) && echo job alive")
	if got := string(r.Stdout); got != "/tmp/w\nbar\nhi you\naliased\njob alive\n" || r.ExitCode != 0 {
		t.Errorf("second command = %q (stderr %q, exit %d); want cwd, env, function, alias and job kept", got, r.Stderr, r.ExitCode)
	}
	if r.ExecID == "" || r.ExecID == first {
		t.Errorf("commands of a session have exec IDs %q and %q, want two", first, r.ExecID)
	}

	// Exit codes and streams per command; state survives a failure.
	r = run(t, ss, "echo out; echo err >&2; (exit 5)")
	if string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" || r.ExitCode != 5 {
		t.Errorf("failing command = stdout %q stderr %q exit %d; want out, err, 5", r.Stdout, r.Stderr, r.ExitCode)
	}
	if r = run(t, ss, "false"); r.ExitCode != 1 {
		t.Errorf("false in a session exited %d, want 1", r.ExitCode)
	}
	if r = run(t, ss, "pwd"); string(r.Stdout) != "/tmp/w\n" || r.ExitCode != 0 {
		t.Errorf("pwd after failures = %q, exit %d", r.Stdout, r.ExitCode)
	}

	// The hostile cases: output that looks like a boundary, a command
	// reading stdin (it gets none), and a new shell exec'd in place.
	r = run(t, ss, `printf '__DSEC_END__ 0\n\033]0;x\a'; echo; echo done`)
	if !strings.HasSuffix(string(r.Stdout), "\ndone\n") || r.ExitCode != 0 {
		t.Errorf("marker-like output = %q, exit %d", r.Stdout, r.ExitCode)
	}
	r = run(t, ss, "cat; echo read $?", dsec.WithTimeout(20*time.Second))
	if string(r.Stdout) != "read 0\n" || r.TimedOut {
		t.Errorf("a command reading stdin = %q, %+v; want an empty input", r.Stdout, r.ExitStatus)
	}
	if r = run(t, ss, "echo $FOO"); string(r.Stdout) != "bar\n" {
		t.Errorf("after the stdin reader, FOO = %q", r.Stdout)
	}

	// A timeout interrupts the command; either the shell survives with its
	// state, or the result says it was lost and the next one says it is
	// new. Never silently replaced.
	for _, cmdline := range []string{"sleep 30 | cat", "while :; do :; done"} {
		r = run(t, ss, cmdline, dsec.WithTimeout(500*time.Millisecond))
		if !r.TimedOut {
			t.Errorf("%q with a 500ms timeout = %+v, want TimedOut", cmdline, r.ExitStatus)
		}
		next := run(t, ss, "echo ${FOO:-unset}; pwd")
		switch {
		case r.SessionLost && !next.SessionRestarted:
			t.Errorf("after %q lost the shell, the next command = %+v, want SessionRestarted", cmdline, next.ExitStatus)
		case !r.SessionLost && (next.SessionRestarted || string(next.Stdout) != "bar\n/tmp/w\n"):
			t.Errorf("after %q kept its shell, the next command = %q, %+v; want the state kept", cmdline, next.Stdout, next.ExitStatus)
		case r.SessionLost:
			// Back to the state the rest of the test expects.
			run(t, ss, "mkdir -p /tmp/w && cd /tmp/w && export FOO=bar")
		}
	}

	// exec bash (sh here) replaces the shell; the session must still end
	// this command and run the next.
	r = run(t, ss, "exec sh", dsec.WithTimeout(20*time.Second))
	if r.TimedOut {
		t.Errorf("exec sh in a session timed out: %+v", r.ExitStatus)
	}
	if next := run(t, ss, "echo after"); string(next.Stdout) != "after\n" || next.ExitCode != 0 {
		t.Errorf("after exec sh, a command = %q, %+v", next.Stdout, next.ExitStatus)
	}

	// One command at a time per session.
	proc, err := ss.Start(ctx, "sleep 3")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if _, err := ss.Run(ctx, "true"); !errors.Is(err, dsec.ErrFailedPrecondition) {
		t.Errorf("Run while the session runs a command = %v, want ErrFailedPrecondition", err)
	}
	infos, err := sb.ListSessions(ctx)
	if err != nil {
		t.Fatalf("ListSessions: %v", err)
	}
	if len(infos) != 1 || infos[0].Name != "main" || infos[0].RunningExecID != proc.ID || infos[0].Commands < 1 || infos[0].Shell == "" {
		t.Errorf("ListSessions while a command runs = %+v, want main running %s", infos, proc.ID)
	}
	if st, err := proc.Wait(nil, nil); err != nil || st.ExitCode != 0 {
		t.Errorf("the sleep ended %+v, %v", st, err)
	}
	proc.Close()

	// Sessions of one sandbox run concurrently and keep apart.
	const n = 8
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			s := sb.Session(fmt.Sprintf("s%d", i))
			if r, err := s.Run(ctx, fmt.Sprintf("export N=%d; cd /; sleep 1", i)); err != nil || r.ExitCode != 0 {
				t.Errorf("session s%d: %+v, %v", i, r, err)
				return
			}
			if r, err := s.Run(ctx, "echo $N$FOO"); err != nil || string(r.Stdout) != fmt.Sprintf("%d\n", i) {
				t.Errorf("session s%d: second command = %+v, %v; want its own N and no FOO", i, r, err)
			}
		})
	}
	wg.Wait()
	if d := time.Since(start); d > 6*time.Second {
		t.Errorf("%d sessions sleeping 1s each took %v: they did not run concurrently", n, d)
	}
	if infos, err = sb.ListSessions(ctx); err != nil || len(infos) != n+1 {
		t.Errorf("ListSessions = %d sessions, %v; want %d", len(infos), err, n+1)
	}

	// Deleting a session kills its processes; a new one starts fresh.
	if r = run(t, ss, "sleep 60 & echo $! > /tmp/bgpid; kill -0 $(cat /tmp/bgpid) && echo alive"); string(r.Stdout) != "alive\n" {
		t.Errorf("a background job = %q", r.Stdout)
	}
	if err := ss.Delete(ctx); err != nil {
		t.Fatalf("Session.Delete: %v", err)
	}
	if err := sb.DeleteSession(ctx, "main"); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("DeleteSession of a deleted session = %v, want ErrNotFound", err)
	}
	r, err = sb.Shell(ctx, "sleep 0.5; kill -0 $(cat /tmp/bgpid) 2>/dev/null && echo alive || echo gone")
	if err != nil || string(r.Stdout) != "gone\n" {
		t.Errorf("the deleted session's background job: %q, %v; want it killed", r.Stdout, err)
	}
	if r = run(t, ss, "echo ${FOO:-unset}"); string(r.Stdout) != "unset\n" {
		t.Errorf("a new session after the delete has FOO = %q", r.Stdout)
	}

	// The journal says which commands ran in which session.
	execs, err := sb.ListExecs(ctx)
	if err != nil {
		t.Fatalf("ListExecs: %v", err)
	}
	inMain := 0
	for _, e := range execs {
		if e.Session == "main" {
			inMain++
		}
	}
	if inMain < 10 {
		t.Errorf("the journal has %d commands of session main, want every one", inMain)
	}

	// What the server refuses.
	if _, err := sb.Exec(ctx, []string{"true"}, func(r *dsec.ExecRequest) { r.Session = "main" }); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("argv in a session = %v, want ErrInvalidArgument", err)
	}
	if _, err := c.Sandbox("e2e-aaaaaaaaaaaa").ListSessions(ctx); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("ListSessions of an unknown sandbox = %v, want ErrNotFound", err)
	}
}

func testCLISessions(t *testing.T, p *platform) {
	out, _, code := p.CLI(t, "", "run", "-d", "--memory", "64M", "--label", "job=cli-sessions", "busybox")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("dsec run -d = %q, exit %d", out, code)
	}
	t.Cleanup(func() { p.CLI(t, "", "rm", id) })

	// The words after -- are one shell line.
	if _, errOut, code := p.CLI(t, "", "exec", "--session", "main", id, "--", "cd /tmp &&", "export FOO=bar"); code != 0 {
		t.Fatalf("exec --session = exit %d: %s", code, errOut)
	}
	out, errOut, code := p.CLI(t, "", "exec", "--session", "main", id, "--", "pwd; echo $FOO; echo e >&2; (exit 3)")
	if out != "/tmp\nbar\n" || errOut != "e\n" || code != 3 {
		t.Errorf("exec --session = %q, %q, exit %d; want /tmp and bar, e, 3", out, errOut, code)
	}
	out, _, code = p.CLI(t, "", "exec", "--session", "other", "--shell", "/bin/sh", id, "--", "echo ${FOO:-unset}")
	if out != "unset\n" || code != 0 {
		t.Errorf("a second session = %q, exit %d; want its own environment", out, code)
	}
	out, _, code = p.CLI(t, "", "session", "ls", id)
	if code != 0 || !strings.Contains(out, "main") || !strings.Contains(out, "other") || !strings.Contains(out, "/bin/sh") {
		t.Errorf("session ls = %q, exit %d", out, code)
	}
	if _, errOut, code := p.CLI(t, "", "session", "rm", id, "main"); code != 0 {
		t.Errorf("session rm = exit %d: %s", code, errOut)
	}
	if _, errOut, code := p.CLI(t, "", "session", "rm", id, "main"); code != 125 || !strings.Contains(errOut, "main") {
		t.Errorf("session rm of a removed session = exit %d, %q; want 125 naming it", code, errOut)
	}
	out, _, _ = p.CLI(t, "", "session", "ls", id)
	if strings.Contains(out, "main") || !strings.Contains(out, "other") {
		t.Errorf("session ls after rm = %q", out)
	}
	// A timeout whose command does not stop: dsec says what became of the
	// shell, and the next command says so too.
	_, errOut, code = p.CLI(t, "", "exec", "--session", "other", "--timeout", "300ms", id, "--", "trap '' INT; while :; do :; done")
	if code != 124 {
		t.Errorf("exec --session --timeout = exit %d (%s), want 124", code, errOut)
	}
	if !strings.Contains(errOut, "the session's shell was lost") {
		t.Errorf("a command that ignored the interrupt and timed out: stderr %q, want the lost-shell note", errOut)
	}
	_, errOut, code = p.CLI(t, "", "exec", "--session", "other", id, "--", "true")
	if code != 0 || !strings.Contains(errOut, "ran in a new shell") {
		t.Errorf("the next command = exit %d, stderr %q; want the new-shell note", code, errOut)
	}
}

func testSealed(t *testing.T, p *platform, c *dsec.Client) {
	ctx := ctxT(t)
	sb := newSandbox(t, c, "sealed")
	// An agent's service: a counter that runs on.
	if _, err := sb.ExecDetached(ctx, dsec.ExecRequest{Shell: "i=0; while :; do i=$((i+1)); echo $i > /count.new && mv /count.new /count; sleep 0.05; done"}); err != nil {
		t.Fatalf("ExecDetached: %v", err)
	}
	time.Sleep(300 * time.Millisecond)

	// While a sealed command runs the service is frozen.
	r, err := sb.Exec(ctx, []string{"sh", "-c", "a=$(cat /count); sleep 0.5; b=$(cat /count); echo $a $b; echo $PATH; if test -d /.dsec/image; then echo image; else echo no-image; fi"},
		dsec.WithSealed(dsec.SealFreeze))
	if err != nil {
		t.Fatalf("sealed Exec: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(r.Stdout)), "\n")
	if !r.Sealed || r.ExitCode != 0 || len(lines) != 3 {
		t.Fatalf("sealed Exec = %+v, stdout %q, stderr %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
	if f := strings.Fields(lines[0]); len(f) != 2 || f[0] != f[1] || f[0] == "" {
		t.Errorf("the counter moved while the sealed command ran: %q", lines[0])
	}
	if !strings.HasPrefix(lines[1], "/.dsec/bin") || lines[2] != "image" {
		t.Errorf("a sealed command's PATH = %q, /.dsec/image: %q; want the platform's tools first and the image's layers", lines[1], lines[2])
	}
	// ...and runs again afterwards.
	r1, _ := sb.Exec(ctx, []string{"cat", "/count"})
	time.Sleep(400 * time.Millisecond)
	r2, _ := sb.Exec(ctx, []string{"cat", "/count"})
	if r1 == nil || r2 == nil || string(r1.Stdout) == string(r2.Stdout) {
		t.Errorf("after the sealed command the counter did not run again: %v then %v", r1, r2)
	}
	// An unsealed exec says it was not sealed.
	if r, err := sb.Exec(ctx, []string{"true"}); err != nil || r.Sealed {
		t.Errorf("plain Exec = %+v, %v; want Sealed false", r, err)
	}
	// The journal knows.
	execs, err := sb.ListExecs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sealed := 0
	for _, e := range execs {
		if e.Sealed {
			sealed++
		}
	}
	if sealed != 1 {
		t.Errorf("the journal has %d sealed commands, want 1", sealed)
	}

	// The CLI: --sealed=kill ends the service for good.
	_, errOut, code := p.CLI(t, "", "exec", "--sealed=kill", sb.ID, "--", "sh", "-c", "test -s /count")
	if code != 0 {
		t.Fatalf("exec --sealed=kill = exit %d: %s", code, errOut)
	}
	r1, _ = sb.Exec(ctx, []string{"cat", "/count"})
	time.Sleep(400 * time.Millisecond)
	r2, _ = sb.Exec(ctx, []string{"cat", "/count"})
	if r1 == nil || r2 == nil || string(r1.Stdout) != string(r2.Stdout) {
		t.Errorf("after --sealed=kill the counter runs on: %v then %v", r1, r2)
	}
	out, _, code := p.CLI(t, "", "exec", "--sealed", sb.ID, "--", "sh", "-c", "echo honest; exit 6")
	if out != "honest\n" || code != 6 {
		t.Errorf("exec --sealed = %q, exit %d; want honest, 6", out, code)
	}
}

func testGradeFrom(t *testing.T, p *platform, c *dsec.Client) {
	ctx := ctxT(t)
	sb := newSandbox(t, c, "grade")
	setup := `mkdir -p /workspace/ans/sub && echo 42 > /workspace/ans/a.txt && echo deep > /workspace/ans/sub/b.txt &&
echo NOT-COPIED > /workspace/other.txt && echo AGENT-SECRET > /etc/shadow && echo tampered > /etc/grader-note`
	if r, err := sb.Shell(ctx, setup); err != nil || r.ExitCode != 0 {
		t.Fatalf("setup: %+v, %v", r, err)
	}
	res, err := sb.GradeFrom(ctx, []string{"/workspace/ans"}, nil, dsec.GradeOptions{
		Shell: "cat /workspace/ans/a.txt /workspace/ans/sub/b.txt; cat /workspace/other.txt /etc/grader-note 2>/dev/null; hostname; exit 3"})
	if err != nil {
		t.Fatalf("GradeFrom: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	if len(lines) != 3 || lines[0] != "42" || lines[1] != "deep" || res.ExitCode != 3 {
		t.Errorf("GradeFrom = stdout %q, stderr %q, %+v; want the copied files alone and exit 3", res.Stdout, res.Stderr, res.ExitStatus)
	}
	if res.GraderSandboxID == "" || res.GraderSandboxID == sb.ID || (len(lines) == 3 && lines[2] == sb.ID) {
		t.Errorf("the grade ran in %q (hostname %v), want a sandbox other than %s", res.GraderSandboxID, lines, sb.ID)
	}
	if res.CopiedFiles < 2 || res.CopiedBytes < int64(len("42\ndeep\n")) {
		t.Errorf("GradeFrom copied %d files, %d bytes; want the 2 files' %d bytes at least", res.CopiedFiles, res.CopiedBytes, len("42\ndeep\n"))
	}
	// The grading sandbox is gone; the graded one is unchanged.
	if _, err := c.Get(ctx, res.GraderSandboxID); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("Get of the grading sandbox after the grade = %v, want ErrNotFound", err)
	}
	all, err := c.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.ID == res.GraderSandboxID {
			t.Errorf("the grading sandbox %s is still listed", s.ID)
		}
	}
	if r, err := sb.Exec(ctx, []string{"cat", "/workspace/ans/a.txt"}); err != nil || string(r.Stdout) != "42\n" {
		t.Errorf("the graded sandbox's file after the grade = %v, %v", r, err)
	}

	// Links out of the copied tree bring nothing else in: copied as links
	// (resolved in the grading sandbox) or refused, never followed.
	links := "ln -s /etc/shadow /workspace/ans/shadow && ln -s .. /workspace/ans/up && ln -s /workspace/other.txt /workspace/ans/other"
	if r, err := sb.Shell(ctx, links); err != nil || r.ExitCode != 0 {
		t.Fatalf("links: %+v, %v", r, err)
	}
	for _, paths := range [][]string{{"/workspace/ans"}, {"/workspace/ans/up"}, {"/workspace/ans/shadow"}} {
		res, err = sb.GradeFrom(ctx, paths, []string{"sh", "-c",
			"cat /workspace/ans/shadow /workspace/ans/up/other.txt /workspace/ans/other /etc/shadow 2>&1; ls -laR /workspace 2>&1; true"}, dsec.GradeOptions{})
		if err != nil {
			if !errors.Is(err, dsec.ErrFailedPrecondition) && !errors.Is(err, dsec.ErrInvalidArgument) {
				t.Errorf("GradeFrom of %v with links = %v, want them copied as links or refused with FailedPrecondition or InvalidArgument", paths, err)
			}
			continue
		}
		if s := string(res.Stdout) + string(res.Stderr); strings.Contains(s, "AGENT-SECRET") || strings.Contains(s, "NOT-COPIED") {
			t.Errorf("GradeFrom of %v: a link brought the graded sandbox's files into the grade:\n%s", paths, s)
		}
		if _, err := c.Get(ctx, res.GraderSandboxID); !errors.Is(err, dsec.ErrNotFound) {
			t.Errorf("Get of the grading sandbox of %v = %v, want ErrNotFound", paths, err)
		}
	}

	// The CLI: the command's output and exit code; nothing left.
	before, _, _ := p.CLI(t, "", "ps", "-q")
	out, errOut, code := p.CLI(t, "", "grade", sb.ID, "--copy", "/workspace/ans/a.txt", "--timeout", "1m", "--", "sh", "-c", "cat /workspace/ans/a.txt; echo e >&2; exit 4")
	if out != "42\n" || errOut != "e\n" || code != 4 {
		t.Errorf("dsec grade = %q, %q, exit %d; want 42, e, 4", out, errOut, code)
	}
	after, _, _ := p.CLI(t, "", "ps", "-q")
	if before != after {
		t.Errorf("dsec ps before the grade %q, after %q: the grading sandbox is left", before, after)
	}
	// A path the sandbox lacks is refused, or brings nothing.
	if _, errOut, code := p.CLI(t, "", "grade", sb.ID, "--copy", "/workspace/none", "--", "sh", "-c", "test ! -e /workspace/none"); code != 0 && (code != 125 || errOut == "") {
		t.Errorf("dsec grade of a missing path = exit %d, %q; want 125 with why, or nothing copied", code, errOut)
	}
	after, _, _ = p.CLI(t, "", "ps", "-q")
	if before != after {
		t.Errorf("dsec ps before the grades %q, after %q: a grading sandbox is left", before, after)
	}
}
