package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// startFakeHandler serves h (startFake for a handler of its own).
func startFakeHandler(t *testing.T, h sandboxv1connect.SandboxServiceHandler) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(h))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// backendsAPI answers ListBackends with two nodes' backends.
type backendsAPI struct{ *fakeAPI }

func (backendsAPI) ListBackends(context.Context, *connect.Request[sandboxv1.ListBackendsRequest]) (*connect.Response[sandboxv1.ListBackendsResponse], error) {
	return connect.NewResponse(&sandboxv1.ListBackendsResponse{Backends: []*sandboxv1.BackendInfo{
		{Node: "n1", Name: "container", Tier: "container", Capabilities: []string{"pack", "events", "memory-limit", "tty"}, Default: true},
		{Node: "n2", Name: "microvm", Tier: "microvm", Capabilities: []string{"snapshot"}},
	}}), nil
}

func TestBackends(t *testing.T) {
	f := newFakeAPI()
	addr := startFakeHandler(t, backendsAPI{f})
	out, errOut, code := dsecRun(t, addr, "", "backends")
	if code != 0 {
		t.Fatalf("dsec backends exited %d: %s", code, errOut)
	}
	want := "NODE  BACKEND    TIER       DEFAULT  CAPABILITIES\n" +
		"n1    container  container  yes      pack,events,memory-limit,tty\n" +
		"n2    microvm    microvm             snapshot\n"
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("dsec backends (-want +got):\n%s", diff)
	}
	out, _, code = dsecRun(t, addr, "", "backends", "-o", "json")
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 || len(got) != 2 {
		t.Fatalf("dsec backends -o json = %q (exit %d): %v", out, code, err)
	}
	if got[0]["node"] != "n1" || got[0]["tier"] != "container" || got[0]["default"] != true || !strings.Contains(out, `"memory-limit"`) {
		t.Errorf("dsec backends -o json = %s", out)
	}
}
