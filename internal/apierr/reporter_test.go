package apierr

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	adminv1 "github.com/dsecproject/dsec/api/dsec/admin/v1"
	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// logBuffer collects a logger's entries as JSON objects.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// entries returns what was logged, one map per entry, values as strings.
func (b *logBuffer) entries(t *testing.T) []map[string]string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]string
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		e := map[string]string{}
		for k, v := range m {
			if k != "time" {
				e[k] = fmt.Sprint(v)
			}
		}
		out = append(out, e)
	}
	return out
}

func newLog(level slog.Level) (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: level})), b
}

var internalRe = regexp.MustCompile(`^internal error \(id ([0-9a-f]{16})\): Create failed on node n1; retry, and if it fails again, node n1's log has the details under this id$`)

var createCall = Call{Procedure: "/dsec.sandbox.v1.SandboxService/Create", Project: "p1", KeyID: "k1", Sandbox: "n1-abc"}

// TestInternalTextWithheld checks that the text of an Internal error, or
// of an error without a kind, never reaches the user: the user gets an id,
// and the log has the full text under it, once, with the call.
func TestInternalTextWithheld(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		secret string
	}{
		{"wrapped OS error", fmt.Errorf("sandbox dir: %w", &fs.PathError{Op: "mkdir", Path: "/var/lib/dsec/sandboxes/n1-abc", Err: syscall.EACCES}), "/var/lib/dsec"},
		{"runtime stderr", fmt.Errorf("crun run: %s: %w", "open `/run/dsec/crun/n1-abc/config.json`: Permission denied", errors.New("exit status 1")), "/run/dsec"},
		{"Internal kind", errdefs.Newf(errdefs.ErrInternal, "cluster state: value at /dsec/images/x is not valid JSON"), "/dsec/images"},
		{"etcd", fmt.Errorf("get node: %w", errors.New("etcdserver: leader changed")), "etcdserver"},
		{"connect error of this side", connect.NewError(connect.CodeInternal, errors.New("protocol error: /tmp/x.sock")), "/tmp/x.sock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log, buf := newLog(slog.LevelInfo)
			r := NewReporter(log, "node n1")
			var ce *connect.Error
			if !errors.As(r.ToConnect(t.Context(), createCall, tt.err), &ce) {
				t.Fatalf("ToConnect(%v) is not a *connect.Error", tt.err)
			}
			if ce.Code() != connect.CodeInternal {
				t.Errorf("ToConnect(%v) code = %v, want Internal", tt.err, ce.Code())
			}
			m := internalRe.FindStringSubmatch(ce.Message())
			if m == nil {
				t.Fatalf("ToConnect(%v) = %q, want it to match %s", tt.err, ce.Message(), internalRe)
			}
			if strings.Contains(ce.Message(), tt.secret) {
				t.Errorf("ToConnect(%v) = %q, which shows %q", tt.err, ce.Message(), tt.secret)
			}
			want := []map[string]string{{
				"level": "ERROR", "msg": "API call failed", "id": m[1], "code": "internal",
				"procedure": createCall.Procedure, "project": "p1", "key": "k1", "sandbox": "n1-abc", "err": tt.err.Error(),
			}}
			if diff := cmp.Diff(want, buf.entries(t)); diff != "" {
				t.Errorf("log (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUserFacingKeepText checks that every other kind keeps its message,
// names no id and is logged at its level.
func TestUserFacingKeepText(t *testing.T) {
	for _, k := range errdefs.Kinds {
		if k == errdefs.ErrInternal {
			continue
		}
		for _, err := range []error{
			errdefs.Newf(k, "sandbox n1-abc: %v: do this", k),
			fmt.Errorf("sandbox n1-abc: %w", k),
			errdefs.RetryAfter(errdefs.Newf(k, "no room at /workspace in the sandbox: delete files"), time.Second),
		} {
			log, buf := newLog(slog.LevelDebug)
			var ce *connect.Error
			if !errors.As(NewReporter(log, "node n1").ToConnect(t.Context(), createCall, err), &ce) {
				t.Fatalf("ToConnect(%v) is not a *connect.Error", err)
			}
			if ce.Message() != err.Error() || ce.Code() != Code(err) {
				t.Errorf("ToConnect(%v) = %v %q, want %v %q", err, ce.Code(), ce.Message(), Code(err), err.Error())
			}
			level := "DEBUG"
			if k == errdefs.ErrUnavailable {
				level = "WARN"
			}
			want := []map[string]string{{
				"level": level, "msg": "API call failed", "code": Code(err).String(),
				"procedure": createCall.Procedure, "project": "p1", "key": "k1", "sandbox": "n1-abc", "err": err.Error(),
			}}
			if diff := cmp.Diff(want, buf.entries(t)); diff != "" {
				t.Errorf("ToConnect(%v): log (-want +got):\n%s", err, diff)
			}
		}
	}
	for _, err := range []error{fmt.Errorf("exec: %w", context.Canceled), fmt.Errorf("exec: %w", context.DeadlineExceeded)} {
		got := NewReporter(nil, "node n1").ToConnect(t.Context(), createCall, err)
		if want := err.Error(); connect.CodeOf(got) == connect.CodeInternal || !strings.HasSuffix(got.Error(), want) {
			t.Errorf("ToConnect(%v) = %v, want its code and message", err, got)
		}
	}
}

// TestHostPathsCut checks the backstop for user-facing kinds: the host
// paths and URLs that typed errors wrapped with %w declare are cut, and the
// message names an id under which the log, at Info at least, has them.
func TestHostPathsCut(t *testing.T) {
	tests := []struct {
		err          error
		want, secret string
		level        string
	}{{
		err:    fmt.Errorf("upper directory: %w: %w", errdefs.ErrNotFound, &fs.PathError{Op: "open", Path: "/var/lib/dsec/sandboxes/n1-abc/upper", Err: syscall.ENOENT}),
		want:   "upper directory: not found: open …: no such file or directory",
		secret: "/var/lib/dsec", level: "INFO",
	}, {
		err:    fmt.Errorf("blob sha256:ab: %w: %w", errdefs.ErrUnavailable, &url.Error{Op: "Get", URL: "https://store.internal/b/sha256/ab?X-Amz-Signature=s3cr3t", Err: io.ErrUnexpectedEOF}),
		want:   `blob sha256:ab: unavailable: Get "…": unexpected EOF`,
		secret: "s3cr3t", level: "WARN",
	}}
	for _, tt := range tests {
		log, buf := newLog(slog.LevelInfo)
		got := NewReporter(log, "node n1").ToConnect(t.Context(), createCall, tt.err)
		re := regexp.MustCompile(`^` + regexp.QuoteMeta(tt.want) + ` \(host paths left out: node n1's log has them under id ([0-9a-f]{16})\)$`)
		m := re.FindStringSubmatch(msgOf(got))
		if m == nil || strings.Contains(got.Error(), tt.secret) {
			t.Errorf("ToConnect(%v) = %q, want %s", tt.err, msgOf(got), re)
			continue
		}
		if connect.CodeOf(got) != Code(tt.err) {
			t.Errorf("ToConnect(%v) code = %v, want %v", tt.err, connect.CodeOf(got), Code(tt.err))
		}
		e := buf.entries(t)
		if len(e) != 1 || e[0]["id"] != m[1] || e[0]["err"] != tt.err.Error() || e[0]["level"] != tt.level {
			t.Errorf("ToConnect(%v): log = %v, want one entry at %s with id %s and the full text", tt.err, e, tt.level, m[1])
		}
	}

	// What is not a host path stays: an fs.FS path, a path in the
	// sandbox's own view.
	for _, err := range []error{
		fmt.Errorf("layer: %w: %w", errdefs.ErrInvalidArgument, &fs.PathError{Op: "open", Path: "etc/passwd", Err: fs.ErrNotExist}),
		errdefs.Newf(errdefs.ErrNotFound, "no such file or directory: /etc/x in the sandbox"),
	} {
		if got := msgOf(ToConnect(err)); got != err.Error() {
			t.Errorf("ToConnect(%v) = %q, want the message as it is", err, got)
		}
	}
}

// TestRepeatsLoggedOnce checks that identical errors are logged once per
// window, every reply naming the logged entry's id, and the next entry
// counts those left out.
func TestRepeatsLoggedOnce(t *testing.T) {
	log, buf := newLog(slog.LevelInfo)
	r := NewReporter(log, "node n1")
	now := time.Unix(1e9, 0)
	r.now = func() time.Time { return now }
	err := fmt.Errorf("start: %w", errors.New("crun: /run/x: EPERM"))
	ids := map[string]int{}
	for range 100 {
		m := internalRe.FindStringSubmatch(msgOf(r.ToConnect(t.Context(), createCall, err)))
		if m == nil {
			t.Fatalf("ToConnect(%v) names no id", err)
		}
		ids[m[1]]++
	}
	other := createCall
	other.KeyID = "k2"
	r.ToConnect(t.Context(), other, err)
	if len(ids) != 1 {
		t.Errorf("100 identical errors got ids %v, want one", ids)
	}
	if e := buf.entries(t); len(e) != 2 || e[1]["key"] != "k2" {
		t.Errorf("100 identical errors and one of another key logged %d entries (%v), want 2", len(e), e)
	}

	now = now.Add(RepeatWindow)
	m := internalRe.FindStringSubmatch(msgOf(r.ToConnect(t.Context(), createCall, err)))
	e := buf.entries(t)
	if last := e[len(e)-1]; len(e) != 3 || m == nil || last["id"] != m[1] || last["repeated"] != "99" || ids[m[1]] != 0 {
		t.Errorf("after the window: log = %v, reply id %v; want a third entry with a new id and repeated=99", e, m)
	}
}

// edgeAPI is a sandbox service whose every call fails with err.
type edgeAPI struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
	err error
}

func (a *edgeAPI) Get(context.Context, *connect.Request[sandboxv1.GetRequest]) (*connect.Response[sandboxv1.GetResponse], error) {
	return nil, a.err
}

func (a *edgeAPI) Exec(context.Context, *connect.Request[sandboxv1.ExecRequest], *connect.ServerStream[sandboxv1.ExecResponse]) error {
	return a.err
}

func (a *edgeAPI) WriteFile(_ context.Context, s *connect.ClientStream[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error) {
	for s.Receive() {
	}
	return nil, a.err
}

// TestInterceptor runs calls of each shape through an Interceptor on a
// real server, as an edge, and their errors on through a second Reporter,
// as the API server: the edge withholds and logs the text; the API server
// passes the edge's message and id on and logs it at Debug only.
func TestInterceptor(t *testing.T) {
	edgeLog, edgeBuf := newLog(slog.LevelDebug)
	secret := "/var/lib/dsec/sandboxes/n1-abc/upper"
	failed := map[string]connect.Code{}
	var mu sync.Mutex
	i := Interceptor{
		Reporter: NewReporter(edgeLog, "node n1"),
		Caller:   func(_ context.Context, h http.Header) (string, string) { return h.Get("Project"), h.Get("Key") },
		Failed: func(p string, c connect.Code) {
			mu.Lock()
			defer mu.Unlock()
			failed[p] = c
		},
	}
	api := &edgeAPI{err: fmt.Errorf("mount: %w", &fs.PathError{Op: "mount", Path: secret, Err: syscall.EINVAL})}
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(api, connect.WithInterceptors(i)))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	client := sandboxv1connect.NewSandboxServiceClient(srv.Client(), srv.URL)

	calls := map[string]func(ctx context.Context) error{
		"Get": func(ctx context.Context) error {
			req := connect.NewRequest(&sandboxv1.GetRequest{Id: "n1-abc"})
			req.Header().Set("Project", "p1")
			req.Header().Set("Key", "k1")
			_, err := client.Get(ctx, req)
			return err
		},
		"Exec": func(ctx context.Context) error {
			req := connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "n1-abc"})
			req.Header().Set("Project", "p1")
			req.Header().Set("Key", "k1")
			s, err := client.Exec(ctx, req)
			if err != nil {
				return err
			}
			for s.Receive() {
			}
			return s.Err()
		},
		"WriteFile": func(ctx context.Context) error {
			s := client.WriteFile(ctx)
			s.RequestHeader().Set("Project", "p1")
			s.RequestHeader().Set("Key", "k1")
			_ = s.Send(&sandboxv1.WriteFileRequest{Msg: &sandboxv1.WriteFileRequest_Header{Header: &sandboxv1.WriteFileHeader{SandboxId: "n1-abc", Path: "/f"}}})
			_, err := s.CloseAndReceive()
			return err
		},
	}
	re := regexp.MustCompile(`^internal error \(id ([0-9a-f]{16})\): (\w+) failed on node n1; retry, and if it fails again, node n1's log has the details under this id$`)
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			err := call(t.Context())
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != connect.CodeInternal {
				t.Fatalf("%s = %v, want an Internal connect error", name, err)
			}
			m := re.FindStringSubmatch(ce.Message())
			if m == nil || m[2] != name {
				t.Fatalf("%s = %q, want it to match %s", name, ce.Message(), re)
			}
			var logged map[string]string
			for _, e := range edgeBuf.entries(t) {
				if e["id"] == m[1] {
					logged = e
				}
			}
			proc := "/dsec.sandbox.v1.SandboxService/" + name
			want := map[string]string{
				"level": "ERROR", "msg": "API call failed", "id": m[1], "code": "internal",
				"procedure": proc, "project": "p1", "key": "k1", "sandbox": "n1-abc", "err": api.err.Error(),
			}
			if diff := cmp.Diff(want, logged); diff != "" {
				t.Errorf("edge log of %s (-want +got):\n%s", name, diff)
			}
			mu.Lock()
			if failed[proc] != connect.CodeInternal {
				t.Errorf("Failed(%s) = %v, want Internal", proc, failed[proc])
			}
			mu.Unlock()

			// On through the API server: the edge's message, its id.
			apiLog, apiBuf := newLog(slog.LevelDebug)
			back := FromConnect(err)
			got := NewReporter(apiLog, "the API server").ToConnect(t.Context(), Call{Procedure: proc}, fmt.Errorf("on node n1: %w", back))
			if msg := msgOf(got); connect.CodeOf(got) != connect.CodeInternal || msg != "on node n1: "+ce.Message() {
				t.Errorf("API server's ToConnect(%v) = %v %q, want Internal %q", back, connect.CodeOf(got), msg, "on node n1: "+ce.Message())
			}
			if e := apiBuf.entries(t); len(e) != 1 || e[0]["level"] != "DEBUG" || e[0]["remote"] != "true" {
				t.Errorf("API server's log = %v, want one Debug entry marked remote", e)
			}
		})
	}
	if strings.Contains(edgeBuf.buf.String(), secret) != true {
		t.Errorf("the edge's log lacks %s", secret)
	}
}

