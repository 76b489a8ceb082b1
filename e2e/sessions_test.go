package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// sessionResult is one session command's result over the API.
type sessionResult struct {
	execID         string
	stdout, stderr string
	exit           *sandboxv1.ExecExit
}

func sessionExec(ctx context.Context, t *testing.T, c sandboxv1connect.SandboxServiceClient, key, id, session, cmd string, timeout time.Duration) (sessionResult, error) {
	t.Helper()
	m := &sandboxv1.ExecRequest{SandboxId: id, Shell: cmd, Session: session}
	if timeout > 0 {
		m.Timeout = durationpb.New(timeout)
	}
	req := connect.NewRequest(m)
	req.Header().Set("Authorization", "Bearer "+key)
	s, err := c.Exec(ctx, req)
	if err != nil {
		return sessionResult{}, err
	}
	defer s.Close()
	var r sessionResult
	for s.Receive() {
		ev := s.Msg()
		switch {
		case ev.GetStarted() != nil:
			r.execID = ev.GetStarted().GetExecId()
		case ev.GetOutput() != nil:
			if ev.GetOutput().GetStream() == sandboxv1.Stream_STREAM_STDOUT {
				r.stdout += string(ev.GetOutput().GetData())
			} else {
				r.stderr += string(ev.GetOutput().GetData())
			}
		case ev.GetExit() != nil:
			r.exit = ev.GetExit()
		}
	}
	return r, s.Err()
}

