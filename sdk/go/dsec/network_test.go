package dsec

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// The fake's network calls: UpdateNetwork answers every sandbox it has
// (or the one named) with the policy sent, except sandboxes named
// "sb-locked", which fail; GetNetwork answers fixed counters.
func (f *fake) UpdateNetwork(_ context.Context, req *connect.Request[sandboxv1.UpdateNetworkRequest]) (*connect.Response[sandboxv1.UpdateNetworkResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, req.Msg)
	out := &sandboxv1.UpdateNetworkResponse{}
	ids := []string{req.Msg.GetId()}
	if req.Msg.GetId() == "" {
		ids = []string{"sb-a", "sb-locked"}
	}
	for _, id := range ids {
		if id == "sb-locked" {
			out.Results = append(out.Results, &sandboxv1.NetworkResult{Id: id, Error: &sandboxv1.ItemError{Code: "failed_precondition", Message: "sandbox sb-locked is exited"}})
			continue
		}
		out.Results = append(out.Results, &sandboxv1.NetworkResult{Id: id, Policy: &sandboxv1.NetworkPolicy{Mode: "rules", Rules: []*sandboxv1.NetworkRule{
			{Action: "allow", Target: &sandboxv1.NetworkRule_Service{Service: "pypi"}, Protocol: "tcp"},
		}}})
	}
	return connect.NewResponse(out), nil
}

func (f *fake) GetNetwork(_ context.Context, req *connect.Request[sandboxv1.GetNetworkRequest]) (*connect.Response[sandboxv1.GetNetworkResponse], error) {
	return connect.NewResponse(&sandboxv1.GetNetworkResponse{
		Policy:  &sandboxv1.NetworkPolicy{Mode: "open"},
		Address: "100.64.0.1", Gateway: "100.64.0.0", BytesOut: 7, BytesIn: 8, ConnectionsOut: 2, Denied: 1,
		Denials: []*sandboxv1.NetworkDenial{{Time: timestamppb.New(time.Unix(5, 0)), Destination: "registry.npmjs.org", Reason: "denied by rule 2 (deny npm)"}},
	}), nil
}

func TestNetworkServices(t *testing.T) {
	p, err := NetworkServices(map[string]bool{"pypi": true, "npm": false, "github": true})
	if err != nil {
		t.Fatal(err)
	}
	if want := "allow=github,deny=npm,allow=pypi"; p.Text != want {
		t.Errorf("NetworkServices = %q, want %q", p.Text, want)
	}
	if p, _ := NetworkServices(nil); p.Mode != "none" || p.String() != "none" {
		t.Errorf("NetworkServices(nil) = %+v, want none", p)
	}
	// A key holding the flag's separators would say something else.
	for _, k := range []string{"pypi,npm", "allow=npm", ""} {
		if _, err := NetworkServices(map[string]bool{k: true}); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("NetworkServices(%q) = %v, want ErrInvalidArgument", k, err)
		}
	}
}

func TestNetworkPolicyString(t *testing.T) {
	tests := []struct {
		p    *NetworkPolicy
		want string
	}{
		{nil, "none"},
		{&NetworkPolicy{Mode: "open"}, "open"},
		{NetworkFlag("allow=pypi"), "allow=pypi"},
		{&NetworkPolicy{Mode: "rules", Rules: []NetworkRule{
			{Action: "allow", Service: "pypi"}, {Action: "allow", Domain: "example.com", Ports: []string{"443", "8000-8100"}},
			{Action: "deny", Service: "npm"}, {Action: "allow", CIDR: "2001:db8::/32", Ports: []string{"80"}}, {Action: "allow", CIDR: "192.0.2.0/24", Protocol: "udp"},
		}}, "allow=pypi,example.com:443+8000-8100,deny=npm,allow=[2001:db8::/32]:80,192.0.2.0/24/udp"},
		{&NetworkPolicy{Mode: "open", Rules: []NetworkRule{{Action: "deny", Domain: "*.example.com"}}}, "open,deny=*.example.com"},
	}
	for _, tt := range tests {
		if got := tt.p.String(); got != tt.want {
			t.Errorf("String(%+v) = %q, want %q", tt.p, got, tt.want)
		}
	}
}

