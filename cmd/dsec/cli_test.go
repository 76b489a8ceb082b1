package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

const (
	testKey = "dsec_cli_test_key"
	sbID    = "node1-aaaaaaaaaaaa"
)

// fakeAPI is a sandbox API for the CLI's tests: it records requests and
// answers from its fields.
type fakeAPI struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler

	mu sync.Mutex
	// guarded by mu
	calls     []proto.Message
	nextID    int
	failItem  int // BatchCreate item that fails, -1 for none
	exit      *sandboxv1.ExecExit
	execInfos []*sandboxv1.ExecInfo
	tars      map[string][]byte // by path
	stdin     chan *sandboxv1.WriteStdinRequest
	events    []*sandboxv1.Event
	sessions  []*sandboxv1.Session         // ListSessions answers
	grade     *sandboxv1.GradeFromResponse // GradeFrom answers
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{failItem: -1, tars: map[string][]byte{}, stdin: make(chan *sandboxv1.WriteStdinRequest, 64),
		exit: &sandboxv1.ExecExit{}}
}

func (f *fakeAPI) record(m proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, m)
}

// callsOf returns the recorded requests of m's type.
func callsOf[M proto.Message](f *fakeAPI) []M {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []M
	for _, c := range f.calls {
		if m, ok := c.(M); ok {
			out = append(out, m)
		}
	}
	return out
}

var fakeTime = timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))

func (f *fakeAPI) sandbox(req *sandboxv1.CreateRequest) *sandboxv1.Sandbox {
	f.nextID++
	id := "node1-" + strings.Repeat(string(rune('a'+f.nextID)), 12)
	return &sandboxv1.Sandbox{Id: id, Image: req.GetImage(), State: sandboxv1.State_STATE_RUNNING, Labels: req.GetLabels(),
		CreatedAt: fakeTime, ExpiresAt: timestamppb.New(fakeTime.AsTime().Add(time.Hour))}
}

func (f *fakeAPI) Create(_ context.Context, req *connect.Request[sandboxv1.CreateRequest]) (*connect.Response[sandboxv1.CreateResponse], error) {
	f.record(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	return connect.NewResponse(&sandboxv1.CreateResponse{Sandbox: f.sandbox(req.Msg)}), nil
}

func (f *fakeAPI) BatchCreate(_ context.Context, req *connect.Request[sandboxv1.BatchCreateRequest]) (*connect.Response[sandboxv1.BatchCreateResponse], error) {
	f.record(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &sandboxv1.BatchCreateResponse{}
	for i := range req.Msg.GetCount() {
		r := &sandboxv1.BatchCreateResult{Index: i}
		if int(i) == f.failItem {
			r.Error = &sandboxv1.ItemError{Code: "resource_exhausted", Message: "the node is full", RetryAfter: durationpb.New(5 * time.Second)}
		} else {
			r.Sandbox = f.sandbox(req.Msg.GetTemplate())
		}
		resp.Results = append(resp.Results, r)
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeAPI) Delete(_ context.Context, req *connect.Request[sandboxv1.DeleteRequest]) (*connect.Response[sandboxv1.DeleteResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&sandboxv1.DeleteResponse{Deleted: []string{req.Msg.GetId()}}), nil
}

// Exec echoes the request's stdin, then what WriteStdin sends until it
// closes the input, and exits with f.exit; detached, it only starts.
func (f *fakeAPI) Exec(ctx context.Context, req *connect.Request[sandboxv1.ExecRequest], stream *connect.ServerStream[sandboxv1.ExecResponse]) error {
	f.record(req.Msg)
	if err := stream.Send(&sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Started{Started: &sandboxv1.ExecStarted{ExecId: "ex-1"}}}); err != nil {
		return err
	}
	if req.Msg.GetDetach() {
		return nil
	}
	if argv := req.Msg.GetArgv(); len(argv) > 0 && argv[0] == "sleep" {
		if err := stream.Send(&sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Output{Output: &sandboxv1.OutputChunk{
			Stream: sandboxv1.Stream_STREAM_STDOUT, Data: []byte("sleeping\n")}}}); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	out := func(s sandboxv1.Stream, data []byte) error {
		return stream.Send(&sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Output{Output: &sandboxv1.OutputChunk{Stream: s, Data: data}}})
	}
	if err := out(sandboxv1.Stream_STREAM_STDERR, []byte("starting\n")); err != nil {
		return err
	}
	if len(req.Msg.GetStdin()) > 0 {
		if err := out(sandboxv1.Stream_STREAM_STDOUT, req.Msg.GetStdin()); err != nil {
			return err
		}
	}
	for open := req.Msg.GetStdinOpen() || req.Msg.GetTty(); open; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case w := <-f.stdin:
			if len(w.GetData()) > 0 {
				if err := out(sandboxv1.Stream_STREAM_STDOUT, w.GetData()); err != nil {
					return err
				}
			}
			// Ctrl-D on a terminal ends the fake's shell.
			open = !w.GetClose() && !(req.Msg.GetTty() && bytes.Contains(w.GetData(), []byte{4}))
		}
	}
	f.mu.Lock()
	exit := f.exit
	f.mu.Unlock()
	return stream.Send(&sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Exit{Exit: exit}})
}

