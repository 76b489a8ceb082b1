package edge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	rolloutv1 "github.com/dsecproject/dsec/api/dsec/rollout/v1"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// A rollout's semantics on the fake backend: all-or-none create with
// cleanup on every path, one lifetime, the reserved label, idempotency,
// status bounds, and what a member's own key sees.

var owner = Caller{Project: "team-a", KeyID: "k-owner"}

// twoMembers is a worker and an agent sandbox, labelled job=j1.
func twoMembers() *rolloutv1.Spec {
	return &rolloutv1.Spec{
		Labels: map[string]string{"job": "j1"},
		Ttl:    durationpb.New(time.Hour), IdleTtl: durationpb.New(10 * time.Minute),
		Members: []*rolloutv1.Member{
			{Name: "worker", Role: "worker", Sandbox: &sandboxv1.CreateRequest{Image: "python", Labels: map[string]string{"part": "loop"}, Env: map[string]string{"A": "1"}}},
			{Name: "agent", Sandbox: &sandboxv1.CreateRequest{Image: "busybox", Ttl: durationpb.New(5 * time.Second)}},
		},
	}
}

func mustRollout(t *testing.T, e *Edge, c Caller, spec *rolloutv1.Spec) *RolloutRecord {
	t.Helper()
	ro, err := e.CreateRollout(context.Background(), c, spec, "")
	if err != nil {
		t.Fatalf("CreateRollout = %v", err)
	}
	return ro
}

func member(t *testing.T, e *Edge, ro *RolloutRecord, name string) *Record {
	t.Helper()
	for _, m := range ro.Members {
		if m.Name == name {
			r, err := e.store.get(m.SandboxID)
			if err != nil {
				t.Fatalf("member %s (%s): %v", name, m.SandboxID, err)
			}
			return r
		}
	}
	t.Fatalf("rollout %s has no member %s", ro.ID, name)
	return nil
}

func execOut(t *testing.T, e *Edge, c Caller, id string, argv ...string) (string, error) {
	t.Helper()
	var out strings.Builder
	err := e.Exec(context.Background(), c, ExecParams{Sandbox: id, Argv: argv}, func(ev ExecEvent) error {
		if ev.Output != nil {
			out.Write(ev.Output.Data)
		}
		return nil
	})
	return out.String(), err
}

