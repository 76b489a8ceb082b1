package dsec

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// journalNode is a sandbox's exec journal as a server keeps it: execs by
// ID with their step keys (one exec per key), output, and an end that the
// test gives. Its faults: the next execs' streams break right after the
// start, or before it (the exec starts all the same).
type journalNode struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler

	mu sync.Mutex
	// guarded by mu
	execs       []*journalExec
	starts      int // execs started
	breakAfter  int // the next n exec streams end after the started event
	breakBefore int // the next n exec streams end before it
	attaches    int
}

type journalExec struct {
	id, key, out string
	running      bool
	code         int32
	done         chan struct{}
}

func (n *journalNode) find(key string) *journalExec {
	for _, x := range n.execs {
		if x.key == key && key != "" {
			return x
		}
	}
	return nil
}

// finish ends the running exec of key with code.
func (n *journalNode) finish(key string, code int32) {
	n.mu.Lock()
	defer n.mu.Unlock()
	x := n.find(key)
	x.running, x.code = false, code
	close(x.done)
}

func (n *journalNode) Exec(ctx context.Context, req *connect.Request[sandboxv1.ExecRequest], s *connect.ServerStream[sandboxv1.ExecResponse]) error {
	m := req.Msg
	n.mu.Lock()
	if x := n.find(m.GetStepKey()); x != nil {
		n.mu.Unlock()
		return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("step key %q is exec %s's", m.GetStepKey(), x.id))
	}
	n.starts++
	x := &journalExec{id: fmt.Sprintf("x%d", n.starts), key: m.GetStepKey(), out: m.GetShell() + "\n", running: true, done: make(chan struct{})}
	if !strings.Contains(m.GetShell(), "slow") {
		x.running = false
		close(x.done)
	}
	n.execs = append(n.execs, x)
	before, after := n.breakBefore > 0, n.breakAfter > 0 && n.breakBefore == 0
	if before {
		n.breakBefore--
	} else if after {
		n.breakAfter--
	}
	n.mu.Unlock()
	if before {
		return connect.NewError(connect.CodeUnavailable, errors.New("connection reset"))
	}
	if err := s.Send(&sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Started{Started: &sandboxv1.ExecStarted{ExecId: x.id}}}); err != nil || after {
		return connect.NewError(connect.CodeUnavailable, errors.New("connection reset"))
	}
	return n.play(ctx, x, s)
}

func (n *journalNode) play(ctx context.Context, x *journalExec, s *connect.ServerStream[sandboxv1.ExecResponse]) error {
	select {
	case <-x.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	n.mu.Lock()
	out, code := x.out, x.code
	n.mu.Unlock()
	if err := s.Send(&sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Output{Output: &sandboxv1.OutputChunk{Stream: sandboxv1.Stream_STREAM_STDOUT, Data: []byte(out)}}}); err != nil {
		return err
	}
	return s.Send(&sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Exit{Exit: &sandboxv1.ExecExit{ExitCode: code}}})
}

func (n *journalNode) Attach(ctx context.Context, req *connect.Request[sandboxv1.AttachRequest], s *connect.ServerStream[sandboxv1.ExecResponse]) error {
	n.mu.Lock()
	n.attaches++
	var x *journalExec
	for _, e := range n.execs {
		if e.id == req.Msg.GetExecId() {
			x = e
		}
	}
	n.mu.Unlock()
	if x == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("no such exec"))
	}
	return n.play(ctx, x, s)
}