func (f *fakeAPI) WriteStdin(_ context.Context, req *connect.Request[sandboxv1.WriteStdinRequest]) (*connect.Response[sandboxv1.WriteStdinResponse], error) {
	f.stdin <- req.Msg
	return connect.NewResponse(&sandboxv1.WriteStdinResponse{}), nil
}

func (f *fakeAPI) Signal(_ context.Context, req *connect.Request[sandboxv1.SignalRequest]) (*connect.Response[sandboxv1.SignalResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&sandboxv1.SignalResponse{}), nil
}

func (f *fakeAPI) ResizeTTY(_ context.Context, req *connect.Request[sandboxv1.ResizeTTYRequest]) (*connect.Response[sandboxv1.ResizeTTYResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&sandboxv1.ResizeTTYResponse{}), nil
}

func (f *fakeAPI) Attach(_ context.Context, req *connect.Request[sandboxv1.AttachRequest], stream *connect.ServerStream[sandboxv1.ExecResponse]) error {
	f.record(req.Msg)
	if err := stream.Send(&sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Output{Output: &sandboxv1.OutputChunk{
		Stream: sandboxv1.Stream_STREAM_STDOUT, Offset: req.Msg.GetStdoutOffset(), Data: []byte("replayed\n")}}}); err != nil {
		return err
	}
	f.mu.Lock()
	exit := f.exit
	f.mu.Unlock()
	return stream.Send(&sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Exit{Exit: exit}})
}

func (f *fakeAPI) ListExecs(_ context.Context, req *connect.Request[sandboxv1.ListExecsRequest]) (*connect.Response[sandboxv1.ListExecsResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return connect.NewResponse(&sandboxv1.ListExecsResponse{Execs: f.execInfos}), nil
}

func (f *fakeAPI) Stats(_ context.Context, req *connect.Request[sandboxv1.StatsRequest]) (*connect.Response[sandboxv1.StatsResponse], error) {
	f.record(req.Msg)
	if req.Msg.GetId() == netSbID {
		return connect.NewResponse(&sandboxv1.StatsResponse{CpuUsage: durationpb.New(time.Second), CpusLimit: 1, MemoryLimit: 512 << 20,
			NetBytesIn: 2 << 20, NetBytesOut: 512 << 10, NetConnectionsOut: 9, NetDenied: 4, Networked: true}), nil
	}
	if req.Msg.GetId() != sbID {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("sandbox "+req.Msg.GetId()+": not found"))
	}
	return connect.NewResponse(&sandboxv1.StatsResponse{CpuUsage: durationpb.New(1500 * time.Millisecond), CpusLimit: 1,
		MemoryBytes: 64 << 20, MemoryLimit: 512 << 20, Pids: 3, PidsLimit: 4096, DiskBytes: 1 << 20, DiskLimit: 10 << 30,
		OutputBytes: 2048, OutputLimit: 1 << 30}), nil
}

func (f *fakeAPI) SetTimeout(_ context.Context, req *connect.Request[sandboxv1.SetTimeoutRequest]) (*connect.Response[sandboxv1.SetTimeoutResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&sandboxv1.SetTimeoutResponse{Sandbox: &sandboxv1.Sandbox{Id: req.Msg.GetId(),
		ExpiresAt: timestamppb.New(time.Now().Add(req.Msg.GetTtl().AsDuration())), IdleTtl: durationpb.New(15 * time.Minute)}}), nil
}

func (f *fakeAPI) UpdateLabels(_ context.Context, req *connect.Request[sandboxv1.UpdateLabelsRequest]) (*connect.Response[sandboxv1.UpdateLabelsResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&sandboxv1.UpdateLabelsResponse{Sandbox: &sandboxv1.Sandbox{Id: req.Msg.GetId(),
		Labels: map[string]string{"keep": "1", "a": "1"}}}), nil
}

