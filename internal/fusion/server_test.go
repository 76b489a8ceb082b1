package fusion

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newTestServer returns a server whose client reaches no dsec: requests
// that get as far as creating a sandbox fail with SandboxError.
func newTestServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	c, err := dsec.New(dsec.Config{Addr: "http://127.0.0.1:1", APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client = c
	cfg.PoolSize = -1
	cfg.CapacityWait = -1
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Error(err)
		}
		c.Close()
	})
	return s
}

func do(t *testing.T, h http.Handler, method, path, body string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	var out map[string]any
	if rec.Body.String() != `"pong"` {
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s %s: body %q is not JSON: %v", method, path, rec.Body.String(), err)
		}
	}
	return rec.Code, out
}

func TestHandler(t *testing.T) {
	s := newTestServer(t, Config{Authenticate: testKeys})
	h := s.Handler()
	ok := `{"code": "print(1)", "language": "cobol"}`
	tests := []struct {
		name, method, path, body string
		code                     int
		status, detail           string
	}{
		{"ping", "GET", "/v1/ping", "", 200, "", ""},
		{"unknown language", "POST", "/run_code", ok, 200, "SandboxError", ""},
		{"under a key", "POST", "/good/run_code", ok, 200, "SandboxError", ""},
		{"GET run_code", "GET", "/run_code", "", 405, "", "POST"},
		{"bad JSON", "POST", "/run_code", "{", 422, "", "not a JSON object"},
		{"missing code", "POST", "/run_code", `{"language": "python"}`, 422, "", `"code" is required`},
		{"unknown path", "POST", "/submit", ok, 404, "", "run_code"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := do(t, h, tt.method, tt.path, tt.body)
			if code != tt.code {
				t.Fatalf("%s %s = %d %v, want %d", tt.method, tt.path, code, out, tt.code)
			}
			if tt.status != "" && out["status"] != tt.status {
				t.Errorf("%s %s: status = %v, want %s", tt.method, tt.path, out["status"], tt.status)
			}
			if tt.detail != "" && !strings.Contains(out["detail"].(string), tt.detail) {
				t.Errorf("%s %s: detail = %q, want it to say %q", tt.method, tt.path, out["detail"], tt.detail)
			}
		})
	}
	// SandboxFusion's response has every field, null or empty when unset.
	_, out := do(t, h, "POST", "/run_code", ok)
	for _, f := range []string{"status", "message", "compile_result", "run_result", "executor_pod_name", "files"} {
		if _, ok := out[f]; !ok {
			t.Errorf("response %v has no field %q", out, f)
		}
	}
	if !strings.Contains(out["message"].(string), `unknown language "cobol"`) || !strings.Contains(out["message"].(string), "python") {
		t.Errorf("message = %q, want it to name the language and the known ones", out["message"])
	}
}

func TestHandlerBodyLimit(t *testing.T) {
	s := newTestServer(t, Config{MaxBodyBytes: 100})
	body := `{"language": "python", "code": "` + strings.Repeat("x", 200) + `"}`
	if code, out := do(t, s.Handler(), "POST", "/run_code", body); code != http.StatusRequestEntityTooLarge || !strings.Contains(out["detail"].(string), "100 bytes") {
		t.Errorf("a 200-byte body over a 100-byte limit = %d %v, want 413", code, out)
	}
}

// testKeys admits the key "good"; "denied" is PermissionDenied, "down"
// cannot be checked, anything else is Unauthenticated.
func testKeys(_ context.Context, key string) error {
	switch key {
	case "good":
		return nil
	case "denied":
		return errdefs.Newf(errdefs.ErrPermissionDenied, "this key may not")
	case "down":
		return errdefs.Newf(errdefs.ErrUnavailable, "etcd is down")
	}
	return errdefs.Newf(errdefs.ErrUnauthenticated, "invalid API key")
}

