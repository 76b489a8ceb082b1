package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// The fake API's network calls: UpdateNetwork answers with the policy
// sent (as text, the way the test reads it back), a selector matching two
// sandboxes of which the second fails; GetNetwork answers fixed counters.
func (f *fakeAPI) UpdateNetwork(_ context.Context, req *connect.Request[sandboxv1.UpdateNetworkRequest]) (*connect.Response[sandboxv1.UpdateNetworkResponse], error) {
	f.record(req.Msg)
	pol := req.Msg.GetPolicy()
	if len(req.Msg.GetSelector()) > 0 {
		return connect.NewResponse(&sandboxv1.UpdateNetworkResponse{Results: []*sandboxv1.NetworkResult{
			{Id: "node1-aaaaaaaaaaaa", Policy: pol},
			{Id: "node1-bbbbbbbbbbbb", Error: &sandboxv1.ItemError{Code: "failed_precondition", Message: "sandbox node1-bbbbbbbbbbbb is exited (init exited): create a new one"}},
		}}), nil
	}
	return connect.NewResponse(&sandboxv1.UpdateNetworkResponse{Results: []*sandboxv1.NetworkResult{{Id: req.Msg.GetId(), Policy: pol}}}), nil
}

func (f *fakeAPI) GetNetwork(_ context.Context, req *connect.Request[sandboxv1.GetNetworkRequest]) (*connect.Response[sandboxv1.GetNetworkResponse], error) {
	f.record(req.Msg)
	return connect.NewResponse(&sandboxv1.GetNetworkResponse{
		Policy: &sandboxv1.NetworkPolicy{Mode: "rules", Rules: []*sandboxv1.NetworkRule{
			{Action: "allow", Target: &sandboxv1.NetworkRule_Service{Service: "pypi"}, Protocol: "tcp"},
			{Action: "deny", Target: &sandboxv1.NetworkRule_Service{Service: "npm"}, Protocol: "tcp"},
		}},
		Address: "100.64.0.3", Gateway: "100.64.0.2", BytesOut: 2048, ConnectionsOut: 4, Denied: 2, DnsQueries: 9, DnsDenied: 1,
		Denials: []*sandboxv1.NetworkDenial{
			{Time: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), Destination: "registry.npmjs.org", Reason: "denied by rule 2 (deny npm)"},
			{Time: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)), Destination: "104.16.0.1:443/tcp", Name: "registry.npmjs.org", Reason: "denied by rule 2 (deny npm)"},
		},
	}), nil
}

func rulesText(p *sandboxv1.NetworkPolicy) string {
	var parts []string
	if p.GetMode() != "" {
		parts = append(parts, "mode="+p.GetMode())
	}
	for _, r := range p.GetRules() {
		t := r.GetAction() + ":" + r.GetService() + r.GetDomain() + r.GetCidr()
		if len(r.GetPorts()) > 0 {
			t += ":" + strings.Join(r.GetPorts(), "+")
		}
		if r.GetProtocol() != "" {
			t += "/" + r.GetProtocol()
		}
		parts = append(parts, t)
	}
	return strings.Join(parts, " ")
}