func (f *fakeAPI) Watch(_ context.Context, req *connect.Request[sandboxv1.WatchRequest], stream *connect.ServerStream[sandboxv1.WatchResponse]) error {
	f.record(req.Msg)
	f.mu.Lock()
	events := f.events
	f.mu.Unlock()
	for _, ev := range events {
		if err := stream.Send(&sandboxv1.WatchResponse{Msg: &sandboxv1.WatchResponse_Event{Event: ev}}); err != nil {
			return err
		}
	}
	return connect.NewError(connect.CodeUnavailable, errors.New("apiserver stopping"))
}

func (f *fakeAPI) Stat(_ context.Context, req *connect.Request[sandboxv1.StatRequest]) (*connect.Response[sandboxv1.StatResponse], error) {
	f.mu.Lock()
	_, isTree := f.tars[req.Msg.GetPath()]
	f.mu.Unlock()
	switch {
	case isTree || req.Msg.GetPath() == "/work":
		return connect.NewResponse(&sandboxv1.StatResponse{Info: &sandboxv1.FileInfo{Path: req.Msg.GetPath(), IsDir: true, Type: "dir", Mode: 0o755}}), nil
	case req.Msg.GetPath() == "/etc/hostname":
		return connect.NewResponse(&sandboxv1.StatResponse{Info: &sandboxv1.FileInfo{Path: req.Msg.GetPath(), Type: "file", Mode: 0o644, Size: 5}}), nil
	}
	return nil, connect.NewError(connect.CodeNotFound, errors.New(req.Msg.GetPath()+": no such file"))
}

func (f *fakeAPI) ReadFile(_ context.Context, req *connect.Request[sandboxv1.ReadFileRequest], stream *connect.ServerStream[sandboxv1.ReadFileResponse]) error {
	return stream.Send(&sandboxv1.ReadFileResponse{Info: &sandboxv1.FileInfo{Path: req.Msg.GetPath(), Mode: 0o640, Size: 5}, Data: []byte("sb-a\n")})
}

func (f *fakeAPI) ListDir(_ context.Context, req *connect.Request[sandboxv1.ListDirRequest]) (*connect.Response[sandboxv1.ListDirResponse], error) {
	return connect.NewResponse(&sandboxv1.ListDirResponse{Entries: []*sandboxv1.FileInfo{
		{Path: "/w/z", Name: "z", Type: "file", Mode: 0o644, Size: 12, ModTime: fakeTime},
		{Path: "/w/l", Name: "l", Type: "symlink", Mode: 0o777, LinkTarget: "z", ModTime: fakeTime},
	}, Truncated: true}), nil
}

func (f *fakeAPI) MakeDir(_ context.Context, req *connect.Request[sandboxv1.MakeDirRequest]) (*connect.Response[sandboxv1.MakeDirResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&sandboxv1.MakeDirResponse{}), nil
}

func (f *fakeAPI) Remove(_ context.Context, req *connect.Request[sandboxv1.RemoveRequest]) (*connect.Response[sandboxv1.RemoveResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&sandboxv1.RemoveResponse{}), nil
}

func (f *fakeAPI) Rename(_ context.Context, req *connect.Request[sandboxv1.RenameRequest]) (*connect.Response[sandboxv1.RenameResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&sandboxv1.RenameResponse{}), nil
}

func (f *fakeAPI) UploadTar(_ context.Context, stream *connect.ClientStream[sandboxv1.UploadTarRequest]) (*connect.Response[sandboxv1.UploadTarResponse], error) {
	var header *sandboxv1.UploadTarHeader
	var buf bytes.Buffer
	for stream.Receive() {
		if h := stream.Msg().GetHeader(); h != nil {
			header = h
		}
		buf.Write(stream.Msg().GetData())
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	f.record(header)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tars[header.GetPath()] = buf.Bytes()
	return connect.NewResponse(&sandboxv1.UploadTarResponse{}), nil
}

// WriteFile takes the whole stream, as a node does, and keeps nothing:
// a copy refused part way (--max-size) is refused by the CLI, not by a
// server that answered first.
func (f *fakeAPI) WriteFile(_ context.Context, stream *connect.ClientStream[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error) {
	for stream.Receive() {
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.WriteFileResponse{}), nil
}

func (f *fakeAPI) DownloadTar(_ context.Context, req *connect.Request[sandboxv1.DownloadTarRequest], stream *connect.ServerStream[sandboxv1.DownloadTarResponse]) error {
	f.mu.Lock()
	data, ok := f.tars[req.Msg.GetPath()]
	f.mu.Unlock()
	if !ok {
		return connect.NewError(connect.CodeNotFound, errors.New("no tree"))
	}
	return stream.Send(&sandboxv1.DownloadTarResponse{Data: data})
}

// startFake serves f and returns its address.
func startFake(t *testing.T, f *fakeAPI) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(f))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// dsecRun runs the CLI with args against addr and returns its output and
// exit code, as main would.
func dsecRun(t *testing.T, addr, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out bytes.Buffer
	errOut, code := dsecRunIO(t, addr, strings.NewReader(stdin), &out, args...)
	return out.String(), errOut, code
}

// dsecRunIO is dsecRun with the given input and output.
func dsecRunIO(t *testing.T, addr string, in io.Reader, out io.Writer, args ...string) (stderr string, code int) {
	t.Helper()
	root := newRootCmd()
	var errw bytes.Buffer
	root.SetArgs(append([]string{"--addr", addr, "--api-key", testKey}, args...))
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(&errw)
	err := root.ExecuteContext(t.Context())
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.code
	default:
		errw.WriteString("dsec: " + err.Error() + "\n")
		code = exitCodeOf(err)
	}
	return errw.String(), code
}

