package dsec

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

func exitWith(e *sandboxv1.ExecExit) *sandboxv1.ExecResponse {
	return &sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Exit{Exit: e}}
}

func TestSessionRun(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb := c.Sandbox("sb-a")
	ss := sb.Session("main")
	ss.Shell = "/bin/sh"
	f.setExec(play(nil,
		startedEvent("ex-s1"),
		outEvent(stdoutS, 0, "/tmp\n"),
		outEvent(stderrS, 0, "note\n"),
		exitWith(&sandboxv1.ExecExit{ExitCode: 7, SessionRestarted: true, Duration: durationpb.New(time.Second)}),
	))
	res, err := ss.Run(t.Context(), "cd /tmp && pwd", WithTimeout(5*time.Second), WithEnv(map[string]string{"A": "1"}))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := &ExecResult{ExitStatus: ExitStatus{ExecID: "ex-s1", ExitCode: 7, SessionRestarted: true, Duration: time.Second},
		Stdout: []byte("/tmp\n"), Stderr: []byte("note\n")}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("Run (-want +got):\n%s", diff)
	}
	wantReq := &sandboxv1.ExecRequest{SandboxId: "sb-a", Shell: "cd /tmp && pwd", Session: "main", SessionShell: "/bin/sh",
		Env: map[string]string{"A": "1"}, Timeout: durationpb.New(5 * time.Second)}
	if diff := cmp.Diff(wantReq, f.execReq(0), protocmp.Transform()); diff != "" {
		t.Errorf("ExecRequest (-want +got):\n%s", diff)
	}

	// A timeout whose grace period passed: the shell is gone.
	f.setExec(play(nil, startedEvent("ex-s2"), exitWith(&sandboxv1.ExecExit{TimedOut: true, SessionLost: true})))
	res, err = sb.Session("main").Run(t.Context(), "sleep 100")
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !res.SessionLost || !res.TimedOut || res.SessionRestarted || res.Code() != 124 {
		t.Errorf("Run of a command that lost its shell = %+v, want SessionLost, TimedOut, code 124", res.ExitStatus)
	}

	// Start: the same request, streamed.
	f.setExec(play(nil, startedEvent("ex-s3"), outEvent(stdoutS, 0, "x"), exitEvent(0)))
	p, err := sb.Session("w-2.b_c").Start(t.Context(), "echo x")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	var out strings.Builder
	if st, err := p.Wait(&out, nil); err != nil || st.ExecID != "ex-s3" || out.String() != "x" {
		t.Errorf("Start's Wait = %+v, %v, output %q; want ex-s3 exiting 0 with x", st, err, out.String())
	}
	p.Close()
	if got := f.execReq(2); got.GetSession() != "w-2.b_c" || got.GetShell() != "echo x" || got.GetSessionShell() != "" {
		t.Errorf("Start sent %v, want the shell line in session w-2.b_c", got)
	}
}

func TestSessionErrors(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb := c.Sandbox("sb-a")

	// The server's refusals keep their kinds: a busy session is Aborted
	// (or FailedPrecondition), both ErrFailedPrecondition.
	for code, kind := range map[connect.Code]error{
		connect.CodeAborted:            ErrFailedPrecondition,
		connect.CodeFailedPrecondition: ErrFailedPrecondition,
		connect.CodeNotFound:           ErrNotFound,
	} {
		f.setExec(play(connect.NewError(code, errors.New("session main of sandbox sb-a is running exec ex-1: wait for it"))))
		_, err := sb.Session("main").Run(t.Context(), "true")
		if !errors.Is(err, kind) || !strings.Contains(err.Error(), "wait for it") {
			t.Errorf("Run answered %v = %v, want %v with the server's message", code, err, kind)
		}
	}
	sent := len(f.execReqs)

	for name, req := range map[string]ExecRequest{
		"empty name":           {Shell: "true", Session: ""},
		"long name":            {Shell: "true", Session: strings.Repeat("a", 65)},
		"slash in name":        {Shell: "true", Session: "a/b"},
		"space in name":        {Shell: "true", Session: "a b"},
		"argv in a session":    {Argv: []string{"ls"}, Session: "main"},
		"shell without a name": {Shell: "true", SessionShell: "/bin/bash"},
		"bad seal":             {Shell: "true", Sealed: Seal(3)},
		"negative seal":        {Shell: "true", Sealed: Seal(-1)},
	} {
		if name == "empty name" {
			if _, err := sb.Session("").Run(t.Context(), "true"); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("Session(\"\").Run = %v, want ErrInvalidArgument", err)
			}
			continue
		}
		if _, err := sb.ExecStream(t.Context(), req, nil, nil); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: ExecStream(%+v) = %v, want ErrInvalidArgument", name, req, err)
		}
	}
	if err := sb.DeleteSession(t.Context(), "../x"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("DeleteSession(../x) = %v, want ErrInvalidArgument", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.execReqs) != sent {
		t.Errorf("refused requests reached the server: %v", f.execReqs[sent:])
	}
}

