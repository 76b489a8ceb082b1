package edge

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

// The edge's own semantics (admission, idempotency, TTLs and idleness,
// reconcile of every half-done state, events) on the fake backend: fast,
// and run with -race. The same behaviours on real sandboxes are in the
// container backend's tests and e2e.

// fakeImages resolves every name to one layer with an environment.
type fakeImages struct{}

func (fakeImages) Resolve(_ context.Context, ref string) (Image, error) {
	if ref == "missing" {
		return Image{}, errdefs.Newf(errdefs.ErrNotFound, "image %s not found", ref)
	}
	return Image{
		Name: ref + ":latest", Layers: []sandbox.Layer{{Digest: "sha256:aa", Path: "/layers/aa"}},
		Env: []string{"PATH=/bin", "LANG=C"}, Workdir: "/srv",
	}, nil
}

// testNode is a fake node and the state dir of the edge on it, so that a
// test can restart the edge.
type testNode struct {
	t    testing.TB
	node *sandboxtest.FakeNode
	dir  string
}

func newTestNode(t testing.TB) *testNode {
	return &testNode{t: t, node: sandboxtest.NewFakeNode(), dir: t.TempDir()}
}

const testMiB = 1 << 20

// open starts an edge on the node: 1 GiB of memory admitted once (no
// overcommit), small disks, a reconcile tick of 20 ms.
func (n *testNode) open() *Edge {
	n.t.Helper()
	e, err := New(context.Background(), Config{
		Node: "n", StateDir: n.dir,
		Backends: map[string]sandbox.Backend{"fake": n.node.Open()},
		Images:   fakeImages{}, MemoryBytes: 1 << 30, MemoryOvercommit: 1, MemoryReserve: 1, CPUs: 2,
		Defaults:    Defaults{MemoryBytes: 64 * testMiB, DiskBytes: 16 * testMiB},
		OutputQuota: 16 * testMiB, ReconcileEvery: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		n.t.Fatalf("New = %v", err)
	}
	e.diskSpace = func() (ceiling.Space, error) { return ceiling.Space{Free: 1 << 40, Size: 1 << 41}, nil }
	return e
}

var admin = Caller{Project: "default", Admin: true, KeyID: "k1"}

func create(t *testing.T, e *Edge, mem int64) *Record {
	t.Helper()
	r, err := e.Create(context.Background(), admin, CreateParams{Image: "busybox", Resources: sandbox.Resources{MemoryBytes: mem}}, "")
	if err != nil {
		t.Fatalf("Create(%d MiB) = %v", mem/testMiB, err)
	}
	return r
}

// wantHeld checks what admission holds: memory and the sandboxes' count.
func wantHeld(t *testing.T, e *Edge, mem int64) {
	t.Helper()
	a := e.admission()
	if a.MemoryCommitted != mem {
		t.Errorf("memory committed = %d MiB, want %d MiB", a.MemoryCommitted/testMiB, mem/testMiB)
	}
	if mem == 0 && a.DiskCommitted != 0 {
		t.Errorf("disk committed = %d, want 0", a.DiskCommitted)
	}
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("%s: not within 5 s", what)
}

func state(e *Edge, id string) State {
	r, err := e.store.get(id)
	if err != nil {
		return StateDeleted
	}
	return r.State
}

// TestAdmissionExitedAndFailedRelease is issue 11's bug 1: a sandbox whose
// init exited, or that failed, holds its memory until it is deleted, and
// then gives all of it back (it once stayed committed until a restart).
func TestAdmissionExitedAndFailedRelease(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	exited, failed, lost := create(t, e, 64*testMiB), create(t, e, 128*testMiB), create(t, e, 256*testMiB)
	wantHeld(t, e, 448*testMiB)

	n.node.Exit(exited.ID, "init exited with code 0")
	n.node.FailSandbox(failed.ID, "layer data unreadable")
	n.node.Forget(lost.ID)
	eventually(t, "exit and failure recorded", func() bool {
		return state(e, exited.ID) == StateExited && state(e, failed.ID) == StateFailed
	})
	if r, err := e.Get(ctx, admin, lost.ID); err != nil || r.State != StateFailed || r.Reason != reasonLost {
		t.Errorf("Get(lost) = %+v, %v, want failed: lost", r, err)
	}
	wantHeld(t, e, 448*testMiB) // ended sandboxes still hold what they had
	for _, r := range []*Record{exited, failed, lost} {
		if err := e.Delete(ctx, admin, r.ID); err != nil {
			t.Errorf("Delete(%s) = %v", r.State, err)
		}
	}
	wantHeld(t, e, 0)
	// All of it is admissible again.
	create(t, e, 1<<30)
}

// TestAdmissionBalancesOverRestarts: exits, failures, deletes and restarts
// of the edge all balance to zero.
func TestAdmissionBalancesOverRestarts(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	ctx := context.Background()
	var ids []string
	for _, mem := range []int64{64, 128, 192} {
		ids = append(ids, create(t, e, mem*testMiB).ID)
	}
	n.node.Exit(ids[0], "done")
	eventually(t, "exit recorded", func() bool { return state(e, ids[0]) == StateExited })
	e.Close()

	e = n.open()
	wantHeld(t, e, 384*testMiB)
	if err := e.Delete(ctx, admin, ids[0]); err != nil {
		t.Fatalf("Delete(exited) after a restart = %v", err)
	}
	wantHeld(t, e, 320*testMiB)
	e.Close()

	e = n.open()
	defer e.Close()
	wantHeld(t, e, 320*testMiB)
	if _, err := e.DeleteSelector(ctx, admin, map[string]string{}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("DeleteSelector(no labels) = %v, want InvalidArgument", err)
	}
	for _, id := range ids[1:] {
		if err := e.Delete(ctx, admin, id); err != nil {
			t.Fatalf("Delete = %v", err)
		}
	}
	wantHeld(t, e, 0)
	if got := n.node.IDs(); len(got) != 0 {
		t.Errorf("backend still has %v", got)
	}
}

// TestAdmissionRefusesBeyondCapacity: what is held is what is refused.
func TestAdmissionRefusesBeyondCapacity(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	a := create(t, e, 768*testMiB)
	n.node.Exit(a.ID, "done")
	eventually(t, "exit recorded", func() bool { return state(e, a.ID) == StateExited })
	_, err := e.Create(context.Background(), admin, CreateParams{Image: "busybox", Resources: sandbox.Resources{MemoryBytes: 512 * testMiB}}, "")
	if !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("Create beyond what an exited sandbox leaves = %v, want ResourceExhausted", err)
	}
	if err := e.Delete(context.Background(), admin, a.ID); err != nil {
		t.Fatal(err)
	}
	create(t, e, 512*testMiB)
}