func TestRolloutCreate(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ro := mustRollout(t, e, owner, twoMembers())
	if node, ok := sandbox.NodeOfRolloutID(ro.ID); !ok || node != "n" || ro.State != RolloutReady || ro.Project != "team-a" {
		t.Fatalf("CreateRollout = %+v, want a ready rollout of node n, project team-a", ro)
	}
	w, a := member(t, e, ro, "worker"), member(t, e, ro, "agent")
	for _, r := range []*Record{w, a} {
		if r.State != StateRunning || r.Rollout != ro.ID || r.Labels[RolloutLabel] != ro.ID || r.Labels["job"] != "j1" || r.Project != "team-a" {
			t.Errorf("member %s = %+v, want running in rollout %s with its labels", r.ID, r, ro.ID)
		}
		if d := r.ExpiresAt.Sub(ro.CreatedAt); d < time.Hour-2*time.Second || d > time.Hour {
			t.Errorf("member %s expires %v after the rollout's creation, want the rollout's 1h (its own TTL ignored)", r.ID, d)
		}
		if r.IdleTTL != 10*time.Minute {
			t.Errorf("member %s idle TTL = %v, want the rollout's 10m", r.ID, r.IdleTTL)
		}
		if got := e.toProto(r).GetRollout(); got != ro.ID {
			t.Errorf("Sandbox.rollout of %s = %q, want %s", r.ID, got, ro.ID)
		}
	}
	if w.Labels["part"] != "loop" || a.Labels["part"] != "" {
		t.Errorf("labels: worker %v, agent %v; want the member's own labels on it only", w.Labels, a.Labels)
	}
	env, err := execOut(t, e, owner, w.ID, "env")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []string{"A=1", EnvRollout + "=" + ro.ID, EnvRolloutMember + "=worker", EnvRolloutMembers + "=worker=" + w.ID + ",agent=" + a.ID} {
		if !slices.Contains(strings.Split(env, "\n"), kv) {
			t.Errorf("worker's environment lacks %s:\n%s", kv, env)
		}
	}
	got, members, err := e.GetRollout(context.Background(), owner, ro.ID)
	if err != nil || got.ID != ro.ID || members[0].ID != w.ID || members[1].ID != a.ID {
		t.Fatalf("GetRollout = %+v, %v, %v", got, members, err)
	}
	p := e.rolloutProto(got, members)
	if len(p.GetMembers()) != 2 || p.GetMembers()[0].GetRole() != "worker" || p.GetMembers()[1].GetRole() != "sandbox" ||
		p.GetMembers()[1].GetState() != sandboxv1.State_STATE_RUNNING || p.GetNode() != "n" || !p.GetExpiresAt().AsTime().Equal(w.ExpiresAt) {
		t.Errorf("rolloutProto = %v", p)
	}
	if _, _, err := e.GetRollout(context.Background(), Caller{Project: "team-b", KeyID: "kb"}, ro.ID); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetRollout by another project = %v, want NotFound", err)
	}
	ros, _, err := e.ListRollouts(context.Background(), owner, map[string]string{"job": "j1"})
	if err != nil || len(ros) != 1 || ros[0].ID != ro.ID {
		t.Errorf("ListRollouts(job=j1) = %v, %v", ros, err)
	}
	if ros, _, _ := e.ListRollouts(context.Background(), owner, map[string]string{"job": "j2"}); len(ros) != 0 {
		t.Errorf("ListRollouts(job=j2) = %v, want none", ros)
	}
}

// TestRolloutAllOrNone: a member that cannot be made (an image not found,
// a backend failure, a reserved label) undoes the members made before it
// and the record; nothing stays admitted.
func TestRolloutAllOrNone(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	check := func(what string, err error, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: CreateRollout = %v, want %v", what, err, want)
		}
		if ids := n.node.IDs(); len(ids) != 0 {
			t.Errorf("%s: sandboxes left: %v", what, ids)
		}
		if recs, _ := e.store.list(); len(recs) != 0 {
			t.Errorf("%s: records left: %v", what, recs)
		}
		if ros, _ := e.store.listRollouts(); len(ros) != 0 {
			t.Errorf("%s: rollout records left: %+v", what, ros[0])
		}
		wantHeld(t, e, 0)
	}
	spec := twoMembers()
	spec.Members[1].Sandbox.Image = "missing"
	_, err := e.CreateRollout(ctx, owner, spec, "")
	check("image not found", err, errdefs.ErrNotFound)

	n.node.Lock()
	made := 0
	n.node.CreateErr = func(sandbox.Spec) error {
		made++
		if made == 2 {
			return errors.New("runtime broke")
		}
		return nil
	}
	n.node.Unlock()
	_, err = e.CreateRollout(ctx, owner, twoMembers(), "")
	if err == nil || !strings.Contains(err.Error(), "member agent") {
		t.Errorf("CreateRollout with the second member's backend failing = %v, want it to name member agent", err)
	}
	check("backend failure", nil, nil)
	n.node.Lock()
	n.node.CreateErr = nil
	n.node.Unlock()

	spec = twoMembers()
	spec.Members[1].Sandbox.Resources = &sandboxv1.Resources{MemoryBytes: 4 << 30}
	_, err = e.CreateRollout(ctx, owner, spec, "")
	check("no room", err, errdefs.ErrInvalidArgument)
}

