package keeper

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// sessionRun runs cmd in session name and returns its exit and output.
func sessionRun(t *testing.T, c *Client, id, name, execID, cmd string, mod func(*ExecSpec)) (ExitStatus, string, string) {
	t.Helper()
	spec := ExecSpec{ID: execID, Argv: []string{cmd}, Session: name, Env: []string{"PATH=/usr/bin:/bin", "HOME=/"}}
	if mod != nil {
		mod(&spec)
	}
	st := execWait(t, c, id, spec)
	return st, readOutput(t, c, id, execID, Stdout), readOutput(t, c, id, execID, Stderr)
}

// TestSessionEngine runs the session engine on the fake driver, with the
// host's bash (the default, found at /bin/bash) and its /bin/sh.
func TestSessionEngine(t *testing.T) {
	_, _, c := newFakeKeeper(t, shortTempDir(t))
	ctx := context.Background()
	const id = "n-sess"
	if _, err := c.Create(ctx, CreateRequest{ID: id, Layers: []Layer{{Digest: "sha256:aa", Path: "/x"}}}); err != nil {
		t.Fatal(err)
	}
	for _, shell := range []string{"", "/bin/sh"} {
		t.Run("shell="+shell, func(t *testing.T) {
			name := "s" + strings.ReplaceAll(shell, "/", "_")
			n := 0
			run := func(cmd string, mod func(*ExecSpec)) (ExitStatus, string, string) {
				n++
				return sessionRun(t, c, id, name, fmt.Sprintf("%s-%d", name, n), cmd, func(s *ExecSpec) {
					s.SessionShell = shell
					if mod != nil {
						mod(s)
					}
				})
			}
			testSessionCases(t, c, id, name, run)
		})
	}
}

