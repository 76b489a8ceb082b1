package edge

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

// netFake is the fake backend with sandbox networks: it records the policy
// each sandbox is given, as a keeper enforces it, and can refuse.
type netFake struct {
	*sandboxtest.Fake

	mu sync.Mutex
	// guarded by mu
	enforced map[string]string // sandbox -> policy document
	sets     int
	fail     error
}

var _ sandbox.NetworkPolicer = (*netFake)(nil)

func newNetFake(n *sandboxtest.FakeNode) *netFake {
	return &netFake{Fake: n.Open(), enforced: map[string]string{}}
}

func (f *netFake) SetNetwork(ctx context.Context, id string, policy []byte) (sandbox.NetworkInfo, error) {
	if _, err := f.Status(ctx, id); err != nil {
		return sandbox.NetworkInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return sandbox.NetworkInfo{}, f.fail
	}
	f.sets++
	f.enforced[id] = string(policy)
	return sandbox.NetworkInfo{Policy: policy, Address: "100.64.0.1", Router: "100.64.0.0"}, nil
}

func (f *netFake) Network(ctx context.Context, id string) (sandbox.NetworkInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.enforced[id]
	if !ok {
		return sandbox.NetworkInfo{}, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s has no network", id)
	}
	return sandbox.NetworkInfo{
		Policy: []byte(p), Address: "100.64.0.1", Router: "100.64.0.0", BytesOut: 100, Denied: 1,
		Denials: []sandbox.NetworkDenial{{Time: time.Unix(1, 0), Dest: "registry.npmjs.org", Reason: "denied by rule 2 (deny npm)"}},
	}, nil
}

func (f *netFake) policy(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enforced[id]
}

// openNet starts an edge whose one backend is be, with catalogue cat.
func (n *testNode) openNet(be sandbox.Backend, cat *netpolicy.Catalogue) *Edge {
	n.t.Helper()
	e, err := New(context.Background(), Config{
		Node: "n", StateDir: n.dir,
		Backends: map[string]sandbox.Backend{"fake": be},
		Images:   fakeImages{}, MemoryBytes: 1 << 30, MemoryOvercommit: 1, MemoryReserve: 1, CPUs: 2,
		Defaults:    Defaults{MemoryBytes: 64 * testMiB, DiskBytes: 16 * testMiB},
		OutputQuota: 16 * testMiB, ReconcileEvery: time.Hour,
		Logger: slog.New(slog.DiscardHandler), Network: cat,
	})
	if err != nil {
		n.t.Fatalf("New = %v", err)
	}
	e.diskSpace = func() (ceiling.Space, error) { return ceiling.Space{Free: 1 << 40, Size: 1 << 41}, nil }
	return e
}

func netCreate(ctx context.Context, e *Edge, c Caller, pol *sandboxv1.NetworkPolicy, labels map[string]string) (*Record, error) {
	return e.Create(ctx, c, CreateParamsOf(&sandboxv1.CreateRequest{Image: "busybox", Labels: labels, Network: pol}), "")
}

const pypiNoNpm = `{"version":1,"mode":"rules","rules":[{"action":"allow","service":"pypi","protocol":"tcp"},{"action":"deny","service":"npm","protocol":"tcp"}]}`