func TestHandlerKeys(t *testing.T) {
	body := `{"code": "", "language": "cobol"}` // SandboxError: the call got in
	type call struct {
		path, bearer string
		code         int
	}
	tests := []struct {
		name  string
		cfg   Config
		calls []call
	}{
		{"keyless by default", Config{Authenticate: testKeys}, []call{
			{"/run_code", "", 200},
			{"/v1/ping", "", 200},
			{"/good/run_code", "", 200},
			{"/run_code", "good", 200},
			{"/good/run_code", "good", 200},
			// A key sent is checked even where none is needed.
			{"/bad/run_code", "", 401},
			{"/run_code", "bad", 401},
			{"/good/run_code", "bad", 401},
			{"/bad/run_code", "good", 401},
			{"/run_code", "denied", 403},
			{"/run_code", "down", 503},
			{"//run_code", "", 404},
			{"/good/submit", "", 404},
		}},
		{"require key", Config{Authenticate: testKeys, RequireKey: true}, []call{
			{"/run_code", "", 401},
			{"/v1/ping", "", 401},
			{"/run_code", "bad", 401},
			{"/bad/run_code", "", 401},
			{"/s3cret/run_code", "", 401},
			{"//run_code", "", 404},
			{"/run_code", "good", 200},
			{"/v1/ping", "good", 200},
			{"/good/run_code", "", 200},
			{"/good/v1/ping", "", 200},
			{"/run_code", "down", 503},
		}},
		{"no keys taken", Config{}, []call{
			{"/run_code", "", 200},
			{"/run_code", "good", 401},
			{"/good/run_code", "", 401},
		}},
	}
	for _, tt := range tests {
		t.Run(strings.ReplaceAll(tt.name, " ", "_"), func(t *testing.T) {
			h := newTestServer(t, tt.cfg).Handler()
			for _, c := range tt.calls {
				method := "POST"
				if strings.HasSuffix(c.path, "/ping") {
					method = "GET"
				}
				req := httptest.NewRequest(method, c.path, strings.NewReader(body))
				if c.bearer != "" {
					req.Header.Set("Authorization", "Bearer "+c.bearer)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				var out map[string]any
				_ = json.Unmarshal(rec.Body.Bytes(), &out)
				if rec.Code != c.code {
					t.Errorf("%s %s (bearer %q) = %d %s, want %d", method, c.path, c.bearer, rec.Code, rec.Body, c.code)
					continue
				}
				switch {
				case c.code == 200 && method == "POST" && out["status"] != "SandboxError":
					t.Errorf("POST %s: %s, want SandboxError (unknown language)", c.path, rec.Body)
				case c.code == 401 && (rec.Header().Get("WWW-Authenticate") == "" || !strings.HasPrefix(fmt.Sprint(out["detail"]), "Unauthenticated: ")):
					t.Errorf("%s %s (bearer %q) = 401 %s, WWW-Authenticate %q; want SandboxFusion's {\"detail\": \"Unauthenticated: …\"} and a challenge",
						method, c.path, c.bearer, rec.Body, rec.Header().Get("WWW-Authenticate"))
				case c.code != 200 && out["detail"] == nil:
					t.Errorf("%s %s = %d %s, want {\"detail\": …}", method, c.path, rec.Code, rec.Body)
				}
			}
			if tt.cfg.RequireKey {
				_, out := do(t, h, "POST", "/run_code", body)
				if d := fmt.Sprint(out["detail"]); !strings.Contains(d, "Authorization: Bearer <key>") || !strings.Contains(d, "dsec key create") {
					t.Errorf("keyless call: detail %q, want it to say how to send a key and where to get one", d)
				}
			}
		})
	}
	if _, err := New(Config{Client: &dsec.Client{}, RequireKey: true}); err == nil {
		t.Errorf("New(RequireKey without Authenticate) = nil error, want one")
	}
}

func TestRunCodeRefusals(t *testing.T) {
	s := newTestServer(t, Config{MaxTimeout: time.Minute})
	tests := []struct {
		name string
		req  RunCodeRequest
		msg  string
	}{
		{"file outside", RunCodeRequest{Language: "python", Files: map[string]*string{"../x": ptr("")}}, "outside the working directory"},
		{"absolute file", RunCodeRequest{Language: "python", Files: map[string]*string{"/etc/x": ptr("")}}, "absolute"},
		{"fetch outside", RunCodeRequest{Language: "python", FetchFiles: []string{"a/../../b"}}, "outside the working directory"},
		{"zero timeout", RunCodeRequest{Language: "python", RunTimeout: 0, CompileTimeout: 1}, "run_timeout is 0"},
		{"long timeout", RunCodeRequest{Language: "go", RunTimeout: 1, CompileTimeout: 3600}, "at most 60 seconds"},
		{"no platform", RunCodeRequest{Language: "bash", RunTimeout: 1, CompileTimeout: 1}, "cannot start a bash sandbox"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resp := s.RunCode(ctx, &tt.req)
			if resp.Status != StatusSandboxError || !strings.Contains(resp.Message, tt.msg) {
				t.Errorf("RunCode = %s %q, want SandboxError saying %q", resp.Status, resp.Message, tt.msg)
			}
			if resp.RunResult != nil || resp.CompileResult != nil || resp.Files == nil {
				t.Errorf("RunCode = %+v, want no results and an empty files map", resp)
			}
		})
	}
}

func TestWorkTar(t *testing.T) {
	b, err := workTar([]File{{"main.py", []byte("shadowed")}, {"d/e/f.txt", []byte("f")}, {"d/g", []byte("g")}}, "main.py", "print(1)")
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(b))
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		got = append(got, h.Name+"="+string(data))
	}
	want := []string{"d/=", "d/e/=", "d/e/f.txt=f", "d/g=g", "main.py=print(1)"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("workTar entries (-want +got):\n%s", d)
	}
}

