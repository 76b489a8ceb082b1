package dsec

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// echoExec is an exec script that echoes what WriteStdin sends, upper-cased,
// and exits 0 once stdin is closed.
func echoExec(f *fake) func(context.Context, func(*sandboxv1.ExecResponse) error) error {
	return func(ctx context.Context, send func(*sandboxv1.ExecResponse) error) error {
		if err := send(startedEvent("ex-i")); err != nil {
			return err
		}
		var off int64
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case req := <-f.stdin:
				if req.GetExecId() != "ex-i" {
					return connect.NewError(connect.CodeNotFound, errors.New("exec "+req.GetExecId()+": not found"))
				}
				if len(req.GetData()) > 0 {
					data := strings.ToUpper(string(req.GetData()))
					if err := send(outEvent(stdoutS, off, data)); err != nil {
						return err
					}
					off += int64(len(data))
				}
				if req.GetClose() {
					return send(exitEvent(0))
				}
			}
		}
	}
}

func TestStartInteractive(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	sb := c.Sandbox("sb-a")
	f.setExec(echoExec(f))

	p, err := sb.Start(ctx, ExecRequest{Argv: []string{"/bin/sh"}, TTY: true, Rows: 30, Cols: 100})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if p.ID != "ex-i" || p.Stdin == nil {
		t.Fatalf("Start = ID %q, Stdin %v; want ex-i and a stdin writer", p.ID, p.Stdin)
	}
	wantReq := &sandboxv1.ExecRequest{SandboxId: "sb-a", Argv: []string{"/bin/sh"}, Tty: true, Rows: 30, Cols: 100}
	if diff := cmp.Diff(wantReq, f.execReq(0), protocmp.Transform()); diff != "" {
		t.Errorf("ExecRequest (-want +got):\n%s", diff)
	}

	if err := p.Resize(ctx, 40, 120); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if diff := cmp.Diff(&sandboxv1.ResizeTTYRequest{SandboxId: "sb-a", ExecId: "ex-i", Rows: 40, Cols: 120}, f.lastCall(), protocmp.Transform()); diff != "" {
		t.Errorf("ResizeTTYRequest (-want +got):\n%s", diff)
	}
	if err := p.Signal(ctx, 2); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if diff := cmp.Diff(&sandboxv1.SignalRequest{SandboxId: "sb-a", ExecId: "ex-i", Signal: 2}, f.lastCall(), protocmp.Transform()); diff != "" {
		t.Errorf("SignalRequest (-want +got):\n%s", diff)
	}

	big := bytes.Repeat([]byte("x"), 2*chunkSize+10)
	for _, in := range [][]byte{[]byte("hello "), []byte("world"), big} {
		if n, err := p.Stdin.Write(in); n != len(in) || err != nil {
			t.Fatalf("Stdin.Write(%d bytes) = %d, %v", len(in), n, err)
		}
	}
	if err := p.Stdin.Close(); err != nil {
		t.Fatalf("Stdin.Close: %v", err)
	}
	if err := p.Stdin.Close(); err != nil {
		t.Errorf("second Stdin.Close = %v, want nil", err)
	}
	if _, err := p.Stdin.Write([]byte("late")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("Stdin.Write after Close = %v, want io.ErrClosedPipe", err)
	}
	var out bytes.Buffer
	st, err := p.Wait(&out, nil)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	want := "HELLO WORLD" + strings.Repeat("X", len(big))
	if out.String() != want {
		t.Errorf("Wait wrote %d bytes, want %d (the echo of all input, in order)", out.Len(), len(want))
	}
	if st.ExecID != "ex-i" || st.Code() != 0 {
		t.Errorf("Wait = %+v, want exec ex-i exit 0", st)
	}
	if _, err := p.Wait(nil, nil); !errors.Is(err, ErrFailedPrecondition) {
		t.Errorf("second Wait = %v, want ErrFailedPrecondition", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close after Wait = %v", err)
	}
}

func TestStartCloseWhileWaiting(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	f.setExec(func(ctx context.Context, send func(*sandboxv1.ExecResponse) error) error {
		if err := send(startedEvent("ex-s")); err != nil {
			return err
		}
		if err := send(outEvent(stdoutS, 0, "waiting")); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	})
	p, err := c.Sandbox("sb-a").Start(t.Context(), ExecRequest{Shell: "sleep 1000", StdinOpen: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if !f.execReq(0).GetStdinOpen() {
		t.Errorf("Start with StdinOpen sent stdin_open=false")
	}
	done := make(chan error, 1)
	waiting := make(chan struct{})
	go func() {
		_, err := p.Wait(writerFunc(func(b []byte) (int, error) {
			close(waiting)
			return len(b), nil
		}), nil)
		done <- err
	}()
	<-waiting
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "ex-s") {
			t.Errorf("Wait after Close = %v, want context.Canceled naming ex-s", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after Close")
	}
	if _, err := p.Stdin.Write([]byte("x")); err == nil {
		t.Errorf("Stdin.Write after Close succeeded")
	}

	// A process that is never waited for is released by Close alone.
	p2, err := c.Sandbox("sb-a").Start(t.Context(), ExecRequest{Shell: "sleep 1000"})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if p2.Stdin != nil {
		t.Errorf("Start without StdinOpen or TTY gave a Stdin")
	}
	if err := p2.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	f.setExec(play(connect.NewError(connect.CodeNotFound, errors.New("sandbox sb-a: not found"))))
	if _, err := c.Sandbox("sb-a").Start(t.Context(), ExecRequest{Shell: "true"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Start in a missing sandbox = %v, want ErrNotFound", err)
	}
}

func TestExecRequestFieldsAndDetach(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb := c.Sandbox("sb-a")
	f.setExec(play(nil, startedEvent("ex-o"), exitEvent(0)))
	if _, err := sb.Exec(t.Context(), []string{"top"}, WithTTY(0, 0), WithStdinOpen(), WithOutputLimit(1<<20)); err != nil {
		t.Fatalf("Exec: %v", err)
	}
	want := &sandboxv1.ExecRequest{SandboxId: "sb-a", Argv: []string{"top"}, Tty: true, StdinOpen: true, OutputLimit: 1 << 20}
	if diff := cmp.Diff(want, f.execReq(0), protocmp.Transform()); diff != "" {
		t.Errorf("ExecRequest (-want +got):\n%s", diff)
	}

	// The server detaches: it answers with the start only.
	f.setExec(play(nil, startedEvent("ex-d")))
	id, err := sb.ExecDetached(t.Context(), ExecRequest{Shell: "sleep 100", Timeout: time.Hour})
	if err != nil || id != "ex-d" {
		t.Fatalf("ExecDetached = %q, %v; want ex-d", id, err)
	}
	wantD := &sandboxv1.ExecRequest{SandboxId: "sb-a", Shell: "sleep 100", Timeout: durationpb.New(time.Hour), Detach: true}
	if diff := cmp.Diff(wantD, f.execReq(1), protocmp.Transform()); diff != "" {
		t.Errorf("detached ExecRequest (-want +got):\n%s", diff)
	}

	bad := []ExecRequest{
		{Argv: []string{"ls"}, Detach: true},
		{Argv: []string{"ls"}, TTY: true, Rows: 70000},
		{Argv: []string{"ls"}, Cols: -1},
		{Argv: []string{"ls"}, OutputLimit: -1},
	}
	for _, req := range bad {
		if _, err := sb.ExecStream(t.Context(), req, nil, nil); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ExecStream(%+v) = %v, want ErrInvalidArgument", req, err)
		}
	}
	if _, err := sb.Start(t.Context(), ExecRequest{Argv: []string{"ls"}, Detach: true}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Start with Detach = %v, want ErrInvalidArgument", err)
	}
}

func TestAttach(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb := c.Sandbox("sb-a")
	f.mu.Lock()
	f.attach = func(_ context.Context, req *sandboxv1.AttachRequest, send func(*sandboxv1.ExecResponse) error) error {
		for _, ev := range []*sandboxv1.ExecResponse{
			outEvent(stdoutS, req.GetStdoutOffset(), "later out"),
			keepaliveEvent(),
			outEvent(stderrS, req.GetStderrOffset(), "later err"),
			{Event: &sandboxv1.ExecResponse_Exit{Exit: &sandboxv1.ExecExit{Lost: true}}},
		} {
			if err := send(ev); err != nil {
				return err
			}
		}
		return nil
	}
	f.mu.Unlock()
	var rec recorder
	st, err := sb.Attach(t.Context(), "ex-7", 100, 5, streamWriter{&rec, "out"}, streamWriter{&rec, "err"})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if diff := cmp.Diff([]string{"out:later out", "err:later err"}, rec.writes); diff != "" {
		t.Errorf("Attach writes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&ExitStatus{ExecID: "ex-7", Lost: true}, st); diff != "" {
		t.Errorf("Attach status (-want +got):\n%s", diff)
	}
	wantReq := &sandboxv1.AttachRequest{SandboxId: "sb-a", ExecId: "ex-7", StdoutOffset: 100, StderrOffset: 5}
	if diff := cmp.Diff(wantReq, f.lastCall(), protocmp.Transform()); diff != "" {
		t.Errorf("AttachRequest (-want +got):\n%s", diff)
	}

	// A stream that ends early still names the exec.
	f.mu.Lock()
	f.attach = func(_ context.Context, _ *sandboxv1.AttachRequest, send func(*sandboxv1.ExecResponse) error) error {
		return send(outEvent(stdoutS, 0, "x"))
	}
	f.mu.Unlock()
	st, err = sb.Attach(t.Context(), "ex-8", 0, 0, nil, nil)
	if !errors.Is(err, ErrUnavailable) || st == nil || st.ExecID != "ex-8" {
		t.Errorf("Attach to a stream without exit = %+v, %v; want ErrUnavailable with exec ID ex-8", st, err)
	}

	f.mu.Lock()
	f.attach = nil
	f.mu.Unlock()
	if _, err := sb.Attach(t.Context(), "ex-9", 0, 0, nil, nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("Attach to a missing exec = %v, want ErrNotFound", err)
	}
	for _, tt := range []struct {
		id       string
		out, err int64
	}{{"", 0, 0}, {"ex", -1, 0}, {"ex", 0, -1}} {
		if _, err := sb.Attach(t.Context(), tt.id, tt.out, tt.err, nil, nil); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Attach(%q, %d, %d) = %v, want ErrInvalidArgument", tt.id, tt.out, tt.err, err)
		}
	}
}

func TestExecControlCalls(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	sb := c.Sandbox("sb-a")

	if err := sb.WriteStdin(ctx, "ex-1", []byte("data"), true); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	got := <-f.stdin
	if diff := cmp.Diff(&sandboxv1.WriteStdinRequest{SandboxId: "sb-a", ExecId: "ex-1", Data: []byte("data"), Close: true}, got, protocmp.Transform()); diff != "" {
		t.Errorf("WriteStdinRequest (-want +got):\n%s", diff)
	}
	if err := sb.Signal(ctx, "ex-1", 9); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if diff := cmp.Diff(&sandboxv1.SignalRequest{SandboxId: "sb-a", ExecId: "ex-1", Signal: 9}, f.lastCall(), protocmp.Transform()); diff != "" {
		t.Errorf("SignalRequest (-want +got):\n%s", diff)
	}
	for _, sig := range []int{-1, 65} {
		if err := sb.Signal(ctx, "ex-1", sig); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Signal(%d) = %v, want ErrInvalidArgument", sig, err)
		}
	}
	for _, size := range [][2]int{{0, 80}, {24, 0}, {70000, 80}} {
		if err := sb.ResizeTTY(ctx, "ex-1", size[0], size[1]); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ResizeTTY(%dx%d) = %v, want ErrInvalidArgument", size[0], size[1], err)
		}
	}

	f.mu.Lock()
	f.execInfos = []*sandboxv1.ExecInfo{
		{ExecId: "ex-1", Argv: []string{"make"}, StartedAt: fakeTime, StdoutBytes: 10, StderrBytes: 2,
			Exit: &sandboxv1.ExecExit{ExitCode: 2, Duration: durationpb.New(time.Second)}},
		{ExecId: "ex-2", Argv: []string{"sh"}, Tty: true, StartedAt: fakeTime, Running: true},
	}
	f.mu.Unlock()
	execs, err := sb.ListExecs(ctx)
	if err != nil {
		t.Fatalf("ListExecs: %v", err)
	}
	want := []ExecInfo{
		{ID: "ex-1", Argv: []string{"make"}, StartedAt: fakeTime.AsTime(), StdoutBytes: 10, StderrBytes: 2,
			Exit: &ExitStatus{ExecID: "ex-1", ExitCode: 2, Duration: time.Second}},
		{ID: "ex-2", Argv: []string{"sh"}, TTY: true, StartedAt: fakeTime.AsTime(), Running: true},
	}
	if diff := cmp.Diff(want, execs); diff != "" {
		t.Errorf("ListExecs (-want +got):\n%s", diff)
	}
}
