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

func startedEvent(id string) *sandboxv1.ExecResponse {
	return &sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Started{Started: &sandboxv1.ExecStarted{ExecId: id}}}
}

func outEvent(s sandboxv1.Stream, off int64, data string) *sandboxv1.ExecResponse {
	return &sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Output{Output: &sandboxv1.OutputChunk{Stream: s, Offset: off, Data: []byte(data)}}}
}

func keepaliveEvent() *sandboxv1.ExecResponse {
	return &sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Keepalive{Keepalive: &sandboxv1.Keepalive{}}}
}

func exitEvent(code int32) *sandboxv1.ExecResponse {
	return &sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Exit{Exit: &sandboxv1.ExecExit{ExitCode: code, Duration: durationpb.New(1500 * time.Millisecond)}}}
}

// play returns an exec script that sends evs, then returns end.
func play(end error, evs ...*sandboxv1.ExecResponse) func(context.Context, func(*sandboxv1.ExecResponse) error) error {
	return func(_ context.Context, send func(*sandboxv1.ExecResponse) error) error {
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return err
			}
		}
		return end
	}
}

// recorder records writes to two streams in the order they happen.
type recorder struct{ writes []string }

type streamWriter struct {
	r    *recorder
	name string
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.r.writes = append(w.r.writes, w.name+":"+string(p))
	return len(p), nil
}

const (
	stdoutS = sandboxv1.Stream_STREAM_STDOUT
	stderrS = sandboxv1.Stream_STREAM_STDERR
)

func TestExecStreamInterleaved(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	f.setExec(play(nil,
		startedEvent("ex-1"),
		outEvent(stdoutS, 0, "one "),
		outEvent(stderrS, 0, "warn "),
		keepaliveEvent(),
		outEvent(stdoutS, 4, "two"),
		outEvent(stderrS, 5, "fail"),
		&sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Exit{Exit: &sandboxv1.ExecExit{
			ExitCode: 3, StdoutTruncated: true, Duration: durationpb.New(2 * time.Second),
		}}},
	))
	var rec recorder
	st, err := c.Sandbox("sb-a").ExecStream(t.Context(), ExecRequest{
		Argv:    []string{"sh", "-c", "x"},
		Env:     map[string]string{"K": "V"},
		Cwd:     "/tmp",
		User:    "nobody",
		Stdin:   []byte("in"),
		Timeout: 30 * time.Second,
	}, streamWriter{&rec, "out"}, streamWriter{&rec, "err"})
	if err != nil {
		t.Fatalf("ExecStream: %v", err)
	}
	wantWrites := []string{"out:one ", "err:warn ", "out:two", "err:fail"}
	if diff := cmp.Diff(wantWrites, rec.writes); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	wantSt := &ExitStatus{ExecID: "ex-1", ExitCode: 3, StdoutTruncated: true, Duration: 2 * time.Second}
	if diff := cmp.Diff(wantSt, st); diff != "" {
		t.Errorf("ExitStatus (-want +got):\n%s", diff)
	}
	wantReq := &sandboxv1.ExecRequest{
		SandboxId: "sb-a",
		Argv:      []string{"sh", "-c", "x"},
		Env:       map[string]string{"K": "V"},
		Cwd:       "/tmp",
		User:      "nobody",
		Stdin:     []byte("in"),
		Timeout:   durationpb.New(30 * time.Second),
	}
	if diff := cmp.Diff(wantReq, f.execReq(0), protocmp.Transform()); diff != "" {
		t.Errorf("ExecRequest (-want +got):\n%s", diff)
	}
}

func TestExecAndShellCollect(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb := c.Sandbox("sb-a")
	f.setExec(play(nil,
		startedEvent("ex-2"),
		outEvent(stdoutS, 0, "a"),
		outEvent(stderrS, 0, "b"),
		outEvent(stdoutS, 1, "c"),
		outEvent(stderrS, 1, "d"),
		exitEvent(0),
	))
	res, err := sb.Exec(t.Context(), []string{"cat"}, WithEnv(map[string]string{"A": "1"}), WithEnv(map[string]string{"B": "2"}),
		WithCwd("/w"), WithUser("u"), WithStdin([]byte("data")), WithTimeout(time.Minute))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	want := &ExecResult{ExitStatus: ExitStatus{ExecID: "ex-2", Duration: 1500 * time.Millisecond}, Stdout: []byte("ac"), Stderr: []byte("bd")}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("Exec (-want +got):\n%s", diff)
	}
	wantReq := &sandboxv1.ExecRequest{SandboxId: "sb-a", Argv: []string{"cat"}, Env: map[string]string{"A": "1", "B": "2"},
		Cwd: "/w", User: "u", Stdin: []byte("data"), Timeout: durationpb.New(time.Minute)}
	if diff := cmp.Diff(wantReq, f.execReq(0), protocmp.Transform()); diff != "" {
		t.Errorf("ExecRequest (-want +got):\n%s", diff)
	}

	if _, err := sb.Shell(t.Context(), "echo $A | tr a b"); err != nil {
		t.Fatalf("Shell: %v", err)
	}
	wantShell := &sandboxv1.ExecRequest{SandboxId: "sb-a", Shell: "echo $A | tr a b"}
	if diff := cmp.Diff(wantShell, f.execReq(1), protocmp.Transform()); diff != "" {
		t.Errorf("Shell's ExecRequest (-want +got):\n%s", diff)
	}

	for _, req := range []ExecRequest{{}, {Argv: []string{"ls"}, Shell: "ls"}} {
		if _, err := sb.ExecStream(t.Context(), req, nil, nil); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ExecStream(%+v) = %v, want ErrInvalidArgument", req, err)
		}
	}
}