// TestRolloutUnfinishedCreateUndone: a rollout whose create ended with the
// edge (a crash between its members) is undone when the edge starts
// again: the member made is deleted, and the record.
func TestRolloutUnfinishedCreateUndone(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	ro := &RolloutRecord{ID: sandbox.NewRolloutID("n"), Project: "team-a", State: RolloutCreating, CreatedAt: time.Now(),
		Members: []RolloutMember{{Name: "worker", Role: "worker", SandboxID: e.newID()}, {Name: "agent", Role: "sandbox", SandboxID: e.newID()}}}
	if err := e.store.putRollout(ro, true); err != nil {
		t.Fatal(err)
	}
	p := CreateParams{Image: "busybox", Labels: map[string]string{RolloutLabel: ro.ID}, id: ro.Members[0].SandboxID, rollout: ro.ID}
	if _, err := e.create(context.Background(), owner, p); err != nil {
		t.Fatal(err)
	}
	e.Close()
	e = n.open()
	defer e.Close()
	if ids := n.node.IDs(); len(ids) != 0 {
		t.Errorf("sandboxes after the restart: %v, want the half-made rollout's member deleted", ids)
	}
	if _, err := e.store.getRollout(ro.ID); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("rollout record after the restart: %v, want NotFound", err)
	}
	wantHeld(t, e, 0)
}

func TestRolloutIdempotency(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	a, err := e.CreateRollout(ctx, owner, twoMembers(), "job-1/0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.CreateRollout(ctx, owner, twoMembers(), "job-1/0")
	if err != nil || b.ID != a.ID || len(n.node.IDs()) != 2 {
		t.Errorf("retry = %v, %v with %d sandboxes; want rollout %s again and no new sandbox", b, err, len(n.node.IDs()), a.ID)
	}
	other := twoMembers()
	other.Labels["job"] = "j2"
	if _, err := e.CreateRollout(ctx, owner, other, "job-1/0"); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("same key, another spec = %v, want FailedPrecondition", err)
	}
	if c, err := e.CreateRollout(ctx, Caller{Project: "team-a", KeyID: "k-other"}, twoMembers(), "job-1/0"); err != nil || c.ID == a.ID {
		t.Errorf("same key from another API key = %v, %v; want a new rollout (keys are per API key)", c, err)
	}
	if _, err := e.DeleteRollout(ctx, owner, a.ID); err != nil {
		t.Fatal(err)
	}
	if c, err := e.CreateRollout(ctx, owner, twoMembers(), "job-1/0"); err != nil || c.ID != a.ID || c.State != RolloutDeleting {
		t.Errorf("retry after the delete = %+v, %v; want %s, deleted", c, err, a.ID)
	}
}

// TestRolloutOneLifetime: members are deleted together: the rollout's
// Delete, a selector matching one member, a member's TTL (the tick ends
// the rest); a member alone by ID is refused.
func TestRolloutOneLifetime(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	gone := func(ro *RolloutRecord) bool {
		if _, err := e.store.getRollout(ro.ID); !errdefs.Is(err, errdefs.ErrNotFound) {
			return false
		}
		for _, id := range ro.memberIDs() {
			if state(e, id) != StateDeleted {
				return false
			}
		}
		return true
	}

	ro := mustRollout(t, e, owner, twoMembers())
	if err := e.Delete(ctx, owner, ro.Members[1].SandboxID); !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), ro.ID) {
		t.Errorf("Delete(a member alone) = %v, want FailedPrecondition naming the rollout", err)
	}
	deleted, err := e.DeleteRollout(ctx, owner, ro.ID)
	if err != nil || len(deleted) != 2 || !gone(ro) {
		t.Errorf("DeleteRollout = %v, %v; want both members and the record gone", deleted, err)
	}
	if _, err := e.DeleteRollout(ctx, owner, ro.ID); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteRollout again = %v, want NotFound", err)
	}

	ro = mustRollout(t, e, owner, twoMembers())
	plain := create(t, e, 64*testMiB)
	if _, err := e.UpdateLabels(ctx, admin, plain.ID, map[string]string{"part": "loop"}, nil); err != nil {
		t.Fatal(err)
	}
	deleted, err = e.DeleteSelector(ctx, owner, map[string]string{"part": "loop"})
	if err != nil || !slices.Equal(deleted, slices.Sorted(slices.Values(ro.memberIDs()))) || !gone(ro) {
		t.Errorf("DeleteSelector(part=loop, the worker's label) = %v, %v; want the whole rollout %v deleted", deleted, err, ro.memberIDs())
	}
	if state(e, plain.ID) != StateRunning {
		t.Errorf("another project's sandbox with the label: %s", state(e, plain.ID))
	}

	ro = mustRollout(t, e, owner, twoMembers())
	// The agent's hard TTL ends it (as the reaper does); the tick ends the
	// rest of its rollout.
	if err := e.deleteOne(ctx, ro.Members[1].SandboxID, EventTTLExpired, "hard TTL expired"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rest of a rollout whose member ended", func() bool { return gone(ro) })
	wantHeld(t, e, 64*testMiB)
}