func TestSandboxOf(t *testing.T) {
	const sb = "/dsec.sandbox.v1.SandboxService/"
	tests := []struct {
		procedure string
		msg       any
		want      string
	}{
		{sb + "Get", &sandboxv1.GetRequest{Id: "n1-a"}, "n1-a"},
		{sb + "Exec", &sandboxv1.ExecRequest{SandboxId: "n1-b"}, "n1-b"},
		{sb + "WriteFile", &sandboxv1.WriteFileRequest{Msg: &sandboxv1.WriteFileRequest_Header{Header: &sandboxv1.WriteFileHeader{SandboxId: "n1-c"}}}, "n1-c"},
		{sb + "WriteFile", &sandboxv1.WriteFileRequest{Msg: &sandboxv1.WriteFileRequest_Data{Data: []byte("x")}}, ""},
		{sb + "Create", &sandboxv1.CreateRequest{Image: "debian"}, ""},
		{"/dsec.admin.v1.AdminService/RevokeKey", &adminv1.RevokeKeyRequest{Id: "abcdefgh"}, ""},
		{"/dsec.image.v1.ImageService/GetLayer", &imagev1.GetLayerRequest{Digest: "sha256:00"}, ""},
		{sb + "Get", "not a message", ""},
	}
	for _, tt := range tests {
		if got := SandboxOf(tt.procedure, tt.msg); got != tt.want {
			t.Errorf("SandboxOf(%s, %v) = %q, want %q", tt.procedure, tt.msg, got, tt.want)
		}
	}
}

