package fusion

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

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
	s := newTestServer(t, Config{PathKey: "s3cret"})
	h := s.Handler()
	ok := `{"code": "print(1)", "language": "cobol"}`
	tests := []struct {
		name, method, path, body string
		code                     int
		status, detail           string
	}{
		{"ping", "GET", "/v1/ping", "", 200, "", ""},
		{"unknown language", "POST", "/run_code", ok, 200, "SandboxError", ""},
		{"under the key", "POST", "/s3cret/run_code", ok, 200, "SandboxError", ""},
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

func TestHandlerKeyOnly(t *testing.T) {
	s := newTestServer(t, Config{PathKey: "s3cret", KeyOnly: true})
	h := s.Handler()
	body := `{"code": "", "language": "cobol"}`
	for _, p := range []string{"/run_code", "/wrong/run_code", "/s3cre/run_code", "/s3cretx/run_code", "//run_code"} {
		if code, out := do(t, h, "POST", p, body); code != 404 || !strings.Contains(out["detail"].(string), "/<key>/run_code") {
			t.Errorf("POST %s without the key = %d %v, want 404 naming the key path", p, code, out)
		}
	}
	if code, out := do(t, h, "POST", "/s3cret/run_code", body); code != 200 || out["status"] != "SandboxError" {
		t.Errorf("POST /s3cret/run_code = %d %v, want 200 SandboxError (unknown language)", code, out)
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