// TestRolloutIdleTogether: a rollout is idle only while every member is:
// the agent used through the API, or a command running in the worker,
// keeps every member; once all are idle, all go.
func TestRolloutIdleTogether(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	spec := twoMembers()
	spec.IdleTtl = durationpb.New(300 * time.Millisecond)
	ro := mustRollout(t, e, owner, spec)
	w, a := ro.Members[0].SandboxID, ro.Members[1].SandboxID
	// The worker runs a command; nothing calls the agent.
	var execID string
	err := e.Exec(context.Background(), owner, ExecParams{Sandbox: w, Argv: []string{"sleep", "60"}, Detach: true}, func(ev ExecEvent) error {
		execID = ev.Started
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if state(e, a) != StateRunning || state(e, w) != StateRunning {
		t.Fatalf("members with a command running in the worker: agent %s, worker %s; want both running", state(e, a), state(e, w))
	}
	n.node.Finish(w, execID, 0)
	eventually(t, "an idle rollout reaped whole", func() bool { return state(e, a) == StateDeleted && state(e, w) == StateDeleted })
	eventually(t, "its record removed", func() bool {
		_, err := e.store.getRollout(ro.ID)
		return errdefs.Is(err, errdefs.ErrNotFound)
	})
}

// TestRolloutReservedLabel: dsec.rollout cannot be set at create (of a
// sandbox or in a rollout's spec), nor set, changed or removed later.
func TestRolloutReservedLabel(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	ro := mustRollout(t, e, owner, twoMembers())
	other := mustRollout(t, e, owner, twoMembers())
	_, err := e.Create(ctx, owner, CreateParams{Image: "busybox", Labels: map[string]string{RolloutLabel: ro.ID}}, "")
	if !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Create(label %s=%s) = %v, want InvalidArgument", RolloutLabel, ro.ID, err)
	}
	for _, spec := range []func(*rolloutv1.Spec){
		func(s *rolloutv1.Spec) { s.Labels[RolloutLabel] = ro.ID },
		func(s *rolloutv1.Spec) { s.Members[1].Sandbox.Labels = map[string]string{RolloutLabel: ro.ID} },
	} {
		s := twoMembers()
		spec(s)
		if _, err := e.CreateRollout(ctx, owner, s, ""); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CreateRollout(a spec with label %s) = %v, want InvalidArgument", RolloutLabel, err)
		}
	}
	plain := create(t, e, 64*testMiB)
	agent := ro.Members[1].SandboxID
	for _, tc := range []struct {
		id     string
		set    map[string]string
		remove []string
	}{
		{agent, map[string]string{RolloutLabel: other.ID}, nil},
		{agent, nil, []string{RolloutLabel}},
		{plain.ID, map[string]string{RolloutLabel: ro.ID}, nil},
	} {
		if _, err := e.UpdateLabels(ctx, admin, tc.id, tc.set, tc.remove); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("UpdateLabels(%s, set %v, remove %v) = %v, want InvalidArgument", tc.id, tc.set, tc.remove, err)
		}
	}
	if r := member(t, e, ro, "agent"); r.Labels[RolloutLabel] != ro.ID || r.Rollout != ro.ID {
		t.Errorf("agent after the refused updates: labels %v, rollout %s", r.Labels, r.Rollout)
	}
	if r, _ := e.store.get(plain.ID); r.Rollout != "" || r.Labels[RolloutLabel] != "" {
		t.Errorf("plain sandbox after the refused update: %+v", r)
	}
}

