package apiserver

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// The counting node's network calls scope sandboxes by the caller's
// project as an edge does, and record who asked.
func (e *countingEdge) UpdateNetwork(_ context.Context, req *connect.Request[sandboxv1.UpdateNetworkRequest]) (*connect.Response[sandboxv1.UpdateNetworkResponse], error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	project := req.Header().Get(caller.HeaderProject)
	out := &sandboxv1.UpdateNetworkResponse{}
	for id, sb := range e.sandboxes {
		switch {
		case sb.Project != project:
		case req.Msg.GetId() == id, req.Msg.GetId() == "" && len(req.Msg.GetSelector()) > 0:
			sb.Network = req.Msg.GetPolicy()
			out.Results = append(out.Results, &sandboxv1.NetworkResult{Id: id, Policy: sb.Network})
		}
	}
	if req.Msg.GetId() != "" && len(out.Results) == 0 {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("sandbox not found"))
	}
	return connect.NewResponse(out), nil
}

func (e *countingEdge) GetNetwork(_ context.Context, req *connect.Request[sandboxv1.GetNetworkRequest]) (*connect.Response[sandboxv1.GetNetworkResponse], error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sb, ok := e.sandboxes[req.Msg.GetId()]
	if !ok || sb.Project != req.Header().Get(caller.HeaderProject) {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("sandbox not found"))
	}
	return connect.NewResponse(&sandboxv1.GetNetworkResponse{Policy: sb.Network, Address: "100.64.0.1"}), nil
}

// TestNetworkProjectScoping: the API server sends a network call to the
// node under the key's own project, whatever the request's headers claim,
// so a key of another project can neither read nor change a sandbox's
// network, by ID or by selector.
func TestNetworkProjectScoping(t *testing.T) {
	s := newTenancyServer(t, 0)
	ctx := t.Context()
	alice := s.client(t, "alice", dsec.KeyOptions{})
	secret, _, err := s.admin.CreateKey(ctx, dsec.KeyOptions{Project: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := dsec.New(dsec.Config{Addr: s.addr, APIKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer mallory.Close()
	sb, err := alice.Create(ctx, dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}, Labels: map[string]string{"stage": "setup"}, Network: dsec.NetworkFlag("allow=pypi")})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.edge.creates[len(s.edge.creates)-1].GetNetwork().GetText(); got != "allow=pypi" {
		t.Errorf("the node got network %q at create, want allow=pypi", got)
	}
	if _, err := sb.UpdateNetwork(ctx, dsec.NetworkFlag("allow=npm"), false); err != nil {
		t.Fatalf("alice: UpdateNetwork(own sandbox) = %v", err)
	}
	if info, err := sb.Network(ctx); err != nil || info.Policy.Text != "allow=npm" {
		t.Fatalf("alice: Network(own sandbox) = %+v, %v", info, err)
	}

	// A handle to alice's sandbox by its ID alone.
	forged := mallory.Sandbox(sb.ID)
	if _, err := forged.UpdateNetwork(ctx, dsec.NetworkFlag("open"), false); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("mallory: UpdateNetwork(alice's sandbox) = %v, want NotFound", err)
	}
	if _, err := forged.Network(ctx); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("mallory: Network(alice's sandbox) = %v, want NotFound", err)
	}
	res, err := mallory.UpdateNetwork(ctx, map[string]string{"stage": "setup"}, dsec.NetworkFlag("open"), false)
	if err != nil || len(res) != 0 {
		t.Errorf("mallory: UpdateNetwork(stage=setup) = %+v, %v, want no sandbox", res, err)
	}

	// Headers claiming alice's project (or admin) are not believed.
	raw := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, s.addr)
	req := connect.NewRequest(&sandboxv1.UpdateNetworkRequest{Id: sb.ID, Policy: &sandboxv1.NetworkPolicy{Mode: "open"}})
	req.Header().Set("Authorization", "Bearer "+secret)
	req.Header().Set(caller.HeaderProject, "alice")
	req.Header().Set(caller.HeaderAdmin, "1")
	if _, err := raw.UpdateNetwork(ctx, req); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("mallory with forged headers: UpdateNetwork = %v, want NotFound", err)
	}
	if info, err := sb.Network(ctx); err != nil || info.Policy.Text != "allow=npm" {
		t.Errorf("alice's sandbox after mallory's attempts: %+v, %v, want allow=npm", info, err)
	}
	if _, err := alice.UpdateNetwork(ctx, nil, dsec.NetworkFlag("open"), false); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("UpdateNetwork without id or selector = %v, want InvalidArgument", err)
	}
}