func TestRunDetachedBatch(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	f.mu.Lock()
	f.failItem = 1
	f.mu.Unlock()
	out, errOut, code := dsecRun(t, addr, "", "run", "-d", "--count", "3", "--idempotency-key", "job-1", "--label", "j=x", "busybox")
	if code != 125 {
		t.Errorf("run -d --count 3 with a failed item exits %d, want 125", code)
	}
	if out != "" {
		t.Errorf("run -d --count 3 with a failed item printed %q, want no IDs (the created ones are deleted)", out)
	}
	for _, want := range []string{"created 2 of 3 sandboxes; 1 failed", "1 × the node is full (retry after 5s)", "the 2 created were deleted (--keep-partial keeps them)"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("run -d --count 3 stderr = %q, want it to say %q", errOut, want)
		}
	}
	if dels := callsOf[*sandboxv1.DeleteRequest](f); len(dels) != 2 {
		t.Errorf("run -d --count 3 with a failed item deleted %v, want the 2 created", dels)
	}
	batch := callsOf[*sandboxv1.BatchCreateRequest](f)
	want := &sandboxv1.BatchCreateRequest{Count: 3, Template: &sandboxv1.CreateRequest{Image: "busybox", Labels: map[string]string{"j": "x"},
		Resources: &sandboxv1.Resources{}, IdempotencyKey: "job-1"}}
	if len(batch) != 1 || !cmp.Equal(want, batch[0], protocmp.Transform()) {
		t.Errorf("BatchCreate requests = %v, want [%v]", batch, want)
	}

	out, errOut, code = dsecRun(t, addr, "", "run", "-d", "--count", "3", "--keep-partial", "busybox")
	if got := strings.Fields(out); code != 125 || len(got) != 2 {
		t.Errorf("run -d --count 3 --keep-partial = %q, exit %d; want the 2 IDs created, exit 125", out, code)
	}
	if !strings.Contains(errOut, "created 2 of 3 sandboxes; 1 failed") || !strings.Contains(errOut, "kept (--keep-partial)") {
		t.Errorf("run -d --count 3 --keep-partial stderr = %q, want how many were created and kept", errOut)
	}
	if dels := callsOf[*sandboxv1.DeleteRequest](f); len(dels) != 2 {
		t.Errorf("run -d --count 3 --keep-partial: deletes so far %v, want only the 2 of the first run", dels)
	}

	out, _, code = dsecRun(t, addr, "", "run", "-d", "busybox")
	if code != 0 || len(strings.Fields(out)) != 1 || len(callsOf[*sandboxv1.CreateRequest](f)) != 1 {
		t.Errorf("run -d = %q, exit %d; want one ID from one Create", out, code)
	}

	for _, args := range [][]string{
		{"run", "busybox"}, // a shell needs a terminal
		{"run", "--count", "2", "busybox", "--", "true"},
		{"run", "-d", "--count", "1001", "busybox"},
		{"run", "-d", "busybox", "--", "true"},
		{"run", "-t", "busybox", "--", "sh"},
	} {
		if _, errOut, code := dsecRun(t, addr, "", args...); code != 2 {
			t.Errorf("dsec %q exits %d (%s), want 2", args, code, errOut)
		}
	}
	if n := len(callsOf[*sandboxv1.CreateRequest](f)); n != 1 {
		t.Errorf("usage errors created %d sandboxes", n-1)
	}
}