// TestFailedCreateLeavesNothing: a create the backend fails is cleaned up
// and holds nothing.
func TestFailedCreateLeavesNothing(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	n.node.Lock()
	n.node.CreateErr = func(sandbox.Spec) error { return errdefs.Newf(errdefs.ErrInternal, "runtime crashed") }
	n.node.Unlock()
	w := e.events.subscribe(admin, nil)
	defer e.events.unsubscribe(w)
	_, err := e.Create(context.Background(), admin, CreateParams{Image: "busybox"}, "")
	if err == nil || !strings.Contains(err.Error(), "runtime crashed") {
		t.Fatalf("Create on a failing backend = %v, want the backend's error", err)
	}
	wantHeld(t, e, 0)
	if ids := n.node.IDs(); len(ids) != 0 {
		t.Errorf("backend keeps %v after a failed create", ids)
	}
	recs, _ := e.store.list()
	if len(recs) != 0 {
		t.Errorf("records after a failed create: %v", recs)
	}
	if got := drain(w); !slices.Equal(got, []string{"failed"}) {
		t.Errorf("events of a failed create = %v, want [failed]", got)
	}
}

// TestStuckDeletingFinishedWhileRunning is issue 11's bug 2: a failed
// create whose cleanup also failed stays deleting, still counted (so a
// keeper that adopts it runs it counted), and the running edge finishes it
// once the backend can (it once waited for the next start).
func TestStuckDeletingFinishedWhileRunning(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	n.node.Lock()
	n.node.CreateErr = func(sandbox.Spec) error { return errors.New("runtime crashed") }
	n.node.DeleteErr = func(string) error { return errors.New("device busy") }
	n.node.Unlock()
	_, err := e.Create(context.Background(), admin, CreateParams{Image: "busybox", Resources: sandbox.Resources{MemoryBytes: 100 * testMiB}}, "")
	if err == nil {
		t.Fatal("Create on a failing backend succeeded")
	}
	recs, _ := e.store.list()
	if len(recs) != 1 || recs[0].State != StateDeleting {
		t.Fatalf("records after a failed create and cleanup = %+v, want one deleting", recs)
	}
	id := recs[0].ID
	wantHeld(t, e, 100*testMiB)
	if _, err := e.Get(context.Background(), admin, id); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(deleting) = %v, want NotFound", err)
	}
	time.Sleep(100 * time.Millisecond) // ticks that fail leave it as it is
	if state(e, id) != StateDeleting || n.node.Calls("Delete") < 2 {
		t.Errorf("after failing ticks: state %s, %d deletes; want deleting, retried", state(e, id), n.node.Calls("Delete"))
	}
	n.node.Lock()
	n.node.DeleteErr = nil
	n.node.Unlock()
	eventually(t, "the stuck delete finished", func() bool { return state(e, id) == StateDeleted && e.admission().MemoryCommitted == 0 })
	wantHeld(t, e, 0)
	if ids := n.node.IDs(); len(ids) != 0 {
		t.Errorf("backend keeps %v", ids)
	}
}