// TestNetworkCreate: a create's policy is validated (InvalidArgument
// naming the rule, nothing made), stored in the record and enforced before
// the create returns; without one nothing is asked of the backend; a
// backend that refuses it fails the create and leaves nothing.
func TestNetworkCreate(t *testing.T) {
	n := newTestNode(t)
	be := newNetFake(n.node)
	e := n.openNet(be, nil)
	defer e.Close()
	ctx := context.Background()

	r, err := netCreate(ctx, e, admin, &sandboxv1.NetworkPolicy{Text: "allow=pypi,deny=npm"}, nil)
	if err != nil {
		t.Fatalf("Create(allow=pypi,deny=npm) = %v", err)
	}
	if got := be.policy(r.ID); got != pypiNoNpm {
		t.Errorf("enforced when Create returned: %q, want %q", got, pypiNoNpm)
	}
	if got, _ := e.store.get(r.ID); string(got.Network) != pypiNoNpm {
		t.Errorf("stored policy = %q, want %q", got.Network, pypiNoNpm)
	}
	want := &sandboxv1.NetworkPolicy{Mode: "rules", Rules: []*sandboxv1.NetworkRule{
		{Action: "allow", Target: &sandboxv1.NetworkRule_Service{Service: "pypi"}, Protocol: "tcp"},
		{Action: "deny", Target: &sandboxv1.NetworkRule_Service{Service: "npm"}, Protocol: "tcp"},
	}}
	if got := e.toProto(r).GetNetwork(); got.String() != want.String() {
		t.Errorf("Sandbox.network = %v, want %v", got, want)
	}

	// The same as a typed policy, with ports and a CIDR.
	typed := &sandboxv1.NetworkPolicy{Rules: []*sandboxv1.NetworkRule{
		{Action: "allow", Target: &sandboxv1.NetworkRule_Domain{Domain: "Example.COM."}, Ports: []string{"443", "8000-8100"}},
		{Action: "allow", Target: &sandboxv1.NetworkRule_Cidr{Cidr: "192.0.2.7"}, Protocol: "udp"},
	}}
	r2, err := netCreate(ctx, e, admin, typed, nil)
	if err != nil {
		t.Fatalf("Create(typed policy) = %v", err)
	}
	if got, want := be.policy(r2.ID), `{"version":1,"mode":"rules","rules":[{"action":"allow","domain":"example.com","ports":[443,"8000-8100"],"protocol":"tcp"},{"action":"allow","cidr":"192.0.2.7/32","protocol":"udp"}]}`; got != want {
		t.Errorf("enforced = %s, want %s", got, want)
	}

	be.mu.Lock()
	sets := be.sets
	be.mu.Unlock()
	for _, pol := range []*sandboxv1.NetworkPolicy{nil, {Mode: "none"}, {Text: "none"}} {
		plain, err := netCreate(ctx, e, admin, pol, nil)
		if err != nil {
			t.Fatalf("Create(%v) = %v", pol, err)
		}
		if plain.Network != nil || e.toProto(plain).GetNetwork() != nil {
			t.Errorf("Create(%v): network %q, want none", pol, plain.Network)
		}
	}
	be.mu.Lock()
	if be.sets != sets {
		t.Errorf("creates without network set %d networks, want none", be.sets-sets)
	}
	be.mu.Unlock()

	before, _ := be.List(ctx)
	bad := []struct {
		pol  *sandboxv1.NetworkPolicy
		kind error
		has  string
	}{
		{&sandboxv1.NetworkPolicy{Text: "allow=pypi,pipy"}, errdefs.ErrInvalidArgument, `rule 2 (allow "pipy")`},
		{&sandboxv1.NetworkPolicy{Text: "allow=pypi,deny=pypi"}, errdefs.ErrInvalidArgument, "both allow and deny"},
		{&sandboxv1.NetworkPolicy{Rules: []*sandboxv1.NetworkRule{{Action: "allow", Target: &sandboxv1.NetworkRule_Domain{Domain: "example.com"}, Ports: []string{"70000"}}}}, errdefs.ErrInvalidArgument, "rule 1"},
		{&sandboxv1.NetworkPolicy{Rules: []*sandboxv1.NetworkRule{{Action: "allow"}}}, errdefs.ErrInvalidArgument, "rule 1"},
		{&sandboxv1.NetworkPolicy{Rules: []*sandboxv1.NetworkRule{{Action: "maybe", Target: &sandboxv1.NetworkRule_Service{Service: "pypi"}}}}, errdefs.ErrInvalidArgument, "rule 1"},
		{&sandboxv1.NetworkPolicy{Text: "policy=/etc/shadow"}, errdefs.ErrInvalidArgument, "send the file's rules"},
		{&sandboxv1.NetworkPolicy{Text: "open", Mode: "open"}, errdefs.ErrInvalidArgument, "not both"},
	}
	for _, tt := range bad {
		_, err := netCreate(ctx, e, admin, tt.pol, nil)
		if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.has) {
			t.Errorf("Create(%v) = %v, want %v saying %q", tt.pol, err, tt.kind, tt.has)
		}
	}
	if after, _ := be.List(ctx); len(after) != len(before) {
		t.Errorf("refused creates made %d sandboxes", len(after)-len(before))
	}

	// A backend that cannot enforce it (an old keeper): the create fails
	// with its reason and leaves nothing, admission included.
	held := e.admission().MemoryCommitted
	be.mu.Lock()
	be.fail = errdefs.Newf(errdefs.ErrFailedPrecondition, "the node keeper speaks keeper protocol 4, which has no sandbox networks: restart dsec up")
	be.mu.Unlock()
	_, err = netCreate(ctx, e, admin, &sandboxv1.NetworkPolicy{Text: "allow=pypi"}, nil)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "protocol 4") {
		t.Errorf("Create on a keeper without networks = %v, want FailedPrecondition naming it", err)
	}
	if after, _ := be.List(ctx); len(after) != len(before) {
		t.Errorf("a create whose network failed left %d sandboxes", len(after)-len(before))
	}
	if got := e.admission().MemoryCommitted; got != held {
		t.Errorf("memory committed = %d after a failed create, want %d", got, held)
	}
}