func TestRunNetworkFlag(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(file, []byte(`{"rules":[{"action":"allow","domain":"example.com","ports":[443,"8000-8100"]},{"action":"allow","cidr":"192.0.2.0/24","ports":[53],"protocol":"udp"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		flag, want string
	}{
		{"allow=pypi,github,deny=npm", "mode=rules allow:pypi/tcp allow:github/tcp deny:npm/tcp"},
		{"open,deny=*.example.com", "mode=open deny:*.example.com/tcp"},
		{"open", "mode=open"},
		{"allow=10.20.0.0/24:5000/udp", "mode=rules allow:10.20.0.0/24:5000/udp"},
		{"policy=" + file, "mode=rules allow:example.com:443+8000-8100/tcp allow:192.0.2.0/24:53/udp"},
		{"none", ""},
	}
	for _, tt := range tests {
		_, errOut, code := dsecRun(t, addr, "", "run", "-d", "--network", tt.flag, "busybox")
		if code != 0 {
			t.Fatalf("run --network %s: exit %d: %s", tt.flag, code, errOut)
		}
		creates := callsOf[*sandboxv1.CreateRequest](f)
		if got := rulesText(creates[len(creates)-1].GetNetwork()); got != tt.want {
			t.Errorf("run --network %s sent %q, want %q", tt.flag, got, tt.want)
		}
	}
	before := len(callsOf[*sandboxv1.CreateRequest](f))
	for _, bad := range []string{"allow=", "allow=pypi,deny=pypi", "allow=example.com:70000", "policy=" + filepath.Join(dir, "missing.json"), "maybe=pypi"} {
		_, errOut, code := dsecRun(t, addr, "", "run", "-d", "--network", bad, "busybox")
		if code != 2 || !strings.Contains(errOut, "--network") {
			t.Errorf("run --network %s: exit %d, %q; want a usage error naming --network", bad, code, errOut)
		}
	}
	if n := len(callsOf[*sandboxv1.CreateRequest](f)) - before; n != 0 {
		t.Errorf("bad --network values sent %d creates", n)
	}
}

func TestNetSet(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	out, errOut, code := dsecRun(t, addr, "", "net", "set", "node1-cccccccccccc", "--allow", "pypi,github", "--deny", "npm")
	if code != 0 {
		t.Fatalf("net set: exit %d: %s", code, errOut)
	}
	if want := "node1-cccccccccccc\tallow=pypi,github,deny=npm\n"; out != want {
		t.Errorf("net set printed %q, want %q", out, want)
	}
	req := callsOf[*sandboxv1.UpdateNetworkRequest](f)[0]
	if req.GetId() != "node1-cccccccccccc" || req.GetMerge() || rulesText(req.GetPolicy()) != "mode=rules allow:pypi/tcp allow:github/tcp deny:npm/tcp" {
		t.Errorf("net set sent %v", req)
	}

	_, _, code = dsecRun(t, addr, "", "net", "set", "node1-cccccccccccc", "--merge", "--allow", "huggingface")
	if req := callsOf[*sandboxv1.UpdateNetworkRequest](f)[1]; code != 0 || !req.GetMerge() || rulesText(req.GetPolicy()) != "mode=rules allow:huggingface/tcp" {
		t.Errorf("net set --merge: exit %d, sent %v", code, req)
	}

	// By selector: one result per sandbox; a failed one is named on
	// standard error and the exit is 125.
	out, errOut, code = dsecRun(t, addr, "", "net", "set", "-l", "stage=solve", "--none")
	if code != 125 || out != "node1-aaaaaaaaaaaa\tnone\n" || !strings.Contains(errOut, "node1-bbbbbbbbbbbb") || !strings.Contains(errOut, "create a new one") {
		t.Errorf("net set -l --none: exit %d, out %q, err %q", code, out, errOut)
	}
	req = callsOf[*sandboxv1.UpdateNetworkRequest](f)[2]
	if req.GetSelector()["stage"] != "solve" || req.GetPolicy().GetMode() != "none" {
		t.Errorf("net set -l sent %v", req)
	}
	out, _, code = dsecRun(t, addr, "", "net", "set", "-l", "stage=solve", "--open", "--deny", "*.example.com", "-o", "json")
	var results []map[string]any
	if err := json.Unmarshal([]byte(out), &results); err != nil || code != 125 || len(results) != 2 || results[1]["error"].(map[string]any)["code"] != "failed_precondition" {
		t.Errorf("net set -o json: exit %d, %q (%v)", code, out, err)
	}

	n := len(callsOf[*sandboxv1.UpdateNetworkRequest](f))
	for _, args := range [][]string{
		{"node1-cccccccccccc"},                           // nothing to set
		{"--allow", "pypi"},                              // no ID or selector
		{"node1-cccccccccccc", "-l", "a=b", "--none"},    // both
		{"node1-cccccccccccc", "--none", "--allow", "x"}, // two kinds
		{"node1-cccccccccccc", "--merge", "--none"},      // merge of nothing
		{"node1-cccccccccccc", "--allow", "pypi,,npm"},   // empty target
		{"node1-cccccccccccc", "--allow", "pypi", "-o", "yaml"},
	} {
		_, errOut, code := dsecRun(t, addr, "", append([]string{"net", "set"}, args...)...)
		if code != 2 {
			t.Errorf("net set %v: exit %d (%s), want 2", args, code, errOut)
		}
	}
	if got := len(callsOf[*sandboxv1.UpdateNetworkRequest](f)); got != n {
		t.Errorf("refused net set commands sent %d updates", got-n)
	}
}

func TestNetShowAndLog(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	out, errOut, code := dsecRun(t, addr, "", "net", "show", "node1-cccccccccccc")
	if code != 0 {
		t.Fatalf("net show: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"allow=pypi,deny=npm", "100.64.0.3", "100.64.0.2", "out:      2K, 4 connections (0 open)", "denied:   2", "9, 1 refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("net show lacks %q:\n%s", want, out)
		}
	}
	out, _, _ = dsecRun(t, addr, "", "net", "show", "-o", "json", "node1-cccccccccccc")
	var info map[string]any
	if err := json.Unmarshal([]byte(out), &info); err != nil || info["address"] != "100.64.0.3" || info["bytesOut"] != "2048" || info["dnsQueries"] != "9" {
		t.Errorf("net show -o json = %s (%v), want the API's JSON names", out, err)
	}

	out, _, code = dsecRun(t, addr, "", "net", "log", "node1-cccccccccccc")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "TIME") || !strings.Contains(lines[1], "registry.npmjs.org") ||
		!strings.Contains(lines[2], "104.16.0.1:443/tcp") || !strings.Contains(lines[2], "denied by rule 2 (deny npm)") {
		t.Errorf("net log: exit %d:\n%s", code, out)
	}
	out, _, _ = dsecRun(t, addr, "", "net", "log", "-o", "json", "node1-cccccccccccc")
	var denials []map[string]any
	if err := json.Unmarshal([]byte(out), &denials); err != nil || len(denials) != 2 || denials[1]["name"] != "registry.npmjs.org" || denials[0]["time"] != "2026-01-02T03:04:05Z" {
		t.Errorf("net log -o json = %s (%v)", out, err)
	}
	for _, c := range []string{"net", "net set", "net show", "net log"} {
		out, _, code := dsecRun(t, addr, "", append(strings.Fields(c), "--help")...)
		if code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("%s --help: exit %d", c, code)
		}
	}
}
