package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// testProtocols checks that one definition serves plain HTTP/JSON (what
// the Python SDK speaks), gRPC, and Connect.
func testProtocols(t *testing.T, p *platform) {
	key := p.AdminKey(t)
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.Addr+"/dsec.sandbox.v1.SandboxService/Create",
		strings.NewReader(`{"image": "busybox", "labels": {"job": "json"}, "resources": {"memoryBytes": "67108864"}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var created struct {
		Sandbox struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"sandbox"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &created) != nil || created.Sandbox.State != "STATE_RUNNING" {
		t.Fatalf("Create over HTTP/JSON: HTTP %d %s", resp.StatusCode, body)
	}
	id := created.Sandbox.ID

	// The same sandbox through a gRPC client (HTTP/2 without TLS).
	greq := connect.NewRequest(&sandboxv1.GetRequest{Id: id})
	greq.Header().Set("Authorization", "Bearer "+key)
	h2 := &http.Client{Transport: &http.Transport{Protocols: h2cProtocols()}}
	grpc := sandboxv1connect.NewSandboxServiceClient(h2, "http://"+p.Addr, connect.WithGRPC())
	got, err := grpc.Get(t.Context(), greq)
	if err != nil || got.Msg.GetSandbox().GetId() != id {
		t.Fatalf("Get over gRPC = %v, %v", got, err)
	}
	// gRPC errors carry the kinds' codes.
	_, err = grpc.Get(t.Context(), func() *connect.Request[sandboxv1.GetRequest] {
		r := connect.NewRequest(&sandboxv1.GetRequest{Id: "e2e-aaaaaaaaaaaa"})
		r.Header().Set("Authorization", "Bearer "+key)
		return r
	}())
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("gRPC Get(unknown) code = %v, want NotFound", connect.CodeOf(err))
	}
	del := connect.NewRequest(&sandboxv1.DeleteRequest{Id: id})
	del.Header().Set("Authorization", "Bearer "+key)
	if _, err := grpc.Delete(t.Context(), del); err != nil {
		t.Errorf("Delete over gRPC = %v", err)
	}
}

func h2cProtocols() *http.Protocols {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &p
}