func TestRunAndExecStreams(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	f.mu.Lock()
	f.exit = &sandboxv1.ExecExit{ExitCode: 3}
	f.mu.Unlock()

	input := strings.Repeat("line of input\n", 5000)
	out, errOut, code := dsecRun(t, addr, input, "exec", "-i", sbID, "--", "cat")
	if code != 3 || out != input || errOut != "starting\n" {
		t.Errorf("exec -i = %d bytes out, stderr %q, exit %d; want the input echoed, \"starting\\n\", 3", len(out), errOut, code)
	}
	execs := callsOf[*sandboxv1.ExecRequest](f)
	if len(execs) != 1 || !execs[0].GetStdinOpen() || len(execs[0].GetStdin()) != 0 || execs[0].GetTty() {
		t.Errorf("exec -i sent %v, want stdin_open and no inline stdin", execs)
	}

	out, _, code = dsecRun(t, addr, "", "exec", "-d", sbID, "--", "sleep", "100")
	execs = callsOf[*sandboxv1.ExecRequest](f)
	if code != 0 || out != "ex-1\n" || !execs[1].GetDetach() {
		t.Errorf("exec -d = %q, exit %d, request %v; want ex-1 from a detached exec", out, code, execs[1])
	}

	f.mu.Lock()
	f.exit = &sandboxv1.ExecExit{Signal: 9, OomKilled: true}
	f.mu.Unlock()
	out, _, code = dsecRun(t, addr, "", "run", "--memory", "64M", "busybox", "--", "sh", "-c", "x")
	if code != 137 {
		t.Errorf("run of a command killed by signal 9 exits %d, want 137", code)
	}
	if dels := callsOf[*sandboxv1.DeleteRequest](f); len(dels) != 1 {
		t.Errorf("run deleted %d sandboxes, want 1", len(dels))
	}
	_ = out
}

func TestAttachExecsKill(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	tests := []struct {
		exit     *sandboxv1.ExecExit
		wantCode int
		wantErr  string
	}{
		{&sandboxv1.ExecExit{ExitCode: 0}, 0, ""},
		{&sandboxv1.ExecExit{ExitCode: 4}, 4, ""},
		{&sandboxv1.ExecExit{Signal: 15}, 143, ""},
		{&sandboxv1.ExecExit{Signal: 9, TimedOut: true}, 124, ""},
		{&sandboxv1.ExecExit{Lost: true}, 125, "its end was lost"},
	}
	for _, tt := range tests {
		f.mu.Lock()
		f.exit = tt.exit
		f.mu.Unlock()
		out, errOut, code := dsecRun(t, addr, "", "attach", "--stdout-offset", "7", sbID, "ex-5")
		if code != tt.wantCode || out != "replayed\n" || !strings.Contains(errOut, tt.wantErr) {
			t.Errorf("attach to an exec ending %v = %q, %q, exit %d; want exit %d", tt.exit, out, errOut, code, tt.wantCode)
		}
	}
	att := callsOf[*sandboxv1.AttachRequest](f)
	if want := (&sandboxv1.AttachRequest{SandboxId: sbID, ExecId: "ex-5", StdoutOffset: 7}); !cmp.Equal(want, att[0], protocmp.Transform()) {
		t.Errorf("AttachRequest = %v, want %v", att[0], want)
	}

	f.mu.Lock()
	f.execInfos = []*sandboxv1.ExecInfo{
		{ExecId: "ex-1", Argv: []string{"make", "all"}, StartedAt: fakeTime, Exit: &sandboxv1.ExecExit{ExitCode: 2}, StdoutBytes: 2048},
		{ExecId: "ex-2", Argv: []string{"sh", "-c", "sleep 1; echo 'done'"}, StartedAt: fakeTime, Running: true},
		{ExecId: "ex-3", Argv: []string{"yes"}, StartedAt: fakeTime, Exit: &sandboxv1.ExecExit{Signal: 9}},
		{ExecId: "ex-4", Argv: []string{"sleep", "9"}, StartedAt: fakeTime, Exit: &sandboxv1.ExecExit{Signal: 9, TimedOut: true, Duration: durationpb.New(1500 * time.Millisecond)}},
		{ExecId: "ex-5", Argv: []string{"x"}, StartedAt: fakeTime, Exit: &sandboxv1.ExecExit{Lost: true}},
	}
	f.mu.Unlock()
	out, _, code := dsecRun(t, addr, "", "execs", sbID)
	if code != 0 {
		t.Fatalf("execs exits %d", code)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	wantStatus := []string{"exit 2", "running", "signal 9 (KILL)", "timed out", "lost"}
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "EXEC ID") {
		t.Fatalf("execs printed:\n%s\nwant a header and 5 lines", out)
	}
	for i, st := range wantStatus {
		if !strings.Contains(lines[i+1], st) {
			t.Errorf("execs line %q, want status %q", lines[i+1], st)
		}
	}
	if !strings.Contains(lines[2], `sh -c 'sleep 1; echo '\''done'\'''`) || !strings.Contains(lines[1], "2K") {
		t.Errorf("execs lines %q, %q: want the command shell-quoted and sizes", lines[1], lines[2])
	}
	out, _, _ = dsecRun(t, addr, "", "execs", "-o", "json", sbID)
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 5 || got[0]["execId"] != "ex-1" {
		t.Fatalf("execs -o json = %s, %v; want 5 objects with the API's names", out, err)
	}
	// The API's JSON names, a duration string, an RFC 3339 time; a timed-out
	// exec has signal 9 and no exit code.
	wantEx4 := map[string]any{"execId": "ex-4", "argv": []any{"sleep", "9"}, "startedAt": fakeTime.AsTime().Format(time.RFC3339),
		"exit": map[string]any{"signal": float64(9), "timedOut": true, "duration": "1.500s"}}
	if !cmp.Equal(got[3], wantEx4) {
		t.Errorf("execs -o json for a timed-out exec = %v, want %v", got[3], wantEx4)
	}

	for sig, want := range map[string]int32{"KILL": 9, "SIGUSR1": 10, "int": 2, "3": 3, "RTMIN+2": 36} {
		if _, errOut, code := dsecRun(t, addr, "", "kill", "-s", sig, sbID, "ex-2"); code != 0 {
			t.Fatalf("kill -s %s exits %d: %s", sig, code, errOut)
		}
		sigs := callsOf[*sandboxv1.SignalRequest](f)
		if last := sigs[len(sigs)-1]; last.GetSignal() != want || last.GetExecId() != "ex-2" {
			t.Errorf("kill -s %s sent %v, want signal %d", sig, last, want)
		}
	}
	if _, _, code := dsecRun(t, addr, "", "kill", sbID, "ex-2"); code != 0 || callsOf[*sandboxv1.SignalRequest](f)[5].GetSignal() != 15 {
		t.Errorf("kill without -s = exit %d, want SIGTERM sent", code)
	}
	for _, bad := range []string{"FOO", "0", "65", "RTMIN+31"} {
		if _, _, code := dsecRun(t, addr, "", "kill", "-s", bad, sbID, "ex-2"); code != 2 {
			t.Errorf("kill -s %s exits %d, want 2", bad, code)
		}
	}
}