// TestRolloutMemberKey: what the edge shows a rollout member's own key
// (Caller.Rollout, set by the API server from the connection's sandbox):
// its rollout and its members, nothing else of its project, and no way to
// make, delete or leave.
func TestRolloutMemberKey(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	mine, theirs := mustRollout(t, e, owner, twoMembers()), mustRollout(t, e, owner, twoMembers())
	plain, err := e.Create(ctx, owner, CreateParams{Image: "busybox"}, "")
	if err != nil {
		t.Fatal(err)
	}
	key := Caller{Project: owner.Project, KeyID: "sandbox", Rollout: mine.ID}
	if _, err := execOut(t, e, key, mine.Members[1].SandboxID, "echo", "mine"); err != nil {
		t.Errorf("Exec in its own rollout's agent = %v", err)
	}
	for _, id := range []string{theirs.Members[1].SandboxID, theirs.Members[0].SandboxID, plain.ID} {
		if _, err := execOut(t, e, key, id, "echo", "theirs"); !errdefs.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Exec in %s (not of its rollout) = %v, want NotFound", id, err)
		}
		if _, err := e.Get(ctx, key, id); !errdefs.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Get(%s) = %v, want NotFound", id, err)
		}
	}
	recs, err := e.List(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	if slices.Sort(ids); !slices.Equal(ids, slices.Sorted(slices.Values(mine.memberIDs()))) {
		t.Errorf("List = %v, want its rollout's members %v only", ids, mine.memberIDs())
	}
	if _, _, err := e.GetRollout(ctx, key, theirs.ID); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetRollout(another rollout) = %v, want NotFound", err)
	}
	if ros, _, _ := e.ListRollouts(ctx, key, nil); len(ros) != 1 || ros[0].ID != mine.ID {
		t.Errorf("ListRollouts = %v, want its own only", ros)
	}
	if _, _, err := e.SetRolloutStatus(ctx, key, mine.ID, map[string]string{"step": "1"}, nil); err != nil {
		t.Errorf("SetStatus(its rollout) = %v", err)
	}
	if _, _, err := e.SetRolloutStatus(ctx, key, theirs.ID, map[string]string{"step": "1"}, nil); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("SetStatus(another rollout) = %v, want NotFound", err)
	}
	if _, err := e.CreateRollout(ctx, key, twoMembers(), ""); !errdefs.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("CreateRollout = %v, want PermissionDenied", err)
	}
	if _, err := e.DeleteRollout(ctx, key, mine.ID); !errdefs.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("DeleteRollout(its own) = %v, want PermissionDenied", err)
	}
	if _, err := e.DeleteSelector(ctx, key, map[string]string{"job": "j1"}); !errdefs.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("DeleteSelector = %v, want PermissionDenied", err)
	}
	for _, ro := range []*RolloutRecord{mine, theirs} {
		for _, id := range ro.memberIDs() {
			if state(e, id) != StateRunning {
				t.Errorf("%s is %s after the member key's attempts", id, state(e, id))
			}
		}
	}
}