// TestNetworkOpenForbidden: mode open on a node whose operator forbids it
// is FailedPrecondition saying what to do, at create and at update.
func TestNetworkOpenForbidden(t *testing.T) {
	cat, err := netpolicy.ParseCatalogue("net.toml", []byte("version = 1\nallow_open = false\n"))
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t)
	be := newNetFake(n.node)
	e := n.openNet(be, cat)
	defer e.Close()
	ctx := context.Background()
	_, err = netCreate(ctx, e, admin, &sandboxv1.NetworkPolicy{Text: "open"}, nil)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "allow the services") {
		t.Errorf("Create(open) = %v, want FailedPrecondition", err)
	}
	r, err := netCreate(ctx, e, admin, &sandboxv1.NetworkPolicy{Text: "allow=pypi"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, merge := range []bool{false, true} {
		_, err = e.UpdateNetwork(ctx, admin, r.ID, nil, netpolicy.Spec{Mode: netpolicy.ModeOpen}, merge)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("UpdateNetwork(open, merge %v) = %v, want FailedPrecondition", merge, err)
		}
	}
	if got := be.policy(r.ID); got != `{"version":1,"mode":"rules","rules":[{"action":"allow","service":"pypi","protocol":"tcp"}]}` {
		t.Errorf("enforced after refused updates = %s", got)
	}
}

func flagSpec(t *testing.T, s string) netpolicy.Spec {
	t.Helper()
	f, err := netpolicy.ParseNetworkFlag(s)
	if err != nil {
		t.Fatalf("ParseNetworkFlag(%q) = %v", s, err)
	}
	return f.Spec
}

