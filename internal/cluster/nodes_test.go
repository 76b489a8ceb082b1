package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func testNode(name string) Node {
	return Node{
		Name:        name,
		Addr:        "http://" + name + ":7421",
		Backends:    []string{"container", "microvm"},
		CPUs:        2,
		MemoryBytes: 24 << 30,
		Labels:      map[string]string{"zone": "a"},
		Version:     "v0.1.0",
		StartedAt:   time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

func register(t *testing.T, s *Store, n Node) *Registration {
	t.Helper()
	r, err := s.RegisterNode(testCtx(t), n)
	if err != nil {
		t.Fatalf("RegisterNode(%s) = %v", n.Name, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestNodes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	a, b := testNode("node-a"), testNode("node-b.example")
	ra := register(t, s, a)
	register(t, s, b)

	got, err := s.ListNodes(ctx)
	if err != nil {
		t.Fatalf("ListNodes() = %v", err)
	}
	if diff := cmp.Diff([]Node{a, b}, got); diff != "" {
		t.Errorf("ListNodes() mismatch (-want +got):\n%s", diff)
	}
	n, err := s.GetNode(ctx, a.Name)
	if err != nil || !cmp.Equal(n, a) {
		t.Errorf("GetNode(%q) = %+v, %v, want %+v", a.Name, n, err, a)
	}

	// Close revokes the lease: the node goes at once, not after the TTL.
	if err := ra.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if err := ra.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}
	if _, err := s.GetNode(ctx, a.Name); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetNode(%q) after Close = %v, want NotFound", a.Name, err)
	}
	got, err = s.ListNodes(ctx)
	if err != nil || len(got) != 1 || got[0].Name != b.Name {
		t.Errorf("ListNodes() after Close = %v, %v, want only %s", got, err, b.Name)
	}
}

func TestRegisterNodeDefaultsStartedAt(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, StoreConfig{})
	clock := &fakeClock{t: time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)}
	s.now = clock.now
	n := testNode("n")
	n.StartedAt = time.Time{}
	register(t, s, n)
	got, err := s.GetNode(testCtx(t), "n")
	if err != nil || !got.StartedAt.Equal(clock.t) {
		t.Errorf("GetNode(n).StartedAt = %v, %v, want %v", got.StartedAt, err, clock.t)
	}
}

// TestNodeExpires stops an edge without closing its registration (its etcd
// client goes away, as when the process dies) and checks that the node
// disappears after the TTL, and not before.
func TestNodeExpires(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	observer := newTestStore(t, StoreConfig{})
	edgeClient, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{shared.Endpoint()},
		DialTimeout: 5 * time.Second,
		Logger:      newZapLogger(testLogger(), 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	edge := NewStore(edgeClient, StoreConfig{NodeTTL: 2 * time.Second, Logger: observer.lg})
	edge.prefix = observer.prefix
	r := register(t, edge, testNode("dying"))

	time.Sleep(2500 * time.Millisecond) // past the TTL: renewals keep it
	if _, err := observer.GetNode(ctx, "dying"); err != nil {
		t.Fatalf("GetNode past the TTL while renewed = %v, want the node", err)
	}

	edgeClient.Close() // the edge dies
	stopped := time.Now()
	if _, err := observer.GetNode(ctx, "dying"); err != nil {
		t.Fatalf("GetNode right after the edge stopped = %v, want the node until the TTL", err)
	}
	for {
		_, err := observer.GetNode(ctx, "dying")
		if errdefs.Is(err, errdefs.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatalf("GetNode = %v", err)
		}
		if time.Since(stopped) > 10*time.Second {
			t.Fatalf("node still listed %v after its edge stopped, TTL 2s", time.Since(stopped))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("node gone %v after its edge stopped", time.Since(stopped))
	if d := time.Since(stopped); d < time.Second {
		t.Errorf("node gone %v after its edge stopped, want about the TTL (2s)", d)
	}
	r.Close() // its revoke fails: the client is gone
}

// TestRegistrationRenewsLostLease revokes the node's lease behind the
// registration's back and checks that the node comes back.
func TestRegistrationRenewsLostLease(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{NodeTTL: 2 * time.Second})
	register(t, s, testNode("n"))
	resp, err := shared.Client().Get(ctx, s.nodeKey("n"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get node key = %v, %v", resp, err)
	}
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	if _, err := shared.Client().Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := shared.Client().Get(ctx, s.nodeKey("n"))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) != lease {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node not registered again 10s after its lease was revoked")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRegisterNodeNameTaken(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	register(t, s, testNode("n"))

	other := testNode("n")
	other.Addr = "http://elsewhere:7421"
	if r, err := s.RegisterNode(ctx, other); !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		if r != nil {
			r.Close()
		}
		t.Fatalf("RegisterNode(n from another address) = %v, want AlreadyExists", err)
	}

	// The same edge restarting replaces its entry.
	again := testNode("n")
	again.Version = "v0.2.0"
	register(t, s, again)
	got, err := s.GetNode(ctx, "n")
	if err != nil || got.Version != "v0.2.0" {
		t.Errorf("GetNode(n) = %+v, %v, want version v0.2.0", got, err)
	}
}

func TestRegisterNodeInvalid(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, StoreConfig{})
	tests := []struct {
		name string
		edit func(*Node)
	}{
		{"empty name", func(n *Node) { n.Name = "" }},
		{"uppercase name", func(n *Node) { n.Name = "Node1" }},
		{"slash in name", func(n *Node) { n.Name = "a/b" }},
		{"long label", func(n *Node) { n.Name = strings.Repeat("a", 64) }},
		{"no scheme", func(n *Node) { n.Addr = "node:7421" }},
		{"no host", func(n *Node) { n.Addr = "http://" }},
		{"negative memory", func(n *Node) { n.MemoryBytes = -1 }},
		{"empty backend", func(n *Node) { n.Backends = []string{""} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := testNode("n")
			tt.edit(&n)
			r, err := s.RegisterNode(testCtx(t), n)
			if err == nil {
				r.Close()
			}
			if !errdefs.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("RegisterNode(%+v) = %v, want InvalidArgument", n, err)
			}
		})
	}
}

func TestGetNodeNotFound(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, StoreConfig{})
	_, err := s.GetNode(testCtx(t), "nowhere")
	if !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetNode(nowhere) = %v, want NotFound", err)
	}
}

func TestStoreErrKinds(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, StoreConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	if _, err := s.ListNodes(ctx); !errdefs.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("ListNodes(expired ctx) = %v, want DeadlineExceeded", err)
	}
}