// TestSessionsAcrossUpRestart: a session's shell lives in the keeper, so a
// restart of dsec up keeps it, state and background job; the API reports
// the session flags, lists sessions and ends them.
func TestSessionsAcrossUpRestart(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	key := p.AdminKey(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := p.Client(t, key).Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 96 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, "http://"+p.Addr)
	r, err := sessionExec(ctx, t, c, key, sb.ID, "main", "cd /tmp; export FOO=bar; sleep 300 & echo $! > bg; echo started", 0)
	if err != nil || r.exit == nil || r.exit.GetExitCode() != 0 || r.stdout != "started\n" || r.exit.GetSessionRestarted() {
		t.Fatalf("first command = %+v, %v", r, err)
	}
	// argv with a session is refused.
	req := connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.ID, Argv: []string{"true"}, Session: "main"})
	req.Header().Set("Authorization", "Bearer "+key)
	if s, err := c.Exec(ctx, req); err == nil {
		for s.Receive() {
		}
		err = s.Err()
		s.Close()
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("Exec(argv, session) = %v, want InvalidArgument", err)
		}
	}

	// A detached session command, attached to from an offset.
	dreq0 := connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.ID, Shell: "echo attach-me; sleep 0.5; echo done >&2", Session: "main", Detach: true})
	dreq0.Header().Set("Authorization", "Bearer "+key)
	ds, err := c.Exec(ctx, dreq0)
	if err != nil {
		t.Fatal(err)
	}
	var detached string
	for ds.Receive() {
		if st := ds.Msg().GetStarted(); st != nil {
			detached = st.GetExecId()
		}
	}
	ds.Close()
	areq := connect.NewRequest(&sandboxv1.AttachRequest{SandboxId: sb.ID, ExecId: detached, StdoutOffset: 3})
	areq.Header().Set("Authorization", "Bearer "+key)
	as, err := c.Attach(ctx, areq)
	if err != nil {
		t.Fatal(err)
	}
	var aout, aerr string
	var aexit *sandboxv1.ExecExit
	for as.Receive() {
		ev := as.Msg()
		if o := ev.GetOutput(); o != nil {
			if o.GetStream() == sandboxv1.Stream_STREAM_STDOUT {
				aout += string(o.GetData())
			} else {
				aerr += string(o.GetData())
			}
		}
		if x := ev.GetExit(); x != nil {
			aexit = x
		}
	}
	as.Close()
	if aout != "ach-me\n" || aerr != "done\n" || aexit == nil || aexit.GetExitCode() != 0 {
		t.Errorf("Attach(stdout from 3) to a session command = %q, %q, %v; want ach-me, done, exit 0", aout, aerr, aexit)
	}

	p.Stop(t)
	p.Start(t)

	r, err = sessionExec(ctx, t, c, key, sb.ID, "main", "pwd; echo $FOO; kill -0 $(cat bg) && echo bg-alive; exit 4", 0)
	if err != nil || r.exit == nil || r.exit.GetSessionRestarted() || r.stdout != "/tmp\nbar\nbg-alive\n" || !r.exit.GetSessionLost() || r.exit.GetExitCode() != 4 {
		t.Errorf("after a restart of dsec up = %+v, %v; want the state kept, then lost by exit 4", r, err)
	}
	r, err = sessionExec(ctx, t, c, key, sb.ID, "main", "sleep 30", 300*time.Millisecond)
	if err != nil || r.exit == nil || !r.exit.GetSessionRestarted() || !r.exit.GetTimedOut() || r.exit.GetSessionLost() {
		t.Errorf("a timed-out command of a new shell = %+v, %v", r, err)
	}
	lreq := connect.NewRequest(&sandboxv1.ListExecsRequest{SandboxId: sb.ID})
	lreq.Header().Set("Authorization", "Bearer "+key)
	execs, err := c.ListExecs(ctx, lreq)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, x := range execs.Msg.GetExecs() {
		if x.GetExecId() == r.execID {
			found = x.GetSession() == "main" && x.GetExit().GetTimedOut()
		}
	}
	if !found {
		t.Errorf("ListExecs has no exec %s of session main: %v", r.execID, execs.Msg.GetExecs())
	}
	sreq := connect.NewRequest(&sandboxv1.ListSessionsRequest{SandboxId: sb.ID})
	sreq.Header().Set("Authorization", "Bearer "+key)
	ss, err := c.ListSessions(ctx, sreq)
	if err != nil || len(ss.Msg.GetSessions()) != 1 || ss.Msg.GetSessions()[0].GetName() != "main" || ss.Msg.GetSessions()[0].GetShell() != "/bin/sh" {
		t.Errorf("ListSessions = %v, %v; want main in /bin/sh", ss, err)
	}
	dreq := connect.NewRequest(&sandboxv1.DeleteSessionRequest{SandboxId: sb.ID, Name: "main"})
	dreq.Header().Set("Authorization", "Bearer "+key)
	if _, err := c.DeleteSession(ctx, dreq); err != nil {
		t.Errorf("DeleteSession = %v", err)
	}
	if _, err := c.DeleteSession(ctx, dreq); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("DeleteSession again = %v, want NotFound", err)
	}
	if err := p.Client(t, key).Delete(ctx, sb.ID); err != nil {
		t.Error(err)
	}

	// The idle TTL: an open, idle session is not activity; a running
	// session command is.
	idle, err := p.Client(t, key).Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, IdleTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	busy, err := p.Client(t, key).Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, IdleTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := sessionExec(ctx, t, c, key, idle.ID, "s", "cd /tmp", 0); err != nil || r.exit.GetExitCode() != 0 {
		t.Fatalf("session command = %+v, %v", r, err)
	}
	dx := connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: busy.ID, Shell: "sleep 8", Session: "s", Detach: true})
	dx.Header().Set("Authorization", "Bearer "+key)
	if s, err := c.Exec(ctx, dx); err != nil {
		t.Fatal(err)
	} else {
		for s.Receive() {
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	// Polled with List, which is not use of a sandbox (Get is).
	gone := func(id string) bool {
		sbs, err := p.Client(t, key).List(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range sbs {
			if sb.ID == id {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(6 * time.Second)
	for !gone(idle.ID) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if !gone(idle.ID) {
		t.Errorf("a sandbox with an idle open session outlived its idle TTL")
	}
	if gone(busy.ID) {
		t.Errorf("a sandbox running a session command was reaped as idle")
	}
	_ = p.Client(t, key).Delete(ctx, busy.ID)
}
