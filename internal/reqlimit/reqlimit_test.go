package reqlimit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// service records what reached it.
type service struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
	reached chan string
}

func (s *service) Create(_ context.Context, req *connect.Request[sandboxv1.CreateRequest]) (*connect.Response[sandboxv1.CreateResponse], error) {
	s.reached <- "Create"
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("bad image"))
}

func (s *service) WriteStdin(_ context.Context, req *connect.Request[sandboxv1.WriteStdinRequest]) (*connect.Response[sandboxv1.WriteStdinResponse], error) {
	s.reached <- "WriteStdin"
	return connect.NewResponse(&sandboxv1.WriteStdinResponse{}), nil
}

func serve(t *testing.T, max int64) (*httptest.Server, *service) {
	t.Helper()
	l := New(max)
	svc := &service{reached: make(chan string, 10)}
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(svc, l.ConnectOption()))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
		}
	})
	srv := httptest.NewServer(l.Handler(mux))
	t.Cleanup(srv.Close)
	return srv, svc
}

// post sends body to path as Connect JSON; chunked hides its length.
func post(t *testing.T, url string, body []byte, chunked bool) (int, string, time.Duration) {
	t.Helper()
	var r io.Reader = bytes.NewReader(body)
	if chunked {
		r = io.MultiReader(r) // no Len: sent chunked
	}
	req, err := http.NewRequest(http.MethodPost, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), time.Since(start)
}

func bigCreate(n int) []byte {
	return []byte(`{"image":"` + strings.Repeat("a", n) + `"}`)
}

func TestSmallCallsAreSmall(t *testing.T) {
	srv, svc := serve(t, 0)
	for _, chunked := range []bool{false, true} {
		code, body, took := post(t, srv.URL+sandboxv1connect.SandboxServiceCreateProcedure, bigCreate(50<<20), chunked)
		if code != http.StatusTooManyRequests || !strings.Contains(body, "resource_exhausted") {
			t.Errorf("Create of 50 MB (chunked %v) = %d %.200s, want 429 resource_exhausted", chunked, code, body)
		}
		if len(body) > 1024 || strings.Contains(body, "aaaaaaaaaaaaaaaa") {
			t.Errorf("Create of 50 MB (chunked %v): the %d-byte error echoes the request", chunked, len(body))
		}
		t.Logf("Create of 50 MB (chunked %v): refused in %v: %s", chunked, took, body)
	}
	select {
	case m := <-svc.reached:
		t.Errorf("a 50 MB Create reached %s", m)
	default:
	}
	// Under the bound it reaches the service.
	if code, _, _ := post(t, srv.URL+sandboxv1connect.SandboxServiceCreateProcedure, bigCreate(1000), false); code != http.StatusBadRequest {
		t.Errorf("Create of 1 KB = %d, want the service's 400", code)
	}
	if got := <-svc.reached; got != "Create" {
		t.Errorf("reached %s, want Create", got)
	}
}

func TestBulkAndMax(t *testing.T) {
	srv, svc := serve(t, 4<<20)
	stdin := func(n int) []byte {
		return []byte(`{"sandboxId":"x","execId":"y","data":"` + strings.Repeat("QUFB", n/4) + `"}`)
	}
	if code, body, _ := post(t, srv.URL+sandboxv1connect.SandboxServiceWriteStdinProcedure, stdin(2<<20), false); code != http.StatusOK {
		t.Errorf("WriteStdin of 2 MB under a 4 MiB max = %d %.200s, want 200", code, body)
	}
	<-svc.reached
	code, body, _ := post(t, srv.URL+sandboxv1connect.SandboxServiceWriteStdinProcedure, stdin(5<<20), false)
	if code != http.StatusTooManyRequests || !strings.Contains(body, "--max-request-size") {
		t.Errorf("WriteStdin of 5 MB over a 4 MiB max = %d %.200s, want 429 naming --max-request-size", code, body)
	}
	if code, _, _ := post(t, srv.URL+"/healthz", make([]byte, 5<<20), true); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a 5 MB body to a plain handler = %d, want 413", code)
	}
	if code, _, _ := post(t, srv.URL+"/healthz", make([]byte, 5<<20), false); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a 5 MB body with its length to a plain handler = %d, want 413", code)
	}
}

func TestBounds(t *testing.T) {
	l := New(2 << 20)
	for _, tt := range []struct {
		path   string
		n      int64
		stream bool
	}{
		{sandboxv1connect.SandboxServiceCreateProcedure, SmallBytes, false},
		{sandboxv1connect.SandboxServiceWriteStdinProcedure, 2 << 20, false},
		{sandboxv1connect.SandboxServiceUploadTarProcedure, 0, true},
		{sandboxv1connect.SandboxServiceWriteFileProcedure, 0, true},
		{sandboxv1connect.SandboxServiceExecProcedure, 2 << 20, false},
		{sandboxv1connect.SandboxServiceGetProcedure, SmallBytes, false},
		{"/healthz", 2 << 20, false},
	} {
		n, stream := l.Bound(tt.path)
		if n != tt.n || stream != tt.stream {
			t.Errorf("Bound(%s) = %d, %v; want %d, %v", tt.path, n, stream, tt.n, tt.stream)
		}
	}
	if n, _ := New(64 << 10).Bound(sandboxv1connect.SandboxServiceCreateProcedure); n != 64<<10 {
		t.Errorf("Create's bound under a 64 KiB max = %d, want 64 KiB", n)
	}
}