// testSessionCases are the cases of a session, shared by the keeper's
// tests and those of real sandboxes.
func testSessionCases(t *testing.T, c *Client, id, name string, run func(string, func(*ExecSpec)) (ExitStatus, string, string)) {
	t.Helper()
	st, out, errOut := run("cd /tmp && export FOO=bar; f() { echo \"f:$1\"; }; alias hi='echo hello'; echo one; echo two >&2; sleep 300 & echo $! > /tmp/.bg-"+name, nil)
	if st.Code != 0 || st.SessionRestarted || st.SessionLost || out != "one\n" || errOut != "two\n" {
		t.Fatalf("first command = %+v, %q, %q; want 0, one, two", st, out, errOut)
	}
	st, out, _ = run("pwd; echo $FOO; f x; hi; kill -0 $(cat /tmp/.bg-"+name+") && echo bg-alive; exit_code() { return 7; }; exit_code", nil)
	if st.Code != 7 || out != "/tmp\nbar\nf:x\nhello\nbg-alive\n" {
		t.Errorf("second command = %+v, %q; want code 7 and the state kept", st, out)
	}
	// Marker-like text, output without a final newline, no output.
	st, out, errOut = run(`printf '__dsec_end_0123:0\n'; printf '__dsec_end_'; printf 'x' >&2`, nil)
	if st.Code != 0 || out != "__dsec_end_0123:0\n__dsec_end_" || errOut != "x" {
		t.Errorf("marker-like output = %+v, %q, %q", st, out, errOut)
	}
	// A command line longer than a pipe's buffer; output past the cap.
	long := strings.Repeat("y", 300<<10)
	st, out, _ = run("x="+long+"; echo ${#x}", nil)
	if st.Code != 0 || out != fmt.Sprintf("%d\n", len(long)) {
		t.Errorf("a 300 KiB command line = %+v, %q", st, out)
	}
	st, out, _ = run("i=0; while [ $i -lt 2000 ]; do echo 0123456789; i=$((i+1)); done; echo tail", func(s *ExecSpec) { s.OutputLimit = 100 })
	if st.Code != 0 || !st.StdoutTruncated || len(out) != 100 {
		t.Errorf("output past the cap = %+v, %d bytes; want truncated at 100", st, len(out))
	}
	// stdin: empty unless given; a command reading it cannot eat the next.
	st, out, _ = run("cat; read x; echo read=$?", nil)
	if st.Code != 0 || out != "read=1\n" {
		t.Errorf("a command reading empty stdin = %+v, %q", st, out)
	}
	st, out, _ = run("cat; echo end", func(s *ExecSpec) { s.Stdin = []byte("line1\nline2\n") })
	if st.Code != 0 || out != "line1\nline2\nend\n" {
		t.Errorf("a command with stdin = %+v, %q", st, out)
	}
	// A syntax error, then the session still answers.
	st, _, _ = run("if then fi", nil)
	if st.Code == 0 || st.SessionLost {
		t.Errorf("a syntax error = %+v, want a failure, the session kept", st)
	}
	// A timeout in the middle of a pipeline: SIGINT ends it, the shell
	// lives on.
	st, _, _ = run("echo a | sleep 60 | cat", func(s *ExecSpec) { s.Timeout = 300 * time.Millisecond })
	if !st.TimedOut || st.SessionLost || st.Signal != int(syscall.SIGINT) || st.Code != 0 {
		t.Errorf("a timed-out pipeline = %+v, want timed out by SIGINT with no exit code (as a timed-out exec is by SIGKILL), the session kept", st)
	}
	st, out, _ = run("pwd", nil)
	if st.SessionRestarted || out != "/tmp\n" {
		t.Errorf("after the timed-out pipeline = %+v, %q; want the state kept", st, out)
	}
	// A busy loop in the shell itself ignores SIGINT (trapped): the grace
	// passes, the shell is killed.
	start := time.Now()
	st, _, _ = run("while :; do :; done", func(s *ExecSpec) { s.Timeout = 200 * time.Millisecond })
	if !st.TimedOut || !st.SessionLost || st.Signal != int(syscall.SIGKILL) || st.Code != 0 || time.Since(start) > 10*time.Second {
		t.Errorf("a busy loop with a timeout = %+v after %v, want timed out and session lost", st, time.Since(start))
	}
	st, out, _ = run("pwd; echo ${FOO:-unset}", nil)
	if !st.SessionRestarted || st.SessionLost || out == "/tmp\nbar\n" || !strings.HasSuffix(out, "\nunset\n") {
		t.Errorf("after a lost session = %+v, %q; want restarted in a fresh shell", st, out)
	}
	// exec bash (or sh): the new shell reads the command's /dev/null and
	// ends: the session is lost, said so.
	st, _, _ = run("exec "+shellOf(t, c, id, name), nil)
	if !st.SessionLost {
		t.Errorf("exec of a shell = %+v, want session lost", st)
	}
	st, out, _ = run("echo back; exit 5", nil)
	if !st.SessionRestarted || !st.SessionLost || st.Code != 5 || out != "back\n" {
		t.Errorf("exit 5 = %+v, %q; want restarted, then lost with code 5", st, out)
	}
	// A second command while one runs is refused, naming it.
	spec := ExecSpec{ID: name + "-long", Argv: []string{"sleep 60"}, Session: name, Env: []string{"PATH=/usr/bin:/bin"}}
	if err := c.StartExec(context.Background(), ExecRequest{Sandbox: id, Spec: spec}); err != nil {
		t.Fatal(err)
	}
	err := c.StartExec(context.Background(), ExecRequest{Sandbox: id, Spec: ExecSpec{ID: name + "-second", Argv: []string{"true"}, Session: name}})
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), name+"-long") {
		t.Errorf("a second command while one runs = %v, want refused naming %s-long", err, name)
	}
	ss, err := c.ListSessions(context.Background(), id)
	found := false
	for _, s := range ss {
		if s.Name == name {
			found = s.RunningExec == name+"-long" && s.Commands > 0 && s.Shell != ""
		}
	}
	if err != nil || !found {
		t.Errorf("ListSessions = %+v, %v; want %s running %s-long", ss, err, name, name)
	}
	// DeleteSession kills the shell tree: the running command ends lost.
	if err := c.DeleteSession(context.Background(), id, name); err != nil {
		t.Fatal(err)
	}
	st, err = c.WaitExec(context.Background(), id, name+"-long")
	if err != nil || !st.SessionLost {
		t.Errorf("the command of a deleted session = %+v, %v; want session lost", st, err)
	}
	if err := c.DeleteSession(context.Background(), id, name); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteSession again = %v, want NotFound", err)
	}
	st, _, _ = run("true", nil)
	if st.SessionRestarted || st.Code != 0 {
		t.Errorf("a new session of a deleted name = %+v, want a plain new one", st)
	}
	execs, _ := c.ListExecs(context.Background(), id)
	for _, x := range execs {
		if strings.HasPrefix(x.ID, name+"-") && x.Session != name {
			t.Errorf("journal entry %s has session %q, want %q", x.ID, x.Session, name)
		}
	}
}