func TestSealedExec(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb := c.Sandbox("sb-a")
	f.setExec(play(nil, startedEvent("ex-1"), outEvent(stdoutS, 0, "ok"), exitWith(&sandboxv1.ExecExit{Sealed: true})))
	for i, tc := range []struct {
		opts []ExecOption
		want sandboxv1.Seal
	}{
		{[]ExecOption{WithSealed(SealFreeze)}, sandboxv1.Seal_SEAL_FREEZE},
		{[]ExecOption{WithSealed(SealKill)}, sandboxv1.Seal_SEAL_KILL},
		{nil, sandboxv1.Seal_SEAL_UNSPECIFIED},
	} {
		res, err := sb.Exec(t.Context(), []string{"/.dsec/bin/sh", "-c", "true"}, tc.opts...)
		if err != nil {
			t.Fatalf("Exec: %v", err)
		}
		if !res.Sealed || string(res.Stdout) != "ok" {
			t.Errorf("Exec = %+v, want Sealed from the exit", res)
		}
		if got := f.execReq(i).GetSealed(); got != tc.want {
			t.Errorf("Exec %d sent sealed %v, want %v", i, got, tc.want)
		}
	}
	if SealFreeze.String() != "freeze" || SealKill.String() != "kill" || SealNone.String() != "none" {
		t.Errorf("Seal names: %v %v %v", SealNone, SealFreeze, SealKill)
	}

	// The journal says which commands ran sealed or in a session.
	f.mu.Lock()
	f.execInfos = []*sandboxv1.ExecInfo{
		{ExecId: "ex-1", Argv: []string{"true"}, Sealed: true, Exit: &sandboxv1.ExecExit{Sealed: true}},
		{ExecId: "ex-2", Argv: []string{"/bin/bash"}, Session: "main", Exit: &sandboxv1.ExecExit{SessionLost: true}},
	}
	f.mu.Unlock()
	execs, err := sb.ListExecs(t.Context())
	if err != nil {
		t.Fatalf("ListExecs: %v", err)
	}
	if len(execs) != 2 || !execs[0].Sealed || !execs[0].Exit.Sealed || execs[1].Session != "main" || !execs[1].Exit.SessionLost {
		t.Errorf("ListExecs = %+v, want the sealed and session fields", execs)
	}
}