// TestUpdateNetwork: by ID and by selector, replace and merge, the record
// and the backend agree; a key of another project can neither read nor
// change a sandbox's network, by ID or by selector.
func TestUpdateNetwork(t *testing.T) {
	n := newTestNode(t)
	be := newNetFake(n.node)
	e := n.openNet(be, nil)
	defer e.Close()
	ctx := context.Background()
	alice := Caller{Project: "alice", KeyID: "ka"}
	mallory := Caller{Project: "mallory", KeyID: "km"}

	a1, err := netCreate(ctx, e, alice, &sandboxv1.NetworkPolicy{Text: "allow=pypi"}, map[string]string{"stage": "setup"})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := netCreate(ctx, e, alice, nil, map[string]string{"stage": "setup"})
	if err != nil {
		t.Fatal(err)
	}
	a3, err := netCreate(ctx, e, alice, nil, map[string]string{"stage": "solve"})
	if err != nil {
		t.Fatal(err)
	}
	m1, err := netCreate(ctx, e, mallory, &sandboxv1.NetworkPolicy{Text: "allow=github"}, map[string]string{"stage": "setup"})
	if err != nil {
		t.Fatal(err)
	}

	// Replace by ID.
	res, err := e.UpdateNetwork(ctx, alice, a1.ID, nil, flagSpec(t, "allow=npm"), false)
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("UpdateNetwork(a1, allow=npm) = %+v, %v", res, err)
	}
	npm := `{"version":1,"mode":"rules","rules":[{"action":"allow","service":"npm","protocol":"tcp"}]}`
	if got := be.policy(a1.ID); got != npm {
		t.Errorf("enforced after replace = %s, want %s", got, npm)
	}
	// Merge by ID appends.
	if _, err := e.UpdateNetwork(ctx, alice, a1.ID, nil, flagSpec(t, "allow=github,deny=*.example.com"), true); err != nil {
		t.Fatalf("UpdateNetwork(merge) = %v", err)
	}
	merged := `{"version":1,"mode":"rules","rules":[{"action":"allow","service":"npm","protocol":"tcp"},{"action":"allow","service":"github","protocol":"tcp"},{"action":"deny","domain":"*.example.com","protocol":"tcp"}]}`
	if got := be.policy(a1.ID); got != merged {
		t.Errorf("enforced after merge = %s, want %s", got, merged)
	}
	if got, _ := e.store.get(a1.ID); string(got.Network) != merged {
		t.Errorf("stored after merge = %s, want %s", got.Network, merged)
	}
	// A merge that contradicts the policy is refused and changes nothing.
	if _, err := e.UpdateNetwork(ctx, alice, a1.ID, nil, flagSpec(t, "deny=npm"), true); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "rules 1") {
		t.Errorf("UpdateNetwork(merge deny=npm onto allow npm) = %v, want InvalidArgument naming both rules", err)
	}
	if got := be.policy(a1.ID); got != merged {
		t.Errorf("enforced after a refused merge = %s, want %s", got, merged)
	}
	// An unknown service fails the whole call.
	if _, err := e.UpdateNetwork(ctx, alice, "", map[string]string{"stage": "setup"}, flagSpec(t, "allow=pipy"), false); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "pipy") {
		t.Errorf("UpdateNetwork(allow=pipy) = %v, want InvalidArgument naming it", err)
	}

	// By selector: alice's setup sandboxes only, never mallory's.
	res, err = e.UpdateNetwork(ctx, alice, "", map[string]string{"stage": "setup"}, flagSpec(t, "allow=goproxy"), false)
	if err != nil {
		t.Fatalf("UpdateNetwork(stage=setup) = %v", err)
	}
	var ids []string
	for _, r := range res {
		if r.Err != nil {
			t.Errorf("result %s: %v", r.ID, r.Err)
		}
		ids = append(ids, r.ID)
	}
	want := []string{a1.ID, a2.ID}
	if want[0] > want[1] {
		want[0], want[1] = want[1], want[0]
	}
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Errorf("updated by selector (-want +got):\n%s", diff)
	}
	goproxy := `{"version":1,"mode":"rules","rules":[{"action":"allow","service":"goproxy","protocol":"tcp"}]}`
	for _, id := range want {
		if got := be.policy(id); got != goproxy {
			t.Errorf("enforced on %s = %s, want %s", id, got, goproxy)
		}
	}
	if got := be.policy(a3.ID); got != "" {
		t.Errorf("a sandbox the selector does not match got %s", got)
	}
	github := `{"version":1,"mode":"rules","rules":[{"action":"allow","service":"github","protocol":"tcp"}]}`
	if got := be.policy(m1.ID); got != github {
		t.Errorf("another project's sandbox got %s, want it unchanged", got)
	}

	// Mallory, hostile: by ID NotFound (not PermissionDenied: it does not
	// learn the sandbox exists), by selector nothing of alice's.
	if _, err := e.UpdateNetwork(ctx, mallory, a1.ID, nil, flagSpec(t, "open"), false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("UpdateNetwork(another project's sandbox) = %v, want NotFound", err)
	}
	if _, err := e.GetNetwork(ctx, mallory, a1.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetNetwork(another project's sandbox) = %v, want NotFound", err)
	}
	res, err = e.UpdateNetwork(ctx, mallory, "", map[string]string{"stage": "setup"}, flagSpec(t, "open"), false)
	if err != nil || len(res) != 1 || res[0].ID != m1.ID {
		t.Errorf("UpdateNetwork(mallory, stage=setup) = %+v, %v, want only its own sandbox", res, err)
	}
	for _, id := range want {
		if got := be.policy(id); got != goproxy {
			t.Errorf("after mallory's update, %s enforces %s, want %s", id, got, goproxy)
		}
	}

	// GetNetwork: the policy as set, the backend's counters and denials.
	st, err := e.GetNetwork(ctx, alice, a1.ID)
	if err != nil {
		t.Fatalf("GetNetwork = %v", err)
	}
	info := networkProtoInfo(st)
	if info.GetAddress() != "100.64.0.1" || info.GetBytesOut() != 100 || len(info.GetDenials()) != 1 || info.GetDenials()[0].GetReason() != "denied by rule 2 (deny npm)" ||
		len(info.GetPolicy().GetRules()) != 1 || info.GetPolicy().GetRules()[0].GetService() != "goproxy" {
		t.Errorf("GetNetwork = %v", info)
	}
	if got, _ := e.store.get(a1.ID); e.networkCounters(ctx, got).BytesOut != 100 {
		t.Errorf("stats' network counters of a sandbox with network = %+v, want the backend's", e.networkCounters(ctx, got))
	}
	if got, _ := e.store.get(a3.ID); e.networkCounters(ctx, got).Address != "" {
		t.Errorf("stats' network counters of a sandbox without network = %+v, want none", e.networkCounters(ctx, got))
	}
	st, err = e.GetNetwork(ctx, alice, a3.ID)
	if err != nil || networkProtoInfo(st).GetPolicy().GetMode() != "none" || st.Info.Address != "" {
		t.Errorf("GetNetwork(no network) = %+v, %v, want mode none and no address", st, err)
	}

	// Replace with none keeps the link and allows nothing.
	if _, err := e.UpdateNetwork(ctx, alice, a1.ID, nil, netpolicy.Spec{Mode: netpolicy.ModeNone}, false); err != nil {
		t.Fatal(err)
	}
	if got := be.policy(a1.ID); got != `{"version":1,"mode":"none"}` {
		t.Errorf("enforced after none = %s", got)
	}

	// A backend that refuses: the record keeps the policy it had.
	be.mu.Lock()
	be.fail = errdefs.Newf(errdefs.ErrUnavailable, "keeper down")
	be.mu.Unlock()
	if _, err := e.UpdateNetwork(ctx, alice, a2.ID, nil, flagSpec(t, "allow=npm"), false); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("UpdateNetwork with the backend down = %v, want Unavailable", err)
	}
	if got, _ := e.store.get(a2.ID); string(got.Network) != goproxy {
		t.Errorf("stored after a refused update = %s, want %s", got.Network, goproxy)
	}
}