func TestStatsTimeoutLabelWatch(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	out, errOut, code := dsecRun(t, addr, "", "stats", "--sample", "0", sbID)
	if code != 0 || !strings.Contains(out, "64M / 512M") || !strings.Contains(out, "3 / 4096") || !strings.Contains(out, "1.50s") {
		t.Errorf("stats = %q, %q, exit %d; want memory, pids and CPU time", out, errOut, code)
	}
	out, _, code = dsecRun(t, addr, "", "stats", "--sample", "10ms", "-o", "json", sbID, "node1-zzzzzzzzzzzz")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil || code != 125 || len(rows) != 1 || rows[0]["sandboxId"] != sbID || rows[0]["cpuPercent"] == nil ||
		rows[0]["cpuUsage"] != "1.500s" || rows[0]["memoryBytes"] != "67108864" {
		t.Errorf("stats -o json with a missing sandbox = %s, exit %d (%v); want one row with the API's names, cpuUsage \"1.500s\", cpuPercent and exit 125", out, code, err)
	}

	out, _, code = dsecRun(t, addr, "", "timeout", sbID, "--ttl", "2h")
	if code != 0 || !strings.Contains(out, "idle TTL 15m") {
		t.Errorf("timeout = %q, exit %d", out, code)
	}
	if got := callsOf[*sandboxv1.SetTimeoutRequest](f); len(got) != 1 || got[0].GetTtl().AsDuration() != 2*time.Hour || got[0].GetIdleTtl() != nil {
		t.Errorf("timeout sent %v, want ttl 2h only", got)
	}
	if _, _, code := dsecRun(t, addr, "", "timeout", sbID); code != 2 {
		t.Errorf("timeout without TTLs exits %d, want 2", code)
	}

	out, _, code = dsecRun(t, addr, "", "label", sbID, "a=1", "b-", "c=x=y")
	if code != 0 || out != "a=1,keep=1\n" {
		t.Errorf("label = %q, exit %d", out, code)
	}
	want := &sandboxv1.UpdateLabelsRequest{Id: sbID, Set: map[string]string{"a": "1", "c": "x=y"}, Remove: []string{"b"}}
	if got := callsOf[*sandboxv1.UpdateLabelsRequest](f); len(got) != 1 || !cmp.Equal(want, got[0], protocmp.Transform()) {
		t.Errorf("label sent %v, want %v", got, want)
	}

	f.mu.Lock()
	f.events = []*sandboxv1.Event{
		{Type: sandboxv1.EventType_EVENT_TYPE_CREATED, Sandbox: &sandboxv1.Sandbox{Id: sbID}, Time: fakeTime},
		{Type: sandboxv1.EventType_EVENT_TYPE_TTL_EXPIRED, Sandbox: &sandboxv1.Sandbox{Id: sbID}, Reason: "idle for 15m", Time: fakeTime},
	}
	f.mu.Unlock()
	out, errOut, code = dsecRun(t, addr, "", "watch", "-l", "job=x", "--initial")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 125 || len(lines) != 2 || !strings.Contains(lines[1], "ttl_expired") || !strings.Contains(lines[1], "idle for 15m") ||
		!strings.Contains(errOut, "apiserver stopping") {
		t.Errorf("watch = %q, %q, exit %d; want 2 lines, then the stream's error and 125", out, errOut, code)
	}
	if got := callsOf[*sandboxv1.WatchRequest](f); !got[0].GetInitial() || got[0].GetSelector()["job"] != "x" {
		t.Errorf("watch sent %v", got[0])
	}
	out, _, _ = dsecRun(t, addr, "", "watch", "-o", "json")
	dec := json.NewDecoder(strings.NewReader(out))
	n := 0
	for {
		var ev map[string]any
		if err := dec.Decode(&ev); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("watch -o json line %d: %v", n, err)
		}
		if sb, _ := ev["sandbox"].(map[string]any); sb == nil || sb["id"] == nil || ev["Sandbox"] != nil {
			t.Errorf("watch -o json event %v, want the API's names (sandbox.id)", ev)
		}
		n++
	}
	if n != 2 {
		t.Errorf("watch -o json printed %d objects, want 2", n)
	}
}