func TestListAndDeleteSessions(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb, err := c.Create(t.Context(), CreateOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.sessions = []*sandboxv1.Session{
		{Name: "a", Shell: "/bin/bash", CreatedAt: fakeTime, Commands: 3},
		{Name: "b", Shell: "/bin/sh", CreatedAt: fakeTime, Commands: 1, RunningExecId: "ex-9"},
	}
	f.mu.Unlock()
	got, err := sb.ListSessions(t.Context())
	if err != nil {
		t.Fatalf("ListSessions: %v", err)
	}
	want := []SessionInfo{
		{Name: "a", Shell: "/bin/bash", CreatedAt: fakeTime.AsTime(), Commands: 3},
		{Name: "b", Shell: "/bin/sh", CreatedAt: fakeTime.AsTime(), Commands: 1, RunningExecID: "ex-9"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ListSessions (-want +got):\n%s", diff)
	}
	if err := sb.Session("a").Delete(t.Context()); err != nil {
		t.Fatalf("Session.Delete: %v", err)
	}
	if diff := cmp.Diff(&sandboxv1.DeleteSessionRequest{SandboxId: sb.ID, Name: "a"}, f.lastCall(), protocmp.Transform()); diff != "" {
		t.Errorf("DeleteSession request (-want +got):\n%s", diff)
	}
	if err := sb.DeleteSession(t.Context(), "a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("DeleteSession of a deleted session = %v, want ErrNotFound", err)
	}
	if got, err := sb.ListSessions(t.Context()); err != nil || len(got) != 1 || got[0].Name != "b" {
		t.Errorf("ListSessions after the delete = %+v, %v; want b alone", got, err)
	}
	if _, err := c.Sandbox("sb-gone").ListSessions(t.Context()); !errors.Is(err, ErrNotFound) {
		t.Errorf("ListSessions of an unknown sandbox = %v, want ErrNotFound", err)
	}
}

func TestGradeFrom(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb, err := c.Create(t.Context(), CreateOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.grade = &sandboxv1.GradeFromResponse{
		Exit:            &sandboxv1.ExecExit{ExitCode: 1, Duration: durationpb.New(2 * time.Second)},
		Stdout:          []byte("1 failed\n"),
		Stderr:          []byte("trace\n"),
		GraderSandboxId: "node1-grader",
		CopiedFiles:     12,
		CopiedBytes:     3456,
	}
	f.mu.Unlock()
	res, err := sb.GradeFrom(t.Context(), []string{"/workspace", "/etc/answer"}, []string{"pytest", "-q"}, GradeOptions{
		Image: "python:3.12", Env: map[string]string{"CI": "1"}, Cwd: "/workspace", User: "1000",
		Timeout: time.Minute, OutputLimit: 1 << 20, Memory: 1 << 30, CPUs: 2, MaxCopyBytes: 1 << 28,
	})
	if err != nil {
		t.Fatalf("GradeFrom: %v", err)
	}
	want := &GradeResult{
		ExecResult: ExecResult{ExitStatus: ExitStatus{ExitCode: 1, Duration: 2 * time.Second},
			Stdout: []byte("1 failed\n"), Stderr: []byte("trace\n")},
		GraderSandboxID: "node1-grader", CopiedFiles: 12, CopiedBytes: 3456,
	}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("GradeFrom (-want +got):\n%s", diff)
	}
	if res.Code() != 1 {
		t.Errorf("GradeFrom's Code() = %d, want 1", res.Code())
	}
	wantReq := &sandboxv1.GradeFromRequest{SandboxId: sb.ID, Paths: []string{"/workspace", "/etc/answer"}, Image: "python:3.12",
		Argv: []string{"pytest", "-q"}, Env: map[string]string{"CI": "1"}, Cwd: "/workspace", User: "1000",
		Timeout: durationpb.New(time.Minute), OutputLimit: 1 << 20, MaxCopyBytes: 1 << 28,
		Resources: &sandboxv1.Resources{MemoryBytes: 1 << 30, Cpus: 2}}
	if diff := cmp.Diff(wantReq, f.lastCall(), protocmp.Transform()); diff != "" {
		t.Errorf("GradeFromRequest (-want +got):\n%s", diff)
	}

	if _, err := sb.GradeFrom(t.Context(), []string{"/workspace"}, nil, GradeOptions{Shell: "cd /workspace && make test"}); err != nil {
		t.Fatalf("GradeFrom with a shell line: %v", err)
	}
	if diff := cmp.Diff(&sandboxv1.GradeFromRequest{SandboxId: sb.ID, Paths: []string{"/workspace"}, Shell: "cd /workspace && make test"},
		f.lastCall(), protocmp.Transform()); diff != "" {
		t.Errorf("GradeFromRequest with a shell line (-want +got):\n%s", diff)
	}

	calls := len(f.calls)
	many := make([]string, MaxGradePaths+1)
	for i := range many {
		many[i] = "/p"
	}
	for name, tc := range map[string]struct {
		paths []string
		argv  []string
		opts  GradeOptions
	}{
		"no command":     {[]string{"/workspace"}, nil, GradeOptions{}},
		"both commands":  {[]string{"/workspace"}, []string{"true"}, GradeOptions{Shell: "true"}},
		"no paths":       {nil, []string{"true"}, GradeOptions{}},
		"relative path":  {[]string{"work"}, []string{"true"}, GradeOptions{}},
		"too many paths": {many, []string{"true"}, GradeOptions{}},
		"negative limit": {[]string{"/workspace"}, []string{"true"}, GradeOptions{MaxCopyBytes: -1}},
	} {
		if _, err := sb.GradeFrom(t.Context(), tc.paths, tc.argv, tc.opts); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: GradeFrom = %v, want ErrInvalidArgument", name, err)
		}
	}
	if len(f.calls) != calls {
		t.Errorf("refused grades reached the server")
	}

	if _, err := c.Sandbox("sb-gone").GradeFrom(t.Context(), []string{"/workspace"}, []string{"true"}, GradeOptions{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("GradeFrom of an unknown sandbox = %v, want ErrNotFound", err)
	}
	f.setFail(connect.NewError(connect.CodeFailedPrecondition, errors.New("/workspace/link is a device: only regular files, directories and links are copied")))
	if _, err := sb.GradeFrom(context.Background(), []string{"/workspace"}, []string{"true"}, GradeOptions{}); !errors.Is(err, ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), "only regular files") {
		t.Errorf("GradeFrom refused by the server = %v, want ErrFailedPrecondition with its message", err)
	}
	f.setFail(nil)
	f.mu.Lock()
	f.grade = &sandboxv1.GradeFromResponse{}
	f.mu.Unlock()
	if _, err := sb.GradeFrom(t.Context(), []string{"/workspace"}, []string{"true"}, GradeOptions{}); !errors.Is(err, ErrInternal) {
		t.Errorf("GradeFrom answered without an exit = %v, want ErrInternal", err)
	}
}