// TestDeleteThatFailsIsRetried: a delete the backend fails is reported,
// the sandbox is gone for the API but keeps its admission, and the
// reconcile tick finishes it.
func TestDeleteThatFailsIsRetried(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	r := create(t, e, 64*testMiB)
	n.node.Lock()
	n.node.DeleteErr = func(string) error { return errors.Join(errors.New("unmount: busy"), errors.New("cgroup: busy")) }
	n.node.Unlock()
	w := e.events.subscribe(admin, nil)
	defer e.events.unsubscribe(w)
	err := e.Delete(context.Background(), admin, r.ID)
	if err == nil || !strings.Contains(err.Error(), "cgroup: busy") || !strings.Contains(err.Error(), "retries") {
		t.Fatalf("Delete on a failing backend = %v, want its errors and that it is retried", err)
	}
	wantHeld(t, e, 64*testMiB)
	if recs, _ := e.List(context.Background(), admin, nil); len(recs) != 0 {
		t.Errorf("List shows %d sandboxes being deleted", len(recs))
	}
	if err := e.Delete(context.Background(), admin, r.ID); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Delete = %v, want NotFound", err)
	}
	n.node.Lock()
	n.node.DeleteErr = nil
	n.node.Unlock()
	eventually(t, "the failed delete finished", func() bool {
		return state(e, r.ID) == StateDeleted && e.admission().MemoryCommitted == 0
	})
	wantHeld(t, e, 0)
	if got := drain(w); !slices.Equal(got, []string{"deleted"}) {
		t.Errorf("events = %v, want [deleted] once the delete finished", got)
	}
}

// TestDeleteDuringCreate: a sandbox being created cannot be deleted yet
// (FailedPrecondition with a retry hint); once it runs it can.
func TestDeleteDuringCreate(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	block := make(chan struct{})
	n.node.Lock()
	n.node.CreateBlock = block
	n.node.Unlock()
	done := make(chan *Record)
	go func() {
		r, err := e.Create(context.Background(), admin, CreateParams{Image: "busybox"}, "")
		if err != nil {
			t.Errorf("Create = %v", err)
		}
		done <- r
	}()
	var id string
	eventually(t, "create in flight", func() bool {
		recs, _ := e.store.list()
		if len(recs) == 1 {
			id = recs[0].ID
		}
		return id != ""
	})
	err := e.Delete(context.Background(), admin, id)
	if _, hint := errdefs.RetryHint(err); !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !hint {
		t.Errorf("Delete during create = %v, want FailedPrecondition with a retry hint", err)
	}
	time.Sleep(60 * time.Millisecond) // ticks leave a create in flight alone
	close(block)
	r := <-done
	if r == nil || r.State != StateRunning {
		t.Fatalf("Create = %+v, want running", r)
	}
	if err := e.Delete(context.Background(), admin, id); err != nil {
		t.Errorf("Delete after the create = %v", err)
	}
	wantHeld(t, e, 0)
}