func (n *journalNode) ListExecs(_ context.Context, req *connect.Request[sandboxv1.ListExecsRequest]) (*connect.Response[sandboxv1.ListExecsResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	want := map[string]bool{}
	for _, k := range req.Msg.GetStepKeys() {
		want[k] = true
	}
	out := &sandboxv1.ListExecsResponse{}
	for _, x := range n.execs {
		if len(want) > 0 && !want[x.key] {
			continue
		}
		info := &sandboxv1.ExecInfo{ExecId: x.id, StepKey: x.key, Running: x.running}
		if !x.running {
			info.Exit = &sandboxv1.ExecExit{ExitCode: x.code}
		}
		out.Execs = append(out.Execs, info)
	}
	return connect.NewResponse(out), nil
}

func (n *journalNode) client(t *testing.T) *Client {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(n))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := New(Config{Addr: srv.URL, APIKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func steps(cmds ...string) []Step {
	out := make([]Step, len(cmds))
	for i, c := range cmds {
		out[i] = Step{Key: fmt.Sprintf("step-%d", i), Request: ExecRequest{Shell: c}}
	}
	return out
}

func sources(rs []*StepResult) string {
	var b []string
	for _, r := range rs {
		b = append(b, r.From.String())
	}
	return strings.Join(b, ",")
}

// TestRunStepsFastForward: a second run of the same steps (a restarted
// trainer) runs none again: ended steps come from the journal with their
// output and exit, a running one is followed to its end, and only the
// steps never started run.
func TestRunStepsFastForward(t *testing.T) {
	n := &journalNode{}
	sb := n.client(t).Sandbox("n1-aaaaaaaaaaaa")
	ctx := context.Background()
	rs, err := sb.RunSteps(ctx, steps("echo one", "exit 3"))
	if err != nil || sources(rs) != "ran,ran" || string(rs[0].Stdout) != "echo one\n" {
		t.Fatalf("first run = %s, %v", sources(rs), err)
	}
	n.mu.Lock()
	n.execs[1].code = 3 // as the command ended
	n.mu.Unlock()
	// A step left running by a client that went away.
	if _, err := sb.ExecDetached(ctx, ExecRequest{Shell: "slow step", StepKey: "step-2"}); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		n.finish("step-2", 7)
	}()
	rs, err = sb.RunSteps(ctx, steps("echo one", "exit 3", "slow step", "echo four"))
	if err != nil {
		t.Fatal(err)
	}
	if got := sources(rs); got != "recorded,recorded,attached,ran" {
		t.Errorf("second run's sources = %s, want recorded,recorded,attached,ran", got)
	}
	if string(rs[0].Stdout) != "echo one\n" || rs[1].ExitCode != 3 || rs[2].ExitCode != 7 || string(rs[3].Stdout) != "echo four\n" {
		t.Errorf("second run's results = %+v %+v %+v %+v", rs[0].ExecResult, rs[1].ExecResult, rs[2].ExecResult, rs[3].ExecResult)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.starts != 4 {
		t.Errorf("%d execs started for 4 steps, want 4", n.starts)
	}
}

// TestRunStepsBrokenStreams: a stream that breaks after the start is
// followed by exec ID, one that breaks before it (the server started the
// command all the same) is found by its step key: neither runs twice. A
// step found by exec ID alone is not run either.
func TestRunStepsBrokenStreams(t *testing.T) {
	n := &journalNode{breakAfter: 1}
	sb := n.client(t).Sandbox("n1-aaaaaaaaaaaa")
	ctx := context.Background()
	r, err := sb.RunStep(ctx, Step{Key: "a", Request: ExecRequest{Shell: "echo a"}})
	if err != nil || r.From != StepRan || string(r.Stdout) != "echo a\n" {
		t.Fatalf("RunStep with the stream broken after the start = %+v, %v", r, err)
	}
	n.mu.Lock()
	n.breakBefore = 1
	n.mu.Unlock()
	r, err = sb.RunStep(ctx, Step{Key: "b", Request: ExecRequest{Shell: "echo b"}})
	if err != nil || string(r.Stdout) != "echo b\n" {
		t.Fatalf("RunStep with the stream broken before the start = %+v, %v", r, err)
	}
	r, err = sb.RunStep(ctx, Step{ExecID: "x1", Request: ExecRequest{Shell: "echo a"}})
	if err != nil || r.From != StepRecorded || string(r.Stdout) != "echo a\n" {
		t.Errorf("RunStep(by exec ID x1) = %+v, %v; want step a's recorded result", r, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.starts != 2 {
		t.Errorf("%d execs started for 2 steps, want 2 (none run twice)", n.starts)
	}
}