func TestRolloutStatusBounds(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	ro := mustRollout(t, e, owner, twoMembers())
	set := func(s map[string]string, rm ...string) error {
		_, _, err := e.SetRolloutStatus(ctx, owner, ro.ID, s, rm)
		return err
	}
	many := map[string]string{}
	for i := range MaxStatusKeys {
		many[fmt.Sprintf("step/%02d", i)] = "done"
	}
	if err := set(many); err != nil {
		t.Fatalf("SetStatus(%d keys) = %v", MaxStatusKeys, err)
	}
	if err := set(map[string]string{"one-more": "x"}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("SetStatus(key %d) = %v, want InvalidArgument", MaxStatusKeys+1, err)
	}
	if err := set(map[string]string{"one-more": "x"}, "step/00"); err != nil {
		t.Errorf("SetStatus(a key, removing one) = %v", err)
	}
	for _, bad := range []map[string]string{
		{"": "x"}, {"has space": "x"}, {strings.Repeat("k", 129): "x"}, {"big": strings.Repeat("v", MaxStatusValue+1)},
	} {
		if err := set(bad); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SetStatus(%.40v) = %v, want InvalidArgument", bad, err)
		}
	}
	if err := set(nil, "bad key"); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("SetStatus(remove a bad key) = %v, want InvalidArgument", err)
	}
	// 64 KiB in all: 15 values of 4 KiB fit beside the 64 small ones less
	// what they already take; a 16th does not.
	if err := set(nil, slices.Collect(func(yield func(string) bool) {
		for k := range many {
			if !yield(k) {
				return
			}
		}
	})...); err != nil {
		t.Fatal(err)
	}
	big := map[string]string{}
	for i := range 15 {
		big[fmt.Sprintf("v%02d", i)] = strings.Repeat("v", MaxStatusValue)
	}
	if err := set(big); err != nil {
		t.Fatalf("SetStatus(15 × 4 KiB) = %v", err)
	}
	if err := set(map[string]string{"v15": strings.Repeat("v", MaxStatusValue)}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("SetStatus(a 16th 4 KiB value) = %v, want InvalidArgument (64 KiB in all)", err)
	}
	got, _, _ := e.GetRollout(ctx, owner, ro.ID)
	if len(got.Status) != 16 || got.Status["one-more"] != "x" || len(got.Status["v14"]) != MaxStatusValue {
		t.Errorf("status = %d keys, want the 15 values and one-more", len(got.Status))
	}
}

func TestValidateRolloutSpec(t *testing.T) {
	sb := &sandboxv1.CreateRequest{Image: "busybox"}
	tooMany := &rolloutv1.Spec{}
	for i := range MaxRolloutMembers + 1 {
		tooMany.Members = append(tooMany.Members, &rolloutv1.Member{Name: fmt.Sprintf("m%d", i), Sandbox: sb})
	}
	for _, tc := range []struct {
		name string
		spec *rolloutv1.Spec
	}{
		{"nil", nil},
		{"no members", &rolloutv1.Spec{}},
		{"17 members", tooMany},
		{"no sandbox", &rolloutv1.Spec{Members: []*rolloutv1.Member{{Name: "a"}}}},
		{"bad name", &rolloutv1.Spec{Members: []*rolloutv1.Member{{Name: "A", Sandbox: sb}}}},
		{"name twice", &rolloutv1.Spec{Members: []*rolloutv1.Member{{Name: "a", Sandbox: sb}, {Name: "a", Sandbox: sb}}}},
		{"two workers", &rolloutv1.Spec{Members: []*rolloutv1.Member{{Name: "a", Role: "worker", Sandbox: sb}, {Name: "b", Role: "worker", Sandbox: sb}}}},
		{"bad role", &rolloutv1.Spec{Members: []*rolloutv1.Member{{Name: "a", Role: "boss", Sandbox: sb}}}},
		{"bad idle action", &rolloutv1.Spec{IdleAction: "sleep", Members: []*rolloutv1.Member{{Name: "a", Sandbox: sb}}}},
		{"negative ttl", &rolloutv1.Spec{Ttl: durationpb.New(-time.Second), Members: []*rolloutv1.Member{{Name: "a", Sandbox: sb}}}},
		{"bad label", &rolloutv1.Spec{Labels: map[string]string{"a b": "c"}, Members: []*rolloutv1.Member{{Name: "a", Sandbox: sb}}}},
	} {
		if err := ValidateRolloutSpec(tc.spec); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ValidateRolloutSpec(%s) = %v, want InvalidArgument", tc.name, err)
		}
	}
	if err := ValidateRolloutSpec(twoMembers()); err != nil {
		t.Errorf("ValidateRolloutSpec(two members) = %v", err)
	}
}