// TestNetworkDenyOnly: a policy that allows nothing is kept but costs
// nothing (the backend is not asked); a later merge that allows something
// enforces the whole policy, deny rules included.
func TestNetworkDenyOnly(t *testing.T) {
	n := newTestNode(t)
	be := newNetFake(n.node)
	e := n.openNet(be, nil)
	defer e.Close()
	ctx := context.Background()
	r, err := netCreate(ctx, e, admin, &sandboxv1.NetworkPolicy{Text: "deny=npm"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := be.policy(r.ID); got != "" {
		t.Errorf("a deny-only policy was sent to the backend: %s", got)
	}
	if st, err := e.GetNetwork(ctx, admin, r.ID); err != nil || len(networkProtoInfo(st).GetPolicy().GetRules()) != 1 {
		t.Errorf("GetNetwork(deny=npm) = %+v, %v, want the stored rule", st, err)
	}
	if _, err := e.UpdateNetwork(ctx, admin, r.ID, nil, flagSpec(t, "allow=pypi"), true); err != nil {
		t.Fatal(err)
	}
	want := `{"version":1,"mode":"rules","rules":[{"action":"deny","service":"npm","protocol":"tcp"},{"action":"allow","service":"pypi","protocol":"tcp"}]}`
	if got := be.policy(r.ID); got != want {
		t.Errorf("enforced after merge = %s, want %s", got, want)
	}
}

// TestNetworkRestartRepush: a restarted edge gives every running sandbox
// with a policy its policy again (a keeper that lost it enforces it), and
// nothing to the others.
func TestNetworkRestartRepush(t *testing.T) {
	n := newTestNode(t)
	be := newNetFake(n.node)
	e := n.openNet(be, nil)
	ctx := context.Background()
	r, err := netCreate(ctx, e, admin, &sandboxv1.NetworkPolicy{Text: "allow=pypi,deny=npm"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := netCreate(ctx, e, admin, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Close()

	be2 := newNetFake(n.node) // a keeper that restarted empty
	e2 := n.openNet(be2, nil)
	defer e2.Close()
	if got := be2.policy(r.ID); got != pypiNoNpm {
		t.Errorf("after the restart the backend enforces %q, want %q", got, pypiNoNpm)
	}
	if got := be2.policy(plain.ID); got != "" {
		t.Errorf("a sandbox without network got %q after the restart", got)
	}
}

// TestNetworkNeedsCapability: a backend without sandbox networks refuses
// a policy at create and at update with what to do.
func TestNetworkNeedsCapability(t *testing.T) {
	n := newTestNode(t)
	e := n.openNet(n.node.Open(), nil)
	defer e.Close()
	ctx := context.Background()
	_, err := netCreate(ctx, e, admin, &sandboxv1.NetworkPolicy{Text: "allow=pypi"}, nil)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "network-policy capability") {
		t.Errorf("Create(network) on a backend without it = %v, want FailedPrecondition", err)
	}
	r, err := netCreate(ctx, e, admin, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A policy that allows nothing needs no network: network_rules={"npm":
	// False} runs anywhere, as before sandboxes had networks.
	if _, err := netCreate(ctx, e, admin, &sandboxv1.NetworkPolicy{Text: "deny=npm"}, nil); err != nil {
		t.Errorf("Create(deny=npm) on a backend without networks = %v", err)
	}
	if _, err := e.UpdateNetwork(ctx, admin, r.ID, nil, flagSpec(t, "allow=pypi"), false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("UpdateNetwork on a backend without it = %v, want FailedPrecondition", err)
	}
}

// TestUpdateNetworkDuringCreate: a sandbox still being created is not
// updated (its create gives it the policy it was created with): by
// selector its result says to retry, with a hint, and the create then
// enforces its own policy.
func TestUpdateNetworkDuringCreate(t *testing.T) {
	n := newTestNode(t)
	be := newNetFake(n.node)
	e := n.openNet(be, nil)
	defer e.Close()
	ctx := context.Background()
	block := make(chan struct{})
	n.node.Lock()
	n.node.CreateBlock = block
	n.node.Unlock()
	type created struct {
		r   *Record
		err error
	}
	done := make(chan created, 1)
	go func() {
		r, err := netCreate(ctx, e, admin, &sandboxv1.NetworkPolicy{Text: "allow=pypi,deny=npm"}, map[string]string{"stage": "setup"})
		done <- created{r, err}
	}()
	var res []NetworkResult
	eventually(t, "the creating sandbox is visible", func() bool {
		var err error
		res, err = e.UpdateNetwork(ctx, admin, "", map[string]string{"stage": "setup"}, flagSpec(t, "allow=npm"), false)
		return err == nil && len(res) == 1
	})
	if d, ok := errdefs.RetryHint(res[0].Err); !errors.Is(res[0].Err, errdefs.ErrFailedPrecondition) || !ok || d <= 0 || !strings.Contains(res[0].Err.Error(), "retry once it runs") {
		t.Errorf("update of a creating sandbox = %v, want FailedPrecondition with a retry hint", res[0].Err)
	}
	n.node.Lock()
	n.node.CreateBlock = nil
	n.node.Unlock()
	close(block)
	c := <-done
	if c.err != nil {
		t.Fatal(c.err)
	}
	if got := be.policy(c.r.ID); got != pypiNoNpm {
		t.Errorf("enforced after the create = %s, want %s", got, pypiNoNpm)
	}
}

// FuzzNetworkSpecOf: whatever a request's policy holds, NetworkSpecOf
// returns an error or a policy whose stored document, given back in the
// API's form and read again, is the same document (what a client reads
// back is what is enforced).
func FuzzNetworkSpecOf(f *testing.F) {
	f.Add("allow=pypi,github,deny=npm", "", "", "", "", "")
	f.Add("", "rules", "allow", "example.com", "443", "tcp")
	f.Add("", "", "deny", "10.0.0.0/8", "8000-8100", "")
	f.Add("", "open", "allow", "192.0.2.7", "5000", "udp")
	f.Add("open,deny=*.example.com", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, text, mode, action, target, port, proto string) {
		m := &sandboxv1.NetworkPolicy{Text: text, Mode: mode}
		if action != "" || target != "" {
			r := &sandboxv1.NetworkRule{Action: action, Protocol: proto}
			if port != "" {
				r.Ports = []string{port}
			}
			switch {
			case strings.Contains(target, "/"):
				r.Target = &sandboxv1.NetworkRule_Cidr{Cidr: target}
			case strings.Contains(target, "."):
				r.Target = &sandboxv1.NetworkRule_Domain{Domain: target}
			case target != "":
				r.Target = &sandboxv1.NetworkRule_Service{Service: target}
			}
			m.Rules = append(m.Rules, r)
		}
		spec, err := NetworkSpecOf(m)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("NetworkSpecOf(%v) = %v, want InvalidArgument", m, err)
			}
			return
		}
		doc := netpolicy.MarshalPolicyJSON(*spec)
		again, err := NetworkSpecOf(SpecProto(*spec))
		if err != nil {
			t.Fatalf("NetworkSpecOf(SpecProto(%s)) = %v", doc, err)
		}
		if got := netpolicy.MarshalPolicyJSON(*again); string(got) != string(doc) {
			t.Fatalf("round trip of %s gave %s", doc, got)
		}
	})
}