// TestReconcileHalfDoneStates starts an edge on records left by a crash at
// each step of create and delete, and on backend leftovers: every one
// ends, and admission counts exactly the survivors.
func TestReconcileHalfDoneStates(t *testing.T) {
	n := newTestNode(t)
	st, err := openStore(n.dir+"/edge.db", -1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	be := n.node.Open()
	mk := func(id string, s State, mem int64, inBackend bool) {
		t.Helper()
		r := &Record{ID: id, Backend: "fake", Project: "default", State: s, Resources: sandbox.Resources{MemoryBytes: mem * testMiB, DiskBytes: 16 * testMiB},
			CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour), IdleTTL: time.Hour}
		if err := st.insert(r); err != nil {
			t.Fatal(err)
		}
		if inBackend {
			if _, err := be.Create(ctx, sandbox.Spec{ID: id}); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("n-creatingnone", StateCreating, 1, false)                                 // crash after the record, before the backend
	mk("n-creatingmade", StateCreating, 2, true)                                  // crash after the backend made it
	mk("n-deletingmade", StateDeleting, 4, true)                                  // crash after the delete was recorded
	mk("n-deletinggone", StateDeleting, 8, false)                                 // crash after the backend removed it
	mk("n-runningalive", StateRunning, 16, true)                                  // survives
	mk("n-runninggone0", StateRunning, 32, false)                                 // lost while no edge ran
	mk("n-runningexitd", StateRunning, 64, true)                                  // its init ended while no edge ran
	mk("n-exitedexited", StateExited, 128, true)                                  // survives, exited
	if _, err := be.Create(ctx, sandbox.Spec{ID: "n-orphanorphan"}); err != nil { // no record
		t.Fatal(err)
	}
	n.node.Exit("n-runningexitd", "init killed by signal 9")
	n.node.Exit("n-exitedexited", "done")
	st.close()

	e := n.open()
	defer e.Close()
	got := map[string]State{}
	recs, _ := e.store.list()
	for _, r := range recs {
		got[r.ID] = r.State
	}
	want := map[string]State{
		"n-runningalive": StateRunning, "n-runninggone0": StateFailed,
		"n-runningexitd": StateExited, "n-exitedexited": StateExited,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records after start (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"n-exitedexited", "n-runningalive", "n-runningexitd"}, n.node.IDs()); diff != "" {
		t.Errorf("backend's sandboxes after start (-want +got):\n%s", diff)
	}
	wantHeld(t, e, (16+32+64+128)*testMiB)
}

// TestFormat1Reconciled starts an edge on the format 1 fixture: what the
// old dsec left is taken over as it was, and its deleting sandbox is
// finished.
func TestFormat1Reconciled(t *testing.T) {
	n := newTestNode(t)
	copyFixtureTo(t, "format1/edge.db", n.dir+"/edge.db")
	be := n.node.Open()
	for _, id := range []string{"golden-6c6uaxuap3lg", "golden-zyhp347egxut", "golden-lskfo7xvcoqs", "golden-dqolv2tgiwol"} {
		if _, err := be.Create(context.Background(), sandbox.Spec{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	n.node.Exit("golden-lskfo7xvcoqs", "init killed by signal 9 (killed)")
	// The fixture's records are of backend "container".
	e, err := New(context.Background(), Config{
		Node: "golden", StateDir: n.dir, Backends: map[string]sandbox.Backend{"container": be},
		Images: fakeImages{}, MemoryBytes: 8 << 30, MemoryReserve: 1, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("New on a format 1 state = %v", err)
	}
	defer e.Close()
	got := map[string]State{}
	recs, _ := e.store.list()
	for _, r := range recs {
		got[r.ID] = r.State
	}
	want := map[string]State{
		"golden-6c6uaxuap3lg": StateRunning, "golden-zyhp347egxut": StateRunning,
		"golden-lskfo7xvcoqs": StateExited, "golden-7naxh7jqdqkw": StateFailed,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records of format 1 after start (-want +got):\n%s", diff)
	}
	if slices.Contains(n.node.IDs(), "golden-dqolv2tgiwol") {
		t.Errorf("the deleting sandbox of format 1 is still in the backend")
	}
	wantHeld(t, e, (64+64+96+128)*testMiB)
	// Its idempotency key is kept: another request with it is refused.
	_, err = e.Create(context.Background(), Caller{Project: "default", KeyID: "zqmuj5gm"}, CreateParams{Image: "other"}, "golden-key-1")
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("golden-key-1 with another request = %v, want FailedPrecondition", err)
	}
}

// TestIdempotency: a retry with the same key and request returns the same
// sandbox (one backend create); another request with that key is
// FailedPrecondition; after a delete the key returns the sandbox as
// deleted.
func TestIdempotency(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	p := CreateParams{Image: "busybox", Labels: map[string]string{"job": "a"}}
	r1, err := e.Create(ctx, admin, p, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := e.Create(ctx, admin, p, "key-1")
	if err != nil || r2.ID != r1.ID {
		t.Errorf("retry = %+v, %v, want sandbox %s", r2, err, r1.ID)
	}
	if c := n.node.Calls("Create"); c != 1 {
		t.Errorf("backend creates = %d, want 1", c)
	}
	other := Caller{Project: "default", KeyID: "k2"}
	r3, err := e.Create(ctx, other, p, "key-1")
	if err != nil || r3.ID == r1.ID {
		t.Errorf("same key of another API key = %+v, %v, want a new sandbox", r3, err)
	}
	if _, err := e.Create(ctx, admin, CreateParams{Image: "busybox"}, "key-1"); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("same key, other request = %v, want FailedPrecondition", err)
	}
	if err := e.Delete(ctx, admin, r1.ID); err != nil {
		t.Fatal(err)
	}
	r4, err := e.Create(ctx, admin, p, "key-1")
	if err != nil || r4.ID != r1.ID || r4.State != StateDeleting {
		t.Errorf("retry after delete = %+v, %v, want %s as deleted", r4, err, r1.ID)
	}
	wantHeld(t, e, 64*testMiB) // r3
}

// TestTTLs: an expired hard TTL deletes a sandbox (ttl_expired); idleness
// counts no time while an exec runs or a stream is open.
func TestTTLs(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	hard, err := e.Create(ctx, admin, CreateParams{Image: "busybox", TTL: time.Hour, IdleTTL: 10 * time.Hour}, "")
	if err != nil {
		t.Fatal(err)
	}
	idle, err := e.Create(ctx, admin, CreateParams{Image: "busybox", TTL: 10 * time.Hour, IdleTTL: time.Minute}, "")
	if err != nil {
		t.Fatal(err)
	}
	w := e.events.subscribe(admin, nil)
	defer e.events.unsubscribe(w)
	// A command runs in the idle one: it is not idle.
	n.node.Lock()
	n.node.Run = func(sandbox.ExecSpec) (string, sandbox.ExitStatus, bool) { return "", sandbox.ExitStatus{}, true }
	n.node.Unlock()
	var execID string
	if err := e.Exec(ctx, admin, ExecParams{Sandbox: idle.ID, Argv: []string{"sleep"}, Detach: true}, func(ev ExecEvent) error {
		execID = ev.Started
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.reap(time.Now().Add(2 * time.Minute))
	if state(e, hard.ID) != StateRunning || state(e, idle.ID) != StateRunning {
		t.Fatalf("after 2 min: %s, %s; want both running (one has an exec running)", state(e, hard.ID), state(e, idle.ID))
	}
	n.node.Finish(idle.ID, execID, 0)
	e.reap(time.Now().Add(2 * time.Minute))
	if state(e, idle.ID) != StateDeleted {
		t.Errorf("idle sandbox after its exec ended and 2 idle minutes: %s, want deleted", state(e, idle.ID))
	}
	e.reap(time.Now().Add(2 * time.Hour))
	if state(e, hard.ID) != StateDeleted {
		t.Errorf("sandbox 2 h after its hard TTL of 1 h: %s, want deleted", state(e, hard.ID))
	}
	if got := drain(w); !slices.Equal(got, []string{"ttl_expired", "ttl_expired"}) {
		t.Errorf("events = %v, want two ttl_expired", got)
	}
	wantHeld(t, e, 0)
}

// TestTTLClock: a state whose TTL clock does not run adds its time to
// the hard TTL when the sandbox leaves it: a pause, a resume.
func TestTTLClock(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	r := &Record{ExpiresAt: t0.Add(time.Hour)}
	moveClock(r, StateRunning, StatePausing, t0) // still runs
	if !r.TTLStopped.IsZero() {
		t.Fatalf("TTLStopped after running → pausing = %v, want the clock running", r.TTLStopped)
	}
	moveClock(r, StatePausing, StatePaused, t0.Add(time.Minute))
	if want := t0.Add(time.Minute); !r.TTLStopped.Equal(want) {
		t.Fatalf("TTLStopped = %v, want %v", r.TTLStopped, want)
	}
	moveClock(r, StatePaused, StateResuming, t0.Add(10*time.Minute)) // still stopped
	moveClock(r, StateResuming, StateRunning, t0.Add(11*time.Minute))
	if want := t0.Add(70 * time.Minute); !r.ExpiresAt.Equal(want) || !r.TTLStopped.IsZero() {
		t.Errorf("ExpiresAt after 10 min paused = %v (stopped %v), want %v", r.ExpiresAt, r.TTLStopped, want)
	}
	if got := hardExpiry(&Record{State: StatePaused, ExpiresAt: t0, TTLStopped: t0}, t0.Add(time.Hour)); !got.Equal(t0.Add(time.Hour)) {
		t.Errorf("hardExpiry of a sandbox paused for an hour = %v, want moved on by the hour", got)
	}
}

// TestStateTable: every state's transitions lead to states of the table,
// and the table is what state.go's comment says.
func TestStateTable(t *testing.T) {
	got := map[State][]State{}
	for s, info := range states {
		got[s] = info.next
		for _, to := range info.next {
			if _, ok := states[to]; !ok && to != StateDeleted {
				t.Errorf("%s → %s: %s is not in the table", s, to, to)
			}
		}
	}
	want := map[State][]State{
		StateCreating: {StateRunning, StateDeleting},
		StateRunning:  {StateExited, StateFailed, StateDeleting, StatePausing},
		StatePausing:  {StatePaused, StateRunning, StateFailed, StateDeleting},
		StatePaused:   {StateResuming, StateFailed, StateDeleting},
		StateResuming: {StateRunning, StateFailed, StateDeleting},
		StateExited:   {StateDeleting},
		StateFailed:   {StateDeleting},
		StateDeleting: {StateDeleted},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("transition table (-want +got):\n%s", diff)
	}
	for _, tt := range []struct {
		from, to State
		event    string
	}{
		{StateCreating, StateRunning, EventCreated},
		{StateCreating, StateDeleting, EventFailed},
		{StateRunning, StateExited, EventExited},
		{StateRunning, StateFailed, EventFailed},
		{StateRunning, StateDeleting, ""},
		{StateRunning, StatePausing, ""},
		{StatePausing, StatePaused, EventPaused},
		{StatePausing, StateRunning, ""},
		{StatePausing, StateFailed, EventFailed},
		{StatePaused, StateResuming, ""},
		{StateResuming, StateRunning, EventResumed},
		{StateResuming, StateFailed, EventFailed},
		{StatePaused, StateFailed, EventFailed},
		{StatePaused, StateDeleting, ""},
	} {
		if got := transitionEvent(tt.from, tt.to); got != tt.event {
			t.Errorf("transitionEvent(%s, %s) = %q, want %q", tt.from, tt.to, got, tt.event)
		}
	}
}

// TestTransitionRefused: a transition the table does not allow changes
// nothing and says why.
func TestTransitionRefused(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	r := create(t, e, 64*testMiB)
	n.node.Exit(r.ID, "done")
	eventually(t, "exit recorded", func() bool { return state(e, r.ID) == StateExited })
	_, err := e.transition(r.ID, "", StateFailed, "late failure", nil)
	if !errors.Is(err, errTransition) || !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("exited → failed = %v, want a refused transition", err)
	}
	if got, _ := e.store.get(r.ID); got.State != StateExited || got.Reason != "done" {
		t.Errorf("after a refused transition: %s (%s), want exited (done)", got.State, got.Reason)
	}
}

// TestEvents: watchers see each transition once, in order.
func TestEvents(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	w := e.events.subscribe(admin, nil)
	defer e.events.unsubscribe(w)
	r := create(t, e, 64*testMiB)
	n.node.Event(r.ID, sandbox.EventOOM, "a process was killed")
	n.node.Exit(r.ID, "init ended")
	n.node.Exit(r.ID, "init ended") // reported twice: published once
	eventually(t, "exit recorded", func() bool { return state(e, r.ID) == StateExited })
	if err := e.Delete(context.Background(), admin, r.ID); err != nil {
		t.Fatal(err)
	}
	if got := drain(w); !slices.Equal(got, []string{"created", "oom", "exited", "deleted"}) {
		t.Errorf("events = %v, want created, oom, exited, deleted", got)
	}
}

// TestSandboxEnv: the backend gets the sandbox's environment, the image's
// with the request's on top.
func TestSandboxEnv(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	r, err := e.Create(context.Background(), admin, CreateParams{Image: "busybox", Env: map[string]string{"LANG": "C.UTF-8", "A": "1"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := n.node.Spec(r.ID)
	if diff := cmp.Diff([]string{"PATH=/bin", "LANG=C.UTF-8", "A=1"}, spec.Env); diff != "" {
		t.Errorf("Spec.Env (-want +got):\n%s", diff)
	}
}

// TestBackendsAndLackedCapabilities: the node lists its backends with
// tier and capabilities, and an operation a backend lacks is
// FailedPrecondition naming the backend and the capability.
func TestBackendsAndLackedCapabilities(t *testing.T) {
	n := newTestNode(t)
	n.node.Features = []sandbox.Capability{sandbox.CapRestart}
	e := n.open()
	defer e.Close()
	want := []BackendInfo{{Name: "fake", Tier: sandboxtest.TierFake, Capabilities: []sandbox.Capability{sandbox.CapEvents, sandbox.CapRestart}, Default: true}}
	if diff := cmp.Diff(want, e.Backends()); diff != "" {
		t.Errorf("Backends (-want +got):\n%s", diff)
	}
	r := create(t, e, 64*testMiB)
	ctx := context.Background()
	err := e.Exec(ctx, admin, ExecParams{Sandbox: r.ID, Argv: []string{"sh"}, TTY: true}, func(ExecEvent) error { return nil })
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fake backend has no tty") {
		t.Errorf("TTY exec on a backend without tty = %v, want FailedPrecondition naming fake and tty", err)
	}
	err = e.Exec(ctx, admin, ExecParams{Sandbox: r.ID, Shell: "cd /tmp", Session: "main"}, func(ExecEvent) error { return nil })
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fake backend has no sessions") {
		t.Errorf("session exec on a backend without sessions = %v, want FailedPrecondition naming fake and sessions", err)
	}
	if _, err := e.ListSessions(ctx, admin, r.ID); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("ListSessions on a backend without sessions = %v, want FailedPrecondition", err)
	}
	for _, p := range []ExecParams{
		{Sandbox: r.ID, Argv: []string{"true"}, Session: "main"},
		{Sandbox: r.ID, Shell: "true", Session: "main", TTY: true},
		{Sandbox: r.ID, Shell: "true", SessionShell: "/bin/sh"},
	} {
		if err := e.Exec(ctx, admin, p, func(ExecEvent) error { return nil }); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Exec(%+v) = %v, want InvalidArgument", p, err)
		}
	}
	_, err = e.PackDiff(ctx, admin, r.ID, "img:v1", PackOptions{})
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fake backend has no pack") {
		t.Errorf("PackDiff on a backend without pack = %v, want FailedPrecondition naming fake and pack", err)
	}
}

// drain returns the types of the events waiting on w.
func drain(w *watcher) []string {
	var out []string
	for {
		select {
		case ev := <-w.ch:
			out = append(out, ev.Type)
		case <-time.After(50 * time.Millisecond):
			return out
		}
	}
}