func shellOf(t *testing.T, c *Client, id, name string) string {
	ss, _ := c.ListSessions(context.Background(), id)
	for _, s := range ss {
		if s.Name == name {
			return s.Shell
		}
	}
	t.Fatalf("no session %s", name)
	return ""
}

// TestSessionsConcurrent runs 20 sessions of one sandbox at once.
func TestSessionsConcurrent(t *testing.T) {
	_, _, c := newFakeKeeper(t, shortTempDir(t))
	const id = "n-sessc"
	if _, err := c.Create(context.Background(), CreateRequest{ID: id, Layers: []Layer{{Digest: "sha256:aa", Path: "/x"}}}); err != nil {
		t.Fatal(err)
	}
	testSessionsConcurrent(t, c, id)
}

func testSessionsConcurrent(t *testing.T, c *Client, id string) {
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("c%d", i)
			st, out, _ := sessionRun(t, c, id, name, name+"-1", fmt.Sprintf("X=%d; sleep 0.3", i), nil)
			if st.Code != 0 || out != "" {
				t.Errorf("session %s: %+v %q", name, st, out)
			}
			st, out, _ = sessionRun(t, c, id, name, name+"-2", "echo $X", nil)
			if st.Code != 0 || out != fmt.Sprintf("%d\n", i) {
				t.Errorf("session %s: %+v %q", name, st, out)
			}
		}()
	}
	wg.Wait()
}

// TestSessionFeedSplits feeds a shell's output to a command split at every
// point: the output is the same and the marker is found once, whatever the
// chunks, and text that only looks like the marker is output.
func TestSessionFeedSplits(t *testing.T) {
	const m = "__dsec_end_abc:"
	in := "out __dsec_end_ab __dsec_end_abd:1\n__dsec_end_" + m + "42\nlater"
	want := "out __dsec_end_ab __dsec_end_abd:1\n__dsec_end_"
	for split := 0; split <= len(in); split++ {
		dir := t.TempDir()
		var outs [2]*os.File
		for i := range outs {
			f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			outs[i] = f
		}
		c := &sessionCmd{id: "x", marker: []byte(m), outs: outs, limit: 1 << 20, take: func(n int64) int64 { return n }, finished: make(chan struct{})}
		s := &session{cur: c}
		s.feed(0, []byte(in[:split]))
		s.feed(0, []byte(in[split:]))
		s.feed(1, []byte(m+"\n"))
		got, _ := os.ReadFile(filepath.Join(dir, "0"))
		select {
		case <-c.finished:
		default:
			t.Fatalf("split %d: no end found", split)
		}
		if string(got) != want || c.status != 42 {
			t.Fatalf("split %d: output %q status %d; want %q, 42", split, got, c.status, want)
		}
	}
}

// FuzzSessionFeed feeds a command's output (what the sandbox writes, so
// anything) in two chunks, then the end marker: the command's output is
// exactly what it wrote, and the end is found once.
func FuzzSessionFeed(f *testing.F) {
	f.Add([]byte("plain\n"), 3)
	f.Add([]byte("__dsec_end_"), 5)
	f.Add([]byte("__dsec_end_0:1\n__dsec_end_"), 11)
	const m = "__dsec_end_5f3a:"
	f.Fuzz(func(t *testing.T, data []byte, split int) {
		if bytes.Contains(data, []byte(m)) {
			t.Skip() // the nonce, which the sandbox does not know
		}
		split = min(max(split, 0), len(data))
		dir := t.TempDir()
		var outs [2]*os.File
		for i := range outs {
			f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			outs[i] = f
		}
		c := &sessionCmd{id: "x", marker: []byte(m), outs: outs, limit: 1 << 20, take: func(n int64) int64 { return n }, finished: make(chan struct{})}
		s := &session{cur: c}
		s.feed(0, data[:split])
		s.feed(0, append(append([]byte{}, data[split:]...), m+"7\n"...))
		s.feed(1, []byte(m+"\n"))
		select {
		case <-c.finished:
		default:
			t.Fatalf("no end found after %q", data)
		}
		got, _ := os.ReadFile(filepath.Join(dir, "0"))
		if !bytes.Equal(got, data) || c.status != 7 {
			t.Fatalf("output %q status %d; want %q, 7", got, c.status, data)
		}
	})
}
