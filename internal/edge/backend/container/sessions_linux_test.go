package container

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

// TestSessions runs shell sessions in a real sandbox (busybox: /bin/sh is
// its ash): the state they keep, the hostile commands, 20 at once, their
// deletion, and a keeper restart, which loses them, said so.
func TestSessions(t *testing.T) {
	n := newNode(t)
	b := n.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const id = "sess-real"
	if _, err := b.Create(ctx, sandbox.Spec{ID: id, Layers: n.layers, Resources: sandbox.Resources{MemoryBytes: 128 << 20, CPUs: 1, Pids: 256, DiskBytes: 64 << 20}}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	seq := 0
	run := func(be sandbox.Backend, name, cmd string, mod func(*sandbox.ExecSpec)) sandboxtest.Result {
		t.Helper()
		seq++
		spec := sandbox.ExecSpec{ID: fmt.Sprintf("%s-%d", name, seq), Argv: []string{cmd}, Session: name, Cwd: "/"}
		if mod != nil {
			mod(&spec)
		}
		r, err := sandboxtest.ExecErr(ctx, be, id, spec)
		if err != nil {
			t.Fatalf("session %s: %q: %v", name, cmd, err)
		}
		return r
	}
	r := run(b, "main", "cd /tmp && export FOO=bar; f() { echo \"f:$1\"; }; alias hi='echo hello'; echo one; echo two >&2; sleep 300 & echo $! > /tmp/bg", nil)
	if r.Code != 0 || r.Stdout != "one\n" || r.Stderr != "two\n" || r.SessionRestarted {
		t.Fatalf("first command = %+v", r)
	}
	r = run(b, "main", "pwd; echo $FOO; f x; hi; kill -0 $(cat /tmp/bg) && echo bg-alive; false", nil)
	if r.Code != 1 || r.Stdout != "/tmp\nbar\nf:x\nhello\nbg-alive\n" {
		t.Errorf("second command = %+v; want code 1 and the state kept", r)
	}
	r = run(b, "main", `printf '__dsec_end_00:0\n'; printf '__dsec_end_' >&2`, nil)
	if r.Code != 0 || r.Stdout != "__dsec_end_00:0\n" || r.Stderr != "__dsec_end_" {
		t.Errorf("marker-like output = %+v", r)
	}
	r = run(b, "main", "cat; read x; echo read=$?", nil)
	if r.Code != 0 || r.Stdout != "read=1\n" {
		t.Errorf("a command reading stdin = %+v", r)
	}
	r = run(b, "main", "tr a-z A-Z", func(s *sandbox.ExecSpec) { s.Stdin = []byte("abc\n") })
	if r.Code != 0 || r.Stdout != "ABC\n" {
		t.Errorf("a command with stdin = %+v", r)
	}
	r = run(b, "main", "yes | head -n 100000 | sleep 60", func(s *sandbox.ExecSpec) { s.Timeout = 300 * time.Millisecond })
	if !r.TimedOut || r.SessionLost {
		t.Errorf("a timed-out pipeline = %+v, want timed out, the session kept", r)
	}
	r = run(b, "main", "pwd; kill -0 $(cat /tmp/bg) && echo bg-alive", nil)
	if r.SessionRestarted || r.Stdout != "/tmp\nbg-alive\n" {
		t.Errorf("after the timed-out pipeline = %+v; want the state and the job kept", r)
	}
	start := time.Now()
	r = run(b, "main", "while :; do :; done", func(s *sandbox.ExecSpec) { s.Timeout = 200 * time.Millisecond })
	if !r.TimedOut || !r.SessionLost || time.Since(start) > 10*time.Second {
		t.Errorf("a busy loop with a timeout = %+v after %v; want timed out, session lost", r, time.Since(start))
	}
	r = run(b, "main", "pwd; echo ${FOO:-unset}; kill -0 $(cat /tmp/bg) 2>/dev/null || echo bg-gone", nil)
	if !r.SessionRestarted || r.Stdout != "/\nunset\nbg-gone\n" {
		t.Errorf("after a lost session = %+v; want a fresh shell, its job killed", r)
	}
	r = run(b, "main", "exec /bin/sh", nil)
	if !r.SessionLost {
		t.Errorf("exec /bin/sh = %+v, want session lost", r)
	}

	// 20 sessions at once.
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("c%d", i)
			r1, err1 := sandboxtest.ExecErr(ctx, b, id, sandbox.ExecSpec{ID: name + "-a", Argv: []string{fmt.Sprintf("X=%d; sleep 0.5", i)}, Session: name})
			r2, err2 := sandboxtest.ExecErr(ctx, b, id, sandbox.ExecSpec{ID: name + "-b", Argv: []string{"echo $X"}, Session: name})
			mu.Lock()
			defer mu.Unlock()
			if err1 != nil || err2 != nil || r1.Code != 0 || r2.Stdout != fmt.Sprintf("%d\n", i) {
				t.Errorf("session %s: %+v, %v; %+v, %v", name, r1, err1, r2, err2)
			}
		}()
	}
	wg.Wait()

	// DeleteSession kills the shell's tree, setsid's processes too.
	if err := b.StartExec(ctx, id, sandbox.ExecSpec{ID: "del-1", Argv: []string{"setsid sleep 300 & echo $! > /tmp/sid; sleep 300"}, Session: "del"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := b.StartExec(ctx, id, sandbox.ExecSpec{ID: "del-2", Argv: []string{"true"}, Session: "del"}); !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "del-1") {
		t.Errorf("a second command while one runs = %v, want refused naming del-1", err)
	}
	ss, err := b.ListSessions(ctx, id)
	if err != nil || len(ss) != 22 {
		t.Errorf("ListSessions = %d sessions, %v; want 22", len(ss), err)
	}
	if err := b.DeleteSession(ctx, id, "del"); err != nil {
		t.Fatal(err)
	}
	st, err := b.WaitExec(ctx, id, "del-1")
	if err != nil || !st.SessionLost {
		t.Errorf("the command of a deleted session = %+v, %v; want session lost", st, err)
	}
	if r, _ := sandboxtest.ExecErr(ctx, b, id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "grep -q '^State:.*[RSD]' /proc/$(cat /tmp/sid)/status 2>/dev/null && echo alive || echo gone"}}); r.Stdout != "gone\n" {
		t.Errorf("the setsid process of a deleted session: %q, want gone", r.Stdout)
	}
	if err := b.DeleteSession(ctx, id, "del"); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteSession again = %v, want NotFound", err)
	}
	execs, err := b.ListExecs(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range execs {
		if x.ID == "del-1" && x.Session != "del" {
			t.Errorf("ListExecs: del-1 has session %q, want del", x.Session)
		}
	}

	// A keeper restart loses the shells; the running command ends lost,
	// the next command says so.
	run(b, "kept", "cd /tmp", nil)
	if err := b.StartExec(ctx, id, sandbox.ExecSpec{ID: "kept-running", Argv: []string{"echo $$ > /tmp/kept-shell; sleep 300"}, Session: "kept"}); err != nil {
		t.Fatal(err)
	}
	v, _ := b.Keeper().Version(ctx)
	if err := b.Keeper().Shutdown(ctx, false); err != nil {
		t.Fatalf("keeper shutdown = %v", err)
	}
	waitGone(t, v.Pid)
	b.Close()
	b2 := n.open(t)
	defer b2.Close()
	if st, err := b2.WaitExec(ctx, id, "kept-running"); err != nil || !st.Lost || !st.SessionLost {
		t.Errorf("a session command across a keeper restart = %+v, %v; want lost, session lost", st, err)
	}
	r = run(b2, "kept", "pwd", nil)
	if !r.SessionRestarted || r.Stdout != "/\n" {
		t.Errorf("a session after a keeper restart = %+v, want restarted", r)
	}
	if r, _ := sandboxtest.ExecErr(ctx, b2, id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "sleep 0.2; grep -q '^State:.*[RSD]' /proc/$(cat /tmp/kept-shell)/status 2>/dev/null && echo alive || echo gone"}}); r.Stdout != "gone\n" {
		t.Errorf("the shell an earlier keeper ran: %q, want gone", r.Stdout)
	}
	if err := b2.Delete(ctx, id); err != nil {
		t.Errorf("Delete = %v", err)
	}
}
