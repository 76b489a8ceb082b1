package main

import (
	"context"
	"encoding/json"
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

func (f *fakeAPI) ListSessions(_ context.Context, req *connect.Request[sandboxv1.ListSessionsRequest]) (*connect.Response[sandboxv1.ListSessionsResponse], error) {
	f.record(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	return connect.NewResponse(&sandboxv1.ListSessionsResponse{Sessions: f.sessions}), nil
}

func (f *fakeAPI) DeleteSession(_ context.Context, req *connect.Request[sandboxv1.DeleteSessionRequest]) (*connect.Response[sandboxv1.DeleteSessionResponse], error) {
	f.record(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, s := range f.sessions {
		if s.GetName() == req.Msg.GetName() {
			f.sessions = append(f.sessions[:i:i], f.sessions[i+1:]...)
			return connect.NewResponse(&sandboxv1.DeleteSessionResponse{}), nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, errors.New("session "+req.Msg.GetName()+" of sandbox "+req.Msg.GetSandboxId()+" does not exist (dsec session ls lists them)"))
}

func (f *fakeAPI) GradeFrom(_ context.Context, req *connect.Request[sandboxv1.GradeFromRequest]) (*connect.Response[sandboxv1.GradeFromResponse], error) {
	f.record(req.Msg)
	if req.Msg.GetSandboxId() != sbID {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("sandbox "+req.Msg.GetSandboxId()+": not found"))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return connect.NewResponse(f.grade), nil
}

func (f *fakeAPI) setExit(e *sandboxv1.ExecExit) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exit = e
}

func lastExec(t *testing.T, f *fakeAPI) *sandboxv1.ExecRequest {
	t.Helper()
	execs := callsOf[*sandboxv1.ExecRequest](f)
	if len(execs) == 0 {
		t.Fatal("no exec request was sent")
	}
	return execs[len(execs)-1]
}

func TestExecSession(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	f.setExit(&sandboxv1.ExecExit{ExitCode: 3})

	// The command words are one shell line in the session.
	_, errOut, code := dsecRun(t, addr, "", "exec", "--session", "main", "--shell", "/bin/sh", sbID, "--", "cd /tmp &&", "export A=1")
	if code != 3 || errOut != "starting\n" {
		t.Errorf("exec --session = exit %d, stderr %q; want the command's 3 and its stderr alone", code, errOut)
	}
	want := &sandboxv1.ExecRequest{SandboxId: sbID, Shell: "cd /tmp && export A=1", Session: "main", SessionShell: "/bin/sh"}
	if diff := cmp.Diff(want, lastExec(t, f), protocmp.Transform()); diff != "" {
		t.Errorf("exec --session sent (-want +got):\n%s", diff)
	}

	// A lost shell and a new one are said on stderr.
	f.setExit(&sandboxv1.ExecExit{TimedOut: true, SessionLost: true})
	_, errOut, code = dsecRun(t, addr, "", "exec", "--session", "main", "--timeout", "1s", sbID, "--", "sleep 100")
	if code != 124 || !strings.Contains(errOut, "dsec: session main: the session's shell was lost (the command timed out") ||
		!strings.Contains(errOut, "the next command gets a new shell") {
		t.Errorf("exec --session of a command that lost its shell = exit %d, stderr %q; want 124 and the note", code, errOut)
	}
	if got := lastExec(t, f).GetTimeout().AsDuration(); got != time.Second {
		t.Errorf("exec --session --timeout 1s sent timeout %v", got)
	}
	f.setExit(&sandboxv1.ExecExit{SessionRestarted: true})
	_, errOut, code = dsecRun(t, addr, "", "exec", "--session", "main", sbID, "--", "pwd")
	if code != 0 || !strings.Contains(errOut, "this command ran in a new shell") || strings.Contains(errOut, "the next command") {
		t.Errorf("exec --session in a new shell = exit %d, stderr %q; want 0 and the restart note alone", code, errOut)
	}
	f.setExit(&sandboxv1.ExecExit{SessionLost: true, Signal: 9})
	_, errOut, code = dsecRun(t, addr, "", "exec", "--session", "main", sbID, "--", "exit")
	if code != 137 || !strings.Contains(errOut, "the session's shell was lost (it ended, or the session was deleted)") {
		t.Errorf("exec --session whose shell ended = exit %d, stderr %q; want 137 and the note", code, errOut)
	}
	// Without --session, the same exit is not about a session.
	_, errOut, _ = dsecRun(t, addr, "", "exec", sbID, "--", "true")
	if strings.Contains(errOut, "session") {
		t.Errorf("exec without --session noted %q", errOut)
	}

	// Detached, the session's command prints its exec ID.
	out, _, code := dsecRun(t, addr, "", "exec", "-d", "--session", "bg", sbID, "--", "make")
	if code != 0 || out != "ex-1\n" || lastExec(t, f).GetSession() != "bg" || !lastExec(t, f).GetDetach() {
		t.Errorf("exec -d --session = %q, exit %d, request %v", out, code, lastExec(t, f))
	}

	sent := len(callsOf[*sandboxv1.ExecRequest](f))
	for _, args := range [][]string{
		{"exec", "--shell", "/bin/bash", sbID, "--", "true"},
		{"exec", "--session", "main", "-i", sbID, "--", "cat"},
		{"exec", "--session", "main", "-t", sbID, "--", "sh"},
		{"exec", "--sealed=thaw", sbID, "--", "true"},
		{"exec", "--session", "main", sbID},
	} {
		if _, errOut, code := dsecRun(t, addr, "", args...); code != 2 {
			t.Errorf("dsec %q exits %d (%s), want 2", args, code, errOut)
		}
	}
	if n := len(callsOf[*sandboxv1.ExecRequest](f)); n != sent {
		t.Errorf("usage errors sent %d execs", n-sent)
	}
}

func TestExecSealed(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	f.setExit(&sandboxv1.ExecExit{Sealed: true, ExitCode: 1})
	if _, errOut, code := dsecRun(t, addr, "", "exec", "--sealed", sbID, "--", "/.dsec/bin/sh", "-c", "test -f /workspace/ok"); code != 1 {
		t.Errorf("exec --sealed = exit %d (%s), want the command's 1", code, errOut)
	}
	if got := lastExec(t, f); got.GetSealed() != sandboxv1.Seal_SEAL_FREEZE || len(got.GetArgv()) != 3 {
		t.Errorf("exec --sealed sent %v, want argv sealed with freeze", got)
	}
	f.setExit(&sandboxv1.ExecExit{Sealed: true})
	if _, errOut, code := dsecRun(t, addr, "", "exec", "--sealed=kill", sbID, "--", "true"); code != 0 {
		t.Errorf("exec --sealed=kill = exit %d (%s), want 0", code, errOut)
	}
	if got := lastExec(t, f).GetSealed(); got != sandboxv1.Seal_SEAL_KILL {
		t.Errorf("exec --sealed=kill sent %v", got)
	}
	if _, _, code := dsecRun(t, addr, "", "exec", "--sealed=freeze", sbID, "--", "true"); code != 0 || lastExec(t, f).GetSealed() != sandboxv1.Seal_SEAL_FREEZE {
		t.Errorf("exec --sealed=freeze = exit %d, sent %v", code, lastExec(t, f).GetSealed())
	}

	// A server that ran it unsealed: its "success" is not to be trusted.
	f.setExit(&sandboxv1.ExecExit{})
	_, errOut, code := dsecRun(t, addr, "", "exec", "--sealed", sbID, "--", "true")
	if code != 125 || !strings.Contains(errOut, "does not report it sealed") {
		t.Errorf("exec --sealed answered unsealed = exit %d, stderr %q; want 125 and why", code, errOut)
	}
	if _, _, code := dsecRun(t, addr, "", "exec", sbID, "--", "true"); code != 0 || lastExec(t, f).GetSealed() != sandboxv1.Seal_SEAL_UNSPECIFIED {
		t.Errorf("exec without --sealed = exit %d, sent sealed %v", code, lastExec(t, f).GetSealed())
	}
}

func TestSessionLsRm(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	f.mu.Lock()
	f.sessions = []*sandboxv1.Session{
		{Name: "agent", Shell: "/bin/bash", CreatedAt: fakeTime, Commands: 12, RunningExecId: "ex-7"},
		{Name: "main", Shell: "/bin/sh", CreatedAt: fakeTime, Commands: 2},
	}
	f.mu.Unlock()
	out, errOut, code := dsecRun(t, addr, "", "session", "ls", sbID)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") ||
		strings.Join(strings.Fields(lines[1])[:4], " ") != "agent /bin/bash 12 ex-7" ||
		strings.Join(strings.Fields(lines[2])[:4], " ") != "main /bin/sh 2 -" {
		t.Errorf("session ls = %q (%s), exit %d", out, errOut, code)
	}
	if ls := callsOf[*sandboxv1.ListSessionsRequest](f); len(ls) != 1 || ls[0].GetSandboxId() != sbID {
		t.Errorf("session ls sent %v", ls)
	}
	out, _, code = dsecRun(t, addr, "", "session", "ls", "-o", "json", sbID)
	// The API's JSON: its lowerCamelCase names, int64 as strings, RFC 3339 times.
	var got []struct {
		Name          string `json:"name"`
		Commands      int64  `json:"commands,string"`
		RunningExecID string `json:"runningExecId"`
		CreatedAt     string `json:"createdAt"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 || len(got) != 2 || got[0].RunningExecID != "ex-7" || got[1].Commands != 2 ||
		got[0].CreatedAt != "2026-01-02T03:04:05Z" {
		t.Errorf("session ls -o json = %q, exit %d, %v", out, code, err)
	}

	_, errOut, code = dsecRun(t, addr, "", "session", "rm", sbID, "agent")
	if code != 0 || errOut != "" {
		t.Errorf("session rm = exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = dsecRun(t, addr, "", "session", "rm", sbID, "agent", "main")
	if code != 125 || !strings.Contains(errOut, "session agent") || !strings.Contains(errOut, "does not exist") {
		t.Errorf("session rm of a gone session = exit %d, stderr %q; want 125 naming it", code, errOut)
	}
	dels := callsOf[*sandboxv1.DeleteSessionRequest](f)
	if len(dels) != 3 || dels[2].GetName() != "main" || dels[2].GetSandboxId() != sbID {
		t.Errorf("session rm sent %v; want the other session ended too", dels)
	}
	out, _, _ = dsecRun(t, addr, "", "session", "ls", sbID)
	if strings.Count(out, "\n") != 1 {
		t.Errorf("session ls after rm = %q, want the header alone", out)
	}
	for _, args := range [][]string{{"session", "rm", sbID}, {"session", "ls"}, {"session", "ls", "-o", "yaml", sbID}} {
		if _, errOut, code := dsecRun(t, addr, "", args...); code != 2 {
			t.Errorf("dsec %q exits %d (%s), want 2", args, code, errOut)
		}
	}
}

func TestGrade(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	f.mu.Lock()
	f.grade = &sandboxv1.GradeFromResponse{Exit: &sandboxv1.ExecExit{ExitCode: 4}, Stdout: []byte("3 passed, 1 failed\n"),
		Stderr: []byte("FAIL test_x\n"), GraderSandboxId: "node1-grader", CopiedFiles: 7, CopiedBytes: 2048}
	f.mu.Unlock()
	out, errOut, code := dsecRun(t, addr, "", "grade", sbID, "--copy", "/workspace", "/etc/answer", "--image", "grader:1", "--timeout", "90s",
		"-e", "CI=1", "-w", "/workspace", "--memory", "1G", "--max-copy", "64M", "--", "pytest", "-q")
	if code != 4 || out != "3 passed, 1 failed\n" || errOut != "FAIL test_x\n" {
		t.Errorf("grade = exit %d, stdout %q, stderr %q; want the command's 4 and its output", code, out, errOut)
	}
	want := &sandboxv1.GradeFromRequest{SandboxId: sbID, Paths: []string{"/workspace", "/etc/answer"}, Image: "grader:1",
		Argv: []string{"pytest", "-q"}, Env: map[string]string{"CI": "1"}, Cwd: "/workspace", Timeout: durationpb.New(90 * time.Second),
		Resources: &sandboxv1.Resources{MemoryBytes: 1 << 30}, MaxCopyBytes: 64 << 20}
	grades := callsOf[*sandboxv1.GradeFromRequest](f)
	if diff := cmp.Diff(want, grades[len(grades)-1], protocmp.Transform()); diff != "" {
		t.Errorf("grade sent (-want +got):\n%s", diff)
	}

	f.mu.Lock()
	f.grade = &sandboxv1.GradeFromResponse{Exit: &sandboxv1.ExecExit{}, GraderSandboxId: "node1-grader", CopiedFiles: 7, CopiedBytes: 2048}
	f.mu.Unlock()
	_, errOut, code = dsecRun(t, addr, "", "grade", "-v", sbID, "--copy", "/a", "--copy", "/b", "--sh", "--", "cd /a &&", "diff x /b/y")
	if code != 0 || !strings.Contains(errOut, "node1-grader (deleted): 7 files") || !strings.Contains(errOut, "exit 0") {
		t.Errorf("grade -v = exit %d, stderr %q", code, errOut)
	}
	grades = callsOf[*sandboxv1.GradeFromRequest](f)
	if g := grades[len(grades)-1]; g.GetShell() != "cd /a && diff x /b/y" || len(g.GetArgv()) != 0 || len(g.GetPaths()) != 2 {
		t.Errorf("grade --sh sent %v", g)
	}

	f.mu.Lock()
	f.grade = &sandboxv1.GradeFromResponse{Exit: &sandboxv1.ExecExit{TimedOut: true}}
	f.mu.Unlock()
	if _, _, code := dsecRun(t, addr, "", "grade", sbID, "--copy", "/a", "--", "sleep", "1000"); code != 124 {
		t.Errorf("grade of a command that timed out exits %d, want 124", code)
	}
	if _, errOut, code := dsecRun(t, addr, "", "grade", "node1-bbbbbbbbbbbb", "--copy", "/a", "--", "true"); code != 125 || !strings.Contains(errOut, "not found") {
		t.Errorf("grade of an unknown sandbox = exit %d, stderr %q; want 125", code, errOut)
	}

	sent := len(callsOf[*sandboxv1.GradeFromRequest](f))
	for _, args := range [][]string{
		{"grade", sbID, "--copy", "/a", "true"}, // no --
		{"grade", sbID, "--copy", "/a", "--"},
		{"grade", sbID, "--", "true"}, // nothing to copy
		{"grade", "--copy", "/a", "--", "true"},
		{"grade", sbID, "--copy", "/a", "--memory", "lots", "--", "true"},
	} {
		if _, errOut, code := dsecRun(t, addr, "", args...); code != 2 {
			t.Errorf("dsec %q exits %d (%s), want 2", args, code, errOut)
		}
	}
	if n := len(callsOf[*sandboxv1.GradeFromRequest](f)); n != sent {
		t.Errorf("usage errors sent %d grades", n-sent)
	}
}

func TestExecsShowsSessionsAndSeals(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	f.mu.Lock()
	f.execInfos = []*sandboxv1.ExecInfo{
		{ExecId: "ex-1", Argv: []string{"true"}, StartedAt: fakeTime, Sealed: true, Exit: &sandboxv1.ExecExit{Sealed: true}},
		{ExecId: "ex-2", Argv: []string{"/bin/bash"}, StartedAt: fakeTime, Session: "main", Exit: &sandboxv1.ExecExit{ExitCode: 1}},
		{ExecId: "ex-3", Argv: []string{"/bin/bash"}, StartedAt: fakeTime, Session: "main", Exit: &sandboxv1.ExecExit{TimedOut: true, SessionLost: true}},
	}
	f.mu.Unlock()
	out, _, code := dsecRun(t, addr, "", "execs", sbID)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 4 || !strings.Contains(lines[1], "exit 0, sealed") || !strings.Contains(lines[2], "exit 1, session main") ||
		!strings.Contains(lines[3], "timed out, session main (shell lost)") {
		t.Errorf("execs = %q, exit %d; want the sealed and session commands marked", out, code)
	}
}

func TestSessionHelp(t *testing.T) {
	for args, want := range map[string][]string{
		"exec --help":       {"--session", "--shell", "--sealed", "--sealed=kill", "joined into one shell line"},
		"session --help":    {"ls", "rm"},
		"session ls --help": {"-o, --output"},
		"session rm --help": {"killed"},
		"grade --help":      {"--copy", "--image", "--timeout", "never followed", "docs/grading.md"},
	} {
		out, _, code := dsecRun(t, "http://127.0.0.1:1", "", strings.Fields(args)...)
		for _, w := range want {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("dsec %s (exit %d) does not mention %q", args, code, w)
			}
		}
	}
}