func TestSandboxWaitsForRoom(t *testing.T) {
	s := newTestServer(t, Config{})
	s.cfg.CapacityWait = 10 * time.Second
	full := &dsec.Error{Kind: dsec.ErrResourceExhausted, Message: "full", RetryAfter: 20 * time.Millisecond}
	var calls int
	s.newSandbox = func(ctx context.Context, key poolKey) (*dsec.Sandbox, error) {
		calls++
		if calls < 3 {
			return nil, full
		}
		return s.cfg.Client.Sandbox("sb-1"), nil
	}
	sb, err := s.sandbox(context.Background(), poolKey{image: "i", memory: 1})
	if err != nil || sb.ID != "sb-1" || calls != 3 {
		t.Errorf("sandbox = %v, %v after %d creates; want sb-1 after 3", sb, err, calls)
	}
	// Other errors, and a full platform past CapacityWait, are returned.
	s.cfg.CapacityWait = 50 * time.Millisecond
	calls = -100
	start := time.Now()
	if _, err := s.sandbox(context.Background(), poolKey{}); !errors.Is(err, dsec.ErrResourceExhausted) || time.Since(start) > 5*time.Second {
		t.Errorf("sandbox on a full platform = %v after %v, want ResourceExhausted within CapacityWait", err, time.Since(start))
	}
	s.newSandbox = func(context.Context, poolKey) (*dsec.Sandbox, error) {
		calls++
		return nil, &dsec.Error{Kind: dsec.ErrNotFound, Message: "no image"}
	}
	calls = 0
	if _, err := s.sandbox(context.Background(), poolKey{}); !errors.Is(err, dsec.ErrNotFound) || calls != 1 {
		t.Errorf("sandbox of a missing image = %v after %d creates, want NotFound at once", err, calls)
	}
}

// goneAPI is a sandbox API on which the sandboxes in gone do not exist:
// uploads to them are NotFound, to others work; nothing else is served.
type goneAPI struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
	gone map[string]bool

	mu      sync.Mutex
	uploads []string // sandbox IDs; guarded by mu
}

func (g *goneAPI) UploadTar(_ context.Context, st *connect.ClientStream[sandboxv1.UploadTarRequest]) (*connect.Response[sandboxv1.UploadTarResponse], error) {
	var id string
	for st.Receive() {
		if h := st.Msg().GetHeader(); h != nil {
			id = h.GetSandboxId()
		}
	}
	g.mu.Lock()
	g.uploads = append(g.uploads, id)
	g.mu.Unlock()
	if g.gone[id] {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("sandbox "+id+" not found"))
	}
	return connect.NewResponse(&sandboxv1.UploadTarResponse{Files: 1}), nil
}

// TestRunCodeTakesAnotherWhenGone: a ready sandbox that vanished (a node
// lost it) costs the call a retry, not a SandboxError; the call's
// sandbox is still one nobody used.
func TestRunCodeTakesAnotherWhenGone(t *testing.T) {
	api := &goneAPI{gone: map[string]bool{"sb-a": true}}
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(api))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	c, err := dsec.New(dsec.Config{Addr: srv.URL, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := newTestServer(t, Config{})
	f := &fakeSandboxes{c: c}
	s.newSandbox = f.create
	var mu sync.Mutex
	var deleted []string
	s.deleteSandbox = func(_ context.Context, sb *dsec.Sandbox) error {
		mu.Lock()
		defer mu.Unlock()
		deleted = append(deleted, sb.ID)
		return nil
	}
	resp := s.RunCode(t.Context(), &RunCodeRequest{Language: "bash", Code: "true", RunTimeout: 1, CompileTimeout: 1})
	// The fake runs no commands: the call got as far as running one.
	if resp.RunResult == nil || strings.Contains(resp.Message, "write the code") {
		t.Errorf("RunCode with a vanished first sandbox = %s %q, want the call to run in another", resp.Status, resp.Message)
	}
	api.mu.Lock()
	uploads := slices.Clone(api.uploads)
	api.mu.Unlock()
	if d := cmp.Diff([]string{"sb-a", "sb-b"}, uploads); d != "" {
		t.Errorf("uploads (-want +got):\n%s", d)
	}
	waitFor(t, "both sandboxes deleted", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(deleted) == 2
	})
	// Twice gone is a SandboxError.
	api.gone = map[string]bool{"sb-c": true, "sb-d": true}
	if resp := s.RunCode(t.Context(), &RunCodeRequest{Language: "bash", Code: "true", RunTimeout: 1, CompileTimeout: 1}); resp.Status != StatusSandboxError || !strings.Contains(resp.Message, "not found") {
		t.Errorf("RunCode with two vanished sandboxes = %s %q, want SandboxError saying not found", resp.Status, resp.Message)
	}
}