func TestCreateWithNetwork(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	p, _ := NetworkServices(map[string]bool{"pypi": true, "npm": false})
	if _, err := c.Create(ctx, CreateOptions{Image: "python:3.12", Network: p}); err != nil {
		t.Fatal(err)
	}
	if got := f.createReq.GetNetwork().GetText(); got != "deny=npm,allow=pypi" {
		t.Errorf("create sent network %q", got)
	}
	typed := &NetworkPolicy{Rules: []NetworkRule{{Action: "allow", Domain: "example.com", Ports: []string{"443"}}, {Action: "deny", CIDR: "10.0.0.0/8"}}}
	if _, err := c.Create(ctx, CreateOptions{Image: "python:3.12", Network: typed}); err != nil {
		t.Fatal(err)
	}
	got := f.createReq.GetNetwork()
	if len(got.GetRules()) != 2 || got.GetRules()[0].GetDomain() != "example.com" || got.GetRules()[0].GetPorts()[0] != "443" || got.GetRules()[1].GetCidr() != "10.0.0.0/8" || got.GetRules()[1].GetAction() != "deny" {
		t.Errorf("create sent network %v", got)
	}
	if _, err := c.Create(ctx, CreateOptions{Image: "python:3.12"}); err != nil {
		t.Fatal(err)
	}
	if f.createReq.Network != nil {
		t.Errorf("a create without network sent %v", f.createReq.Network)
	}
}

func TestUpdateNetwork(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	sb, err := c.Create(ctx, CreateOptions{Image: "python:3.12"})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := sb.UpdateNetwork(ctx, NetworkFlag("allow=pypi"), true)
	if err != nil {
		t.Fatalf("UpdateNetwork = %v", err)
	}
	if diff := cmp.Diff(&NetworkPolicy{Mode: "rules", Rules: []NetworkRule{{Action: "allow", Service: "pypi", Protocol: "tcp"}}}, pol); diff != "" {
		t.Errorf("UpdateNetwork (-want +got):\n%s", diff)
	}
	req := f.calls[len(f.calls)-1].(*sandboxv1.UpdateNetworkRequest)
	if req.GetId() != sb.ID || !req.GetMerge() || req.GetPolicy().GetText() != "allow=pypi" {
		t.Errorf("UpdateNetwork sent %v", req)
	}

	res, err := c.UpdateNetwork(ctx, map[string]string{"stage": "solve"}, nil, false)
	if err != nil {
		t.Fatalf("Client.UpdateNetwork = %v", err)
	}
	if len(res) != 2 || res[0].Err != nil || res[1].ID != "sb-locked" || !errors.Is(res[1].Err, ErrFailedPrecondition) {
		t.Errorf("Client.UpdateNetwork = %+v, want one success and one FailedPrecondition", res)
	}
	req = f.calls[len(f.calls)-1].(*sandboxv1.UpdateNetworkRequest)
	if req.GetPolicy().GetMode() != "none" || req.GetSelector()["stage"] != "solve" {
		t.Errorf("Client.UpdateNetwork(nil policy) sent %v, want mode none", req)
	}
	if _, err := c.UpdateNetwork(ctx, nil, NetworkFlag("open"), false); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Client.UpdateNetwork without a selector = %v, want ErrInvalidArgument", err)
	}

	info, err := sb.Network(ctx)
	if err != nil {
		t.Fatalf("Network = %v", err)
	}
	want := &NetworkInfo{
		Policy: &NetworkPolicy{Mode: "open"}, Address: "100.64.0.1", Gateway: "100.64.0.0", BytesOut: 7, BytesIn: 8, ConnectionsOut: 2, Denied: 1,
		Denials: []NetworkDenial{{Time: time.Unix(5, 0).UTC(), Destination: "registry.npmjs.org", Reason: "denied by rule 2 (deny npm)"}},
	}
	if diff := cmp.Diff(want, info); diff != "" {
		t.Errorf("Network (-want +got):\n%s", diff)
	}
}