// msgOf returns the message of a connect error.
func msgOf(err error) string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return fmt.Sprintf("(not a connect error: %v)", err)
	}
	return ce.Message()
}

// TestWithDetail checks that a detail for the log stays out of the reply,
// which names the id under which the log has it.
func TestWithDetail(t *testing.T) {
	log, buf := newLog(slog.LevelInfo)
	transport := connect.NewError(connect.CodeUnavailable, errors.New("dial unix /var/lib/dsec/edge.sock: connect: no such file or directory"))
	err := errdefs.RetryAfter(WithDetail(errdefs.Newf(errdefs.ErrUnavailable, "node n1 is unreachable: retry"), transport), time.Second)
	got := NewReporter(log, "the API server").ToConnect(t.Context(), Call{Procedure: "/dsec.sandbox.v1.SandboxService/Get"}, err)
	re := regexp.MustCompile(`^node n1 is unreachable: retry \(the API server's log has the details under id ([0-9a-f]{16})\)$`)
	m := re.FindStringSubmatch(msgOf(got))
	if m == nil || connect.CodeOf(got) != connect.CodeUnavailable || RetryDelay(got) != time.Second {
		t.Fatalf("ToConnect(%v) = %v %q (retry %v), want Unavailable matching %s, retry 1s", err, connect.CodeOf(got), msgOf(got), RetryDelay(got), re)
	}
	want := []map[string]string{{
		"level": "WARN", "msg": "API call failed", "id": m[1], "code": "unavailable",
		"procedure": "/dsec.sandbox.v1.SandboxService/Get", "err": "node n1 is unreachable: retry", "detail": transport.Error(),
	}}
	if diff := cmp.Diff(want, buf.entries(t)); diff != "" {
		t.Errorf("log (-want +got):\n%s", diff)
	}
	if msg, ok := Public(err); !ok || msg != "node n1 is unreachable: retry" {
		t.Errorf("Public(%v) = %q, %v, want the message without the detail", err, msg, ok)
	}
}