func TestCpDirectoriesAndFs(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	local := filepath.Join(t.TempDir(), "proj")
	if err := os.MkdirAll(filepath.Join(local, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(local, "src", "main.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("src/main.go", filepath.Join(local, "link")); err != nil {
		t.Fatal(err)
	}
	// /work exists and is a directory: the tree lands in /work/proj.
	if _, errOut, code := dsecRun(t, addr, "", "cp", local, sbID+":/work"); code != 0 {
		t.Fatalf("cp DIR ID:/work exits %d: %s", code, errOut)
	}
	heads := callsOf[*sandboxv1.UploadTarHeader](f)
	if len(heads) != 1 || heads[0].GetPath() != "/work/proj" || !heads[0].GetMakeParents() {
		t.Errorf("cp DIR sent %v, want an upload to /work/proj with make_parents", heads)
	}
	f.mu.Lock()
	archive := f.tars["/work/proj"]
	f.mu.Unlock()
	var names []string
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, hdr.Name)
	}
	if diff := cmp.Diff([]string{"link", "src/", "src/main.go"}, names); diff != "" {
		t.Errorf("uploaded archive (-want +got):\n%s", diff)
	}

	// Back out: into a missing directory, then into an existing one.
	back := filepath.Join(t.TempDir(), "back")
	if _, errOut, code := dsecRun(t, addr, "", "cp", sbID+":/work/proj", back); code != 0 {
		t.Fatalf("cp ID:/dir DIR exits %d: %s", code, errOut)
	}
	if data, err := os.ReadFile(filepath.Join(back, "link")); err != nil || string(data) != "package main\n" {
		t.Errorf("copied back link = %q, %v", data, err)
	}
	if _, errOut, code := dsecRun(t, addr, "", "cp", sbID+":/work/proj", back); code != 0 {
		t.Fatalf("cp ID:/dir EXISTING exits %d: %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(back, "proj", "src", "main.go")); err != nil {
		t.Errorf("cp into an existing directory: %v, want back/proj/src/main.go", err)
	}
	out, _, code := dsecRun(t, addr, "", "cp", sbID+":/work/proj", "-")
	if code != 0 || !bytes.Equal([]byte(out), archive) {
		t.Errorf("cp ID:/dir - = %d bytes, exit %d; want the %d-byte archive", len(out), code, len(archive))
	}
	// A file still copies as a file.
	dst := filepath.Join(t.TempDir(), "hostname")
	if _, errOut, code := dsecRun(t, addr, "", "cp", sbID+":/etc/hostname", dst); code != 0 {
		t.Fatalf("cp ID:/file FILE exits %d: %s", code, errOut)
	}
	if fi, err := os.Stat(dst); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("copied file = %v, %v; want mode 0640", fi, err)
	}

	out, errOut, code := dsecRun(t, addr, "", "fs", "ls", sbID+":/w")
	if code != 0 || !strings.Contains(out, "l -> z") || !strings.Contains(errOut, "more entries") {
		t.Errorf("fs ls = %q, %q, exit %d", out, errOut, code)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.HasSuffix(lines[1], "l -> z") {
		t.Errorf("fs ls lines = %q, want header, l, z sorted", lines)
	}
	if _, _, code := dsecRun(t, addr, "", "fs", "mkdir", "-p", "--mode", "0700", sbID+":/a", sbID+":/b"); code != 0 {
		t.Errorf("fs mkdir exits %d", code)
	}
	if got := callsOf[*sandboxv1.MakeDirRequest](f); len(got) != 2 || !got[1].GetParents() || got[1].GetMode() != 0o700 || got[1].GetPath() != "/b" {
		t.Errorf("fs mkdir sent %v", got)
	}
	if _, _, code := dsecRun(t, addr, "", "fs", "rm", "-r", sbID+":/a"); code != 0 || !callsOf[*sandboxv1.RemoveRequest](f)[0].GetRecursive() {
		t.Errorf("fs rm -r exits %d or was not recursive", code)
	}
	if _, _, code := dsecRun(t, addr, "", "fs", "mv", "-f", sbID+":/a", "/c"); code != 0 {
		t.Errorf("fs mv exits %d", code)
	}
	wantMv := &sandboxv1.RenameRequest{SandboxId: sbID, From: "/a", To: "/c", Overwrite: true}
	if got := callsOf[*sandboxv1.RenameRequest](f); len(got) != 1 || !cmp.Equal(wantMv, got[0], protocmp.Transform()) {
		t.Errorf("fs mv sent %v, want %v", got, wantMv)
	}
	if _, _, code := dsecRun(t, addr, "", "fs", "mv", sbID+":/a", "node1-bbbbbbbbbbbb:/c"); code != 2 {
		t.Errorf("fs mv across sandboxes exits %d, want 2", code)
	}
}

func TestParseLabelEdits(t *testing.T) {
	tests := []struct {
		in      []string
		set     map[string]string
		remove  []string
		wantErr bool
	}{
		{in: []string{"a=1", "b-", "c="}, set: map[string]string{"a": "1", "c": ""}, remove: []string{"b"}},
		{in: []string{"x-y-"}, remove: []string{"x-y"}},
		{in: []string{"=1"}, wantErr: true},
		{in: []string{"-"}, wantErr: true},
		{in: []string{"plain"}, wantErr: true},
	}
	for _, tt := range tests {
		set, remove, err := parseLabelEdits(tt.in)
		if (err != nil) != tt.wantErr || !cmp.Equal(set, tt.set) || !cmp.Equal(remove, tt.remove) {
			t.Errorf("parseLabelEdits(%q) = %v, %v, %v; want %v, %v, error %v", tt.in, set, remove, err, tt.set, tt.remove, tt.wantErr)
		}
	}
}

func TestSignalNames(t *testing.T) {
	for n := 1; n <= 31; n++ {
		name := signalName(n)
		if name == "" {
			t.Errorf("signalName(%d) is empty", n)
			continue
		}
		if got, err := parseSignal(name); err != nil || got != n {
			t.Errorf("parseSignal(%q) = %d, %v; want %d", name, got, err, n)
		}
	}
	for in, want := range map[string]int{"RTMIN": 34, "RTMAX": 64, "RTMAX-2": 62, "sigterm": 15, "64": 64} {
		if got, err := parseSignal(in); err != nil || got != want {
			t.Errorf("parseSignal(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestUpRefusesBadChunkSizes(t *testing.T) {
	for _, size := range []string{"3M", "1K", "128M", "x"} {
		_, errOut, code := dsecRun(t, "http://127.0.0.1:1", "", "up", "--state-dir", t.TempDir(), "--chunk-size", size)
		if code != 2 || !strings.Contains(errOut, "--chunk-size") {
			t.Errorf("dsec up --chunk-size %s = exit %d, %q; want a usage error naming the flag", size, code, errOut)
		}
	}
}

func TestDistinctReasons(t *testing.T) {
	full := errors.New("node n1 is full")
	errs := []error{full, errors.New("a"), full, errors.New("b"), errors.New("c"), full, errors.New("c")}
	got := distinctReasons(errs, 3)
	if all := distinctReasons(errs, 5); len(all) != 4 {
		t.Errorf("distinctReasons(5) = %q, want the 4 distinct reasons", all)
	}
	want := []string{"3 × node n1 is full", "1 × a", "1 × b", "2 more, for 1 other reason"}
	if !cmp.Equal(got, want) {
		t.Errorf("distinctReasons = %q, want %q", got, want)
	}
}