func TestExecStreamWithoutExit(t *testing.T) {
	tests := []struct {
		name       string
		script     func(context.Context, func(*sandboxv1.ExecResponse) error) error
		wantKind   error
		wantExecID string
		wantStdout string
	}{
		{
			name:       "ends after output",
			script:     play(nil, startedEvent("ex-9"), outEvent(stdoutS, 0, "partial")),
			wantKind:   ErrUnavailable,
			wantExecID: "ex-9",
			wantStdout: "partial",
		},
		{
			name:       "server error after start",
			script:     play(connect.NewError(connect.CodeUnavailable, errors.New("edge restarting")), startedEvent("ex-8"), keepaliveEvent()),
			wantKind:   ErrUnavailable,
			wantExecID: "ex-8",
		},
		{
			name:     "ends before start",
			script:   play(nil),
			wantKind: ErrUnavailable,
		},
		{
			name:     "refused before start",
			script:   play(connect.NewError(connect.CodeNotFound, errors.New("sandbox sb-a: not found"))),
			wantKind: ErrNotFound,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			c, _ := f.start(t, testKey)
			f.setExec(tt.script)
			res, err := c.Sandbox("sb-a").Exec(t.Context(), []string{"sleep", "100"})
			if !errors.Is(err, tt.wantKind) {
				t.Fatalf("Exec = %v, want %v", err, tt.wantKind)
			}
			if tt.wantExecID == "" {
				if res != nil {
					t.Errorf("Exec = %+v, want no result before the command started", res)
				}
				return
			}
			if res == nil || res.ExecID != tt.wantExecID || string(res.Stdout) != tt.wantStdout {
				t.Fatalf("Exec = %+v, want exec ID %q and stdout %q", res, tt.wantExecID, tt.wantStdout)
			}
			if !strings.Contains(err.Error(), tt.wantExecID) {
				t.Errorf("Exec error %q does not name exec %s", err, tt.wantExecID)
			}
		})
	}
}

func TestExecCanceled(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	f.setExec(func(ctx context.Context, send func(*sandboxv1.ExecResponse) error) error {
		if err := send(startedEvent("ex-c")); err != nil {
			return err
		}
		if err := send(outEvent(stdoutS, 0, "working")); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The caller gives up once output arrives.
	cancelOnWrite := writerFunc(func(p []byte) (int, error) {
		cancel()
		return len(p), nil
	})
	st, err := c.Sandbox("sb-a").ExecStream(ctx, ExecRequest{Argv: []string{"sleep", "1000"}}, cancelOnWrite, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("ExecStream after cancel = %v, want context.Canceled", err)
	}
	if st == nil || st.ExecID != "ex-c" {
		t.Errorf("ExecStream after cancel = %+v, want exec ID ex-c", st)
	}

	// A failing writer ends the call the same way, with its error.
	boom := errors.New("pipe closed")
	f.setExec(play(nil, startedEvent("ex-w"), outEvent(stdoutS, 0, "x"), exitEvent(0)))
	st, err = c.Sandbox("sb-a").ExecStream(t.Context(), ExecRequest{Argv: []string{"ls"}},
		writerFunc(func([]byte) (int, error) { return 0, boom }), nil)
	if !errors.Is(err, boom) || st == nil || st.ExecID != "ex-w" || !strings.Contains(err.Error(), "ex-w") {
		t.Errorf("ExecStream with a failing writer = %+v, %v; want %v and exec ID ex-w", st, err, boom)
	}

	// A deadline shows as DeadlineExceeded, both ways.
	f.setExec(func(ctx context.Context, send func(*sandboxv1.ExecResponse) error) error {
		<-ctx.Done()
		return ctx.Err()
	})
	dctx, dcancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer dcancel()
	_, err = c.Sandbox("sb-a").ExecStream(dctx, ExecRequest{Argv: []string{"sleep", "1000"}}, nil, nil)
	if !errors.Is(err, ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ExecStream past its deadline = %v, want ErrDeadlineExceeded and context.DeadlineExceeded", err)
	}
}

func TestExitStatusCode(t *testing.T) {
	tests := []struct {
		st   ExitStatus
		want int
	}{
		{ExitStatus{}, 0},
		{ExitStatus{ExitCode: 2}, 2},
		{ExitStatus{Signal: 9}, 137},
		{ExitStatus{Signal: 9, TimedOut: true}, 124},
		{ExitStatus{Signal: 9, OOMKilled: true}, 137},
	}
	for _, tt := range tests {
		if got := tt.st.Code(); got != tt.want {
			t.Errorf("%+v.Code() = %d, want %d", tt.st, got, tt.want)
		}
	}
}

// TestTimedOutExitStatus checks a timed-out exec as the API reports it:
// timed out, signal 9, no exit code, Code 124 (as the Python SDK's).
func TestTimedOutExitStatus(t *testing.T) {
	st := exitStatus("ex-1", &sandboxv1.ExecExit{Signal: 9, TimedOut: true, Duration: durationpb.New(time.Second)})
	if !st.TimedOut || st.Signal != 9 || st.ExitCode != 0 || st.Code() != 124 || st.Duration != time.Second || st.ExecID != "ex-1" {
		t.Errorf("a timed-out exec's status = %+v, want timed out, signal 9, no exit code, code 124", st)
	}
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }
