package edge

// Rollouts (docs/rollouts.md): sandboxes made, kept and ended together
// (a worker that runs an agent loop, the agent's sandbox, helpers), with
// one ID, shared labels, one lifetime and a small key/value status.
//
// A rollout lives on one node, beside its members: its record is in the
// node's bbolt file (bucket rollouts), its ID encodes the node as a
// sandbox ID does, and its members are made here, all or none. Each
// member's record names the rollout (Record.Rollout) and carries the
// reserved label RolloutLabel=<id>, which no request can set, change or
// remove. The record is written (creating, with the members' IDs chosen)
// before the first member is made, so a create the node did not finish,
// whatever stopped it, is undone by the rollout tick: members that exist
// are deleted, then the record.
//
// One lifetime: members get the rollout's TTLs, idleness is judged over
// the rollout (a member is idle only while every member is), a member is
// not deleted alone (Delete by ID refuses; a selector that matches a
// member deletes its whole rollout), and when a member is gone anyway (its
// hard TTL, moved apart by SetTimeout, ended it) the tick deletes the
// rest.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	rolloutv1 "github.com/dsecproject/dsec/api/dsec/rollout/v1"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazyregexp"
	"github.com/dsecproject/dsec/internal/project"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// RolloutLabel is the label every member of a rollout carries, whose value
// is the rollout's ID (select a rollout's sandboxes with -l
// dsec.rollout=ID). Only the node sets it: a create, a rollout spec or an
// UpdateLabels that names it is refused.
const RolloutLabel = "dsec.rollout"

// The environment every member gets: its rollout, its own name, and every
// member's sandbox ID (name=id,name=id in the spec's order).
const (
	EnvRollout        = "DSEC_ROLLOUT"
	EnvRolloutMember  = "DSEC_ROLLOUT_MEMBER"
	EnvRolloutMembers = "DSEC_ROLLOUT_MEMBERS"
)

// The bounds of a rollout (rollout.proto).
const (
	MaxRolloutMembers  = 16
	MaxStatusKeys      = 64
	MaxStatusKeyBytes  = 128
	MaxStatusValue     = 4 << 10
	MaxStatusBytes     = 64 << 10
	maxRolloutIdemKey  = 256
	roleWorker         = "worker"
	roleSandbox        = "sandbox"
	idleActionDelete   = "delete"
	idleActionPause    = "pause"
	rolloutCreateLimit = 5 * time.Minute
)

var (
	bucketRollouts    = []byte("rollouts")
	bucketRolloutIdem = []byte("rollout-idempotency")

	memberNameRe = lazyregexp.New(`^[a-z][a-z0-9-]{0,31}$`)
	statusKeyRe  = lazyregexp.New(`^[A-Za-z0-9_.:/-]{1,128}$`)
)

// RolloutState is where a rollout is in its life (the strings are stored).
type RolloutState string

// The states of a rollout record.
const (
	// RolloutCreating: recorded, members being made. A creating record
	// no create is making is undone by the tick.
	RolloutCreating RolloutState = "creating"
	RolloutReady    RolloutState = "ready"
	// RolloutDeleting: its members are being deleted; the tick finishes
	// what a delete did not.
	RolloutDeleting RolloutState = "deleting"
)

// RolloutRecord is what the node keeps of a rollout.
type RolloutRecord struct {
	ID      string            `json:"id"`
	Project string            `json:"project"`
	State   RolloutState      `json:"state"`
	Labels  map[string]string `json:"labels,omitempty"`
	Members []RolloutMember   `json:"members"`
	Status  map[string]string `json:"status,omitempty"`
	// The TTLs every member got, and its idle action.
	TTL        time.Duration `json:"ttl"`
	IdleTTL    time.Duration `json:"idle_ttl"`
	PausedTTL  time.Duration `json:"paused_ttl,omitempty"`
	IdleAction string        `json:"idle_action,omitempty"`
	CreatedAt  time.Time     `json:"created_at"`
	// Reason says why a deleting rollout is being deleted.
	Reason string `json:"reason,omitempty"`
}

// RolloutMember is one member: its name and role in the spec, and its
// sandbox.
type RolloutMember struct {
	Name      string `json:"name"`
	Role      string `json:"role"`
	SandboxID string `json:"sandbox_id"`
}

// memberIDs returns the sandbox IDs of ro's members.
func (ro *RolloutRecord) memberIDs() []string {
	ids := make([]string, len(ro.Members))
	for i, m := range ro.Members {
		ids[i] = m.SandboxID
	}
	return ids
}

// rollouts is what the edge keeps in memory of its rollouts: which
// sandbox is whose member (idleness is judged per rollout) and which
// rollouts an operation is in flight on (the tick leaves those alone). Its
// zero value works.
type rollouts struct {
	mu sync.Mutex
	// guarded by mu
	of      map[string]string   // member sandbox ID -> rollout ID
	members map[string][]string // rollout ID -> member sandbox IDs
	busy    map[string]string   // rollout ID -> "create", "delete" or "tick"
	freed   *sync.Cond          // on mu; broadcast when a claim ends
}

// add records ro's members.
func (x *rollouts) add(id string, members []string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.of == nil {
		x.of, x.members = map[string]string{}, map[string][]string{}
	}
	x.members[id] = slices.Clone(members)
	for _, m := range members {
		x.of[m] = id
	}
}

// remove forgets rollout id.
func (x *rollouts) remove(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, m := range x.members[id] {
		delete(x.of, m)
	}
	delete(x.members, id)
}

// siblings returns the members of sandbox id's rollout, id included; nil
// for a sandbox of no rollout.
func (x *rollouts) siblings(id string) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	ro, ok := x.of[id]
	if !ok {
		return nil
	}
	return slices.Clone(x.members[ro])
}

// claim marks an operation in flight on rollout id unless one is; the
// tick's look at a rollout is waited for.
func (x *rollouts) claim(id, op string) (func(), error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for x.busy[id] == "tick" {
		x.cond().Wait()
	}
	return x.claimLocked(id, op)
}

// tryClaim is claim for the tick: it waits for nothing.
func (x *rollouts) tryClaim(id string) (func(), error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.claimLocked(id, "tick")
}

// cond returns freed, made on first use; guarded by mu.
func (x *rollouts) cond() *sync.Cond {
	if x.freed == nil {
		x.freed = sync.NewCond(&x.mu)
	}
	return x.freed
}

// claimLocked is claim; guarded by mu.
func (x *rollouts) claimLocked(id, op string) (func(), error) {
	if cur, ok := x.busy[id]; ok {
		if cur == "create" {
			return nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrFailedPrecondition, "rollout %s is still being created: retry once it is", id), time.Second)
		}
		return nil, errdefs.Newf(errdefs.ErrNotFound, "rollout %s is being deleted", id)
	}
	if x.busy == nil {
		x.busy = map[string]string{}
	}
	x.busy[id] = op
	return func() {
		x.mu.Lock()
		delete(x.busy, id)
		x.cond().Broadcast()
		x.mu.Unlock()
	}, nil
}

// deleting marks the tick's claim of rollout id a delete: others no
// longer wait for it.
func (x *rollouts) deleting(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.busy[id] == "tick" {
		x.busy[id] = "delete"
		x.cond().Broadcast()
	}
}

func (x *rollouts) inFlight(id string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.busy[id]
	return ok
}

// ValidateRolloutSpec checks a rollout's spec: its members (1 to 16,
// unique names, at most one worker, each with a sandbox), its labels (none
// of them RolloutLabel), its TTLs and idle action, and its status-free
// shape. What each member's sandbox asks for is checked as any create is,
// when it is made.
func ValidateRolloutSpec(s *rolloutv1.Spec) error {
	if s == nil {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "rollout: no spec (give its members, example in docs/rollouts.md)")
	}
	if err := validateRolloutLabels("rollout", s.GetLabels()); err != nil {
		return err
	}
	for _, d := range []struct {
		name string
		v    interface{ AsDuration() time.Duration }
		set  bool
	}{{"ttl", s.GetTtl(), s.Ttl != nil}, {"idle_ttl", s.GetIdleTtl(), s.IdleTtl != nil}, {"paused_ttl", s.GetPausedTtl(), s.PausedTtl != nil}} {
		if d.set && d.v.AsDuration() < 0 {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "rollout %s %s is negative: give a positive duration", d.name, d.v.AsDuration())
		}
	}
	switch s.GetIdleAction() {
	case "", idleActionDelete, idleActionPause:
	default:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "rollout idle_action %.40q: use \"delete\" or \"pause\"", s.GetIdleAction())
	}
	ms := s.GetMembers()
	if len(ms) == 0 || len(ms) > MaxRolloutMembers {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "rollout has %d members: give 1 to %d", len(ms), MaxRolloutMembers)
	}
	names := map[string]bool{}
	workers := 0
	for i, m := range ms {
		if m == nil {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "rollout member %d is empty", i)
		}
		if !memberNameRe.MatchString(m.GetName()) {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "rollout member %d: name %.40q: use 1-32 of [a-z0-9-], starting with a letter", i, m.GetName())
		}
		if names[m.GetName()] {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "rollout member name %q is used twice: names are unique in a rollout", m.GetName())
		}
		names[m.GetName()] = true
		switch m.GetRole() {
		case "", roleSandbox:
		case roleWorker:
			workers++
		default:
			return errdefs.Newf(errdefs.ErrInvalidArgument, "rollout member %s: role %.40q: use \"worker\" or \"sandbox\"", m.GetName(), m.GetRole())
		}
		if m.GetSandbox() == nil {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "rollout member %s has no sandbox: give its image (and resources, labels, network)", m.GetName())
		}
		if err := validateRolloutLabels("rollout member "+m.GetName(), m.GetSandbox().GetLabels()); err != nil {
			return err
		}
	}
	if workers > 1 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "rollout has %d workers: at most one member has role worker", workers)
	}
	return nil
}

// validateRolloutLabels checks labels and refuses RolloutLabel.
func validateRolloutLabels(what string, labels map[string]string) error {
	if _, ok := labels[RolloutLabel]; ok {
		return reservedLabel()
	}
	if err := ValidateLabels(labels); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func reservedLabel() error {
	return errdefs.Newf(errdefs.ErrInvalidArgument,
		"label %s is the platform's: it names the rollout a sandbox belongs to, and only the node sets it (make a rollout with `dsec rollout create`)", RolloutLabel)
}

// checkRolloutLabels refuses a create or label update that would set,
// change or remove RolloutLabel other than as the node does for a member
// of rollout (empty: a sandbox of no rollout).
func checkRolloutLabels(labels map[string]string, rollout string) error {
	v, ok := labels[RolloutLabel]
	if ok != (rollout != "") || v != rollout {
		return reservedLabel()
	}
	return nil
}

// CheckStatus checks a SetStatus: keys of [A-Za-z0-9_.:/-] (1-128 bytes),
// values up to 4 KiB, applied on cur (removals first) no more than 64
// keys and 64 KiB of keys and values. It returns the status as it would
// be.
func CheckStatus(cur, set map[string]string, remove []string) (map[string]string, error) {
	for _, k := range remove {
		if !statusKeyRe.MatchString(k) {
			return nil, badStatusKey(k)
		}
	}
	for k, v := range set {
		if !statusKeyRe.MatchString(k) {
			return nil, badStatusKey(k)
		}
		if len(v) > MaxStatusValue {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "status %s: a value of %d bytes: at most %d (keep large results in the sandbox's files)", k, len(v), MaxStatusValue)
		}
	}
	next := maps.Clone(cur)
	if next == nil {
		next = map[string]string{}
	}
	for _, k := range remove {
		delete(next, k)
	}
	maps.Copy(next, set)
	size := 0
	for k, v := range next {
		size += len(k) + len(v)
	}
	switch {
	case len(next) > MaxStatusKeys:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "the rollout's status would hold %d keys: at most %d (remove some, or keep a summary)", len(next), MaxStatusKeys)
	case size > MaxStatusBytes:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "the rollout's status would hold %d bytes of keys and values: at most %d (remove some, or keep large results in the sandbox's files)", size, MaxStatusBytes)
	}
	return next, nil
}

func badStatusKey(k string) error {
	return errdefs.Newf(errdefs.ErrInvalidArgument, "status key %.80q: use 1-128 of [A-Za-z0-9_.:/-]", k)
}

// seesRollout reports whether c may see and act on ro: as sees for
// sandboxes; a rollout member's own key sees its rollout only.
func seesRollout(c Caller, ro *RolloutRecord) bool {
	if c.Rollout != "" && c.Rollout != ro.ID {
		return false
	}
	return ro.Project == c.Project || c.Admin && !project.Reserved(ro.Project)
}

// lookupRollout returns a rollout c may see, but not one being created or
// deleted; others are NotFound.
func (e *Edge) lookupRollout(c Caller, id string) (*RolloutRecord, error) {
	ro, err := e.store.getRollout(id)
	if err == nil && (!seesRollout(c, ro) || ro.State == RolloutDeleting) {
		err = errdefs.Newf(errdefs.ErrNotFound, "rollout %s not found: it was deleted or never existed (list rollouts with `dsec rollout ls`)", id)
	}
	return ro, err
}

// CreateRollout makes a rollout and its members, all or none, and returns
// it ready. With an idempotency key a retry of the same spec returns the
// same rollout (the create goes on if the caller goes away), another spec
// is FailedPrecondition.
func (e *Edge) CreateRollout(ctx context.Context, caller Caller, spec *rolloutv1.Spec, key string) (*RolloutRecord, error) {
	if caller.Rollout != "" {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "a rollout member's key cannot create rollouts")
	}
	if err := ValidateRolloutSpec(spec); err != nil {
		return nil, err
	}
	if key == "" {
		return e.createRollout(ctx, caller, spec)
	}
	if len(key) > maxRolloutIdemKey {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "idempotency key is longer than %d bytes", maxRolloutIdemKey)
	}
	hash := rolloutHash(spec)
	k := idemKey(caller, key)
	unlock := e.idem.lock("rollout\x00" + string(k))
	defer unlock()
	ent, err := e.store.getRolloutIdem(k)
	if err != nil {
		return nil, err
	}
	if ent != nil {
		if ent.Hash != hash {
			return nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
				"idempotency key %q was used for a different rollout: use a new key for a new rollout", key)
		}
		if ro, err := e.store.getRollout(ent.RolloutID); err == nil {
			return ro, nil
		}
		snap := ent.Snapshot
		snap.State, snap.Reason = RolloutDeleting, "deleted since it was created"
		return &snap, nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rolloutCreateLimit)
	defer cancel()
	ro, err := e.createRollout(cctx, caller, spec)
	if err != nil {
		return nil, err
	}
	if err := e.store.putRolloutIdem(k, &rolloutIdemEntry{Hash: hash, RolloutID: ro.ID, Created: time.Now().UTC(), Snapshot: *ro}); err != nil {
		e.log.Warn("record idempotency key", "rollout", ro.ID, "err", err)
	}
	return ro, nil
}

// rolloutHash identifies a spec (deterministic protobuf encoding).
func rolloutHash(s *rolloutv1.Spec) string {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(s)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (e *Edge) createRollout(ctx context.Context, caller Caller, spec *rolloutv1.Spec) (*RolloutRecord, error) {
	project := caller.Project
	if project == "" {
		project = "default"
	}
	d := e.cfg.Defaults
	ro := &RolloutRecord{
		ID: sandbox.NewRolloutID(e.cfg.Node), Project: project, State: RolloutCreating,
		Labels: spec.GetLabels(), TTL: spec.GetTtl().AsDuration(), IdleTTL: spec.GetIdleTtl().AsDuration(),
		PausedTTL: spec.GetPausedTtl().AsDuration(), IdleAction: spec.GetIdleAction(),
		CreatedAt: time.Now().UTC(),
	}
	if ro.TTL == 0 {
		ro.TTL = d.TTL
	}
	if ro.IdleTTL == 0 {
		ro.IdleTTL = d.IdleTTL
	}
	var pairs []string
	for _, m := range spec.GetMembers() {
		role := m.GetRole()
		if role == "" {
			role = roleSandbox
		}
		mem := RolloutMember{Name: m.GetName(), Role: role, SandboxID: e.newID()}
		ro.Members = append(ro.Members, mem)
		pairs = append(pairs, mem.Name+"="+mem.SandboxID)
	}
	done, err := e.ro.claim(ro.ID, "create")
	if err != nil {
		return nil, err
	}
	defer done()
	e.ro.add(ro.ID, ro.memberIDs())
	if err := e.store.putRollout(ro, true); err != nil {
		e.ro.remove(ro.ID)
		return nil, err
	}
	// The members' expiry is the rollout's.
	expires := ro.CreatedAt.Add(ro.TTL)
	for i, m := range spec.GetMembers() {
		msg := proto.Clone(m.GetSandbox()).(*sandboxv1.CreateRequest)
		msg.IdempotencyKey = ""
		msg.IdleTtl, msg.PausedTtl, msg.IdleAction = spec.GetIdleTtl(), spec.GetPausedTtl(), spec.GetIdleAction()
		p := CreateParamsOf(msg)
		p.TTL = max(time.Until(expires), time.Second)
		p.IdleTTL = ro.IdleTTL
		labels := maps.Clone(ro.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		maps.Copy(labels, msg.GetLabels())
		labels[RolloutLabel] = ro.ID
		p.Labels = labels
		env := maps.Clone(p.Env)
		if env == nil {
			env = map[string]string{}
		}
		env[EnvRollout], env[EnvRolloutMember], env[EnvRolloutMembers] = ro.ID, ro.Members[i].Name, strings.Join(pairs, ",")
		p.Env = env
		p.id, p.rollout = ro.Members[i].SandboxID, ro.ID
		if _, err := e.create(ctx, caller, p); err != nil {
			e.undoRollout(ctx, ro.ID, "its create failed")
			return nil, fmt.Errorf("rollout member %s: %w", m.GetName(), err)
		}
	}
	// One expiry for all: each was made with what remained of the TTL.
	for _, m := range ro.Members {
		if _, err := e.store.update(m.SandboxID, func(r *Record) error {
			r.ExpiresAt = expires
			return nil
		}); err != nil {
			e.undoRollout(ctx, ro.ID, "its create failed")
			return nil, err
		}
	}
	ro, err = e.store.updateRollout(ro.ID, func(r *RolloutRecord) error {
		r.State = RolloutReady
		return nil
	})
	if err != nil {
		e.undoRollout(ctx, ro.ID, "its create failed")
		return nil, err
	}
	return ro, nil
}

// undoRollout deletes what a create of rollout id made, even if the
// caller has gone; what cannot be deleted now the ticks retry.
func (e *Edge) undoRollout(ctx context.Context, id, reason string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if _, err := e.finishRolloutDelete(cctx, id, EventDeleted, reason); err != nil {
		e.log.Warn("clean up rollout", "rollout", id, "err", err)
	}
}

// GetRollout returns a rollout and its members' sandboxes (nil for a
// member gone).
func (e *Edge) GetRollout(ctx context.Context, caller Caller, id string) (*RolloutRecord, []*Record, error) {
	ro, err := e.lookupRollout(caller, id)
	if err != nil {
		return nil, nil, err
	}
	return ro, e.rolloutMembers(ctx, ro, true), nil
}

// rolloutMembers returns ro's members' records, refreshed from the
// backend (nil for one gone); touch marks each used.
func (e *Edge) rolloutMembers(ctx context.Context, ro *RolloutRecord, touch bool) []*Record {
	out := make([]*Record, len(ro.Members))
	for i, m := range ro.Members {
		r, err := e.store.get(m.SandboxID)
		if err != nil || r.State == StateDeleting {
			continue
		}
		if touch {
			e.touch(r.ID)
		}
		out[i] = e.refresh(ctx, r)
	}
	return out
}

// ListRollouts returns the rollouts caller sees whose labels match sel, in
// ID order, with their members.
func (e *Edge) ListRollouts(ctx context.Context, caller Caller, sel map[string]string) ([]*RolloutRecord, [][]*Record, error) {
	ros, err := e.store.listRollouts()
	if err != nil {
		return nil, nil, err
	}
	var out []*RolloutRecord
	var members [][]*Record
	for _, ro := range ros {
		if ro.State != RolloutReady || !seesRollout(caller, ro) || !matches(ro.Labels, sel) {
			continue
		}
		out = append(out, ro)
		members = append(members, e.rolloutMembers(ctx, ro, false))
	}
	return out, members, nil
}

// DeleteRollout deletes a rollout and every member. It returns the
// members' sandbox IDs it deleted.
func (e *Edge) DeleteRollout(ctx context.Context, caller Caller, id string) ([]string, error) {
	if caller.Rollout != "" {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "a rollout member's key cannot delete rollouts")
	}
	if _, err := e.lookupRollout(caller, id); err != nil {
		return nil, err
	}
	return e.deleteRollout(ctx, id, EventDeleted, "")
}

// deleteRollout deletes rollout id's members (with typ as their end
// event) and then its record, unless an operation is in flight on it.
func (e *Edge) deleteRollout(ctx context.Context, id, typ, reason string) ([]string, error) {
	done, err := e.ro.claim(id, "delete")
	if err != nil {
		return nil, err
	}
	defer done()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	return e.finishRolloutDelete(dctx, id, typ, reason)
}

// finishRolloutDelete marks rollout id deleting, deletes its members
// (last made first) and removes its record; the caller holds the
// rollout's claim. A member the backend could not delete keeps the
// record deleting, for the tick.
func (e *Edge) finishRolloutDelete(ctx context.Context, id, typ, reason string) ([]string, error) {
	ro, err := e.store.updateRollout(id, func(r *RolloutRecord) error {
		if r.State != RolloutDeleting {
			r.State, r.Reason = RolloutDeleting, reason
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var deleted []string
	var first error
	for i := len(ro.Members) - 1; i >= 0; i-- {
		sid := ro.Members[i].SandboxID
		err := e.deleteOne(ctx, sid, typ, reason)
		switch {
		case err == nil:
			deleted = append(deleted, sid)
		case errdefs.Is(err, errdefs.ErrNotFound):
		case first == nil:
			first = fmt.Errorf("rollout %s, member %s: %w", id, ro.Members[i].Name, err)
		}
	}
	sort.Strings(deleted)
	if first != nil {
		return deleted, first
	}
	if err := e.store.deleteRollout(id); err != nil {
		return deleted, err
	}
	e.ro.remove(id)
	return deleted, nil
}

// SetRolloutStatus sets and removes keys of a rollout's status
// (CheckStatus's bounds) and returns the rollout.
func (e *Edge) SetRolloutStatus(ctx context.Context, caller Caller, id string, set map[string]string, remove []string) (*RolloutRecord, []*Record, error) {
	if _, err := e.lookupRollout(caller, id); err != nil {
		return nil, nil, err
	}
	ro, err := e.store.updateRollout(id, func(r *RolloutRecord) error {
		if r.State != RolloutReady {
			return errdefs.Newf(errdefs.ErrNotFound, "rollout %s is %s", id, r.State)
		}
		next, err := CheckStatus(r.Status, set, remove)
		if err != nil {
			return err
		}
		r.Status = next
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return ro, e.rolloutMembers(ctx, ro, true), nil
}

// memberOf refuses an operation on rollout member r alone (Delete by ID):
// FailedPrecondition naming its rollout.
func memberAlone(r *Record) error {
	if r.Rollout == "" {
		return nil
	}
	return errdefs.Newf(errdefs.ErrFailedPrecondition,
		"sandbox %s is a member of rollout %s, whose sandboxes live and end together: delete the rollout (`dsec rollout rm %s`)", r.ID, r.Rollout, r.Rollout)
}

// deleteRolloutsOf deletes the whole rollouts of the members among recs
// and returns the other records and the members deleted.
func (e *Edge) deleteRolloutsOf(ctx context.Context, recs []*Record) (rest []*Record, deleted []string, err error) {
	seen := map[string]bool{}
	for _, r := range recs {
		if r.Rollout == "" {
			rest = append(rest, r)
			continue
		}
		if seen[r.Rollout] {
			continue
		}
		seen[r.Rollout] = true
		ids, derr := e.deleteRollout(ctx, r.Rollout, EventDeleted, "")
		deleted = append(deleted, ids...)
		if derr != nil && !errdefs.Is(derr, errdefs.ErrNotFound) && err == nil {
			err = derr
		}
	}
	return rest, deleted, err
}

// loadRollouts reads the rollouts at start into memory.
func (e *Edge) loadRollouts() error {
	ros, err := e.store.listRollouts()
	if err != nil {
		return err
	}
	for _, ro := range ros {
		e.ro.add(ro.ID, ro.memberIDs())
	}
	return nil
}

// tickRollouts drives every rollout no operation is in flight on to where
// it belongs: a creating one (its create ended with the edge, or crashed)
// is undone; a deleting one is deleted again; a ready one whose member is
// gone is deleted whole (one lifetime: a member ends the rollout), and a
// sandbox that names a rollout the node no longer has is deleted. Old
// idempotency keys are dropped. Each rollout is judged on its record as it
// is once the tick holds it (a list read before may be stale: a create
// that has just finished).
func (e *Edge) tickRollouts(ctx context.Context) {
	ros, err := e.store.listRollouts()
	if err != nil {
		e.log.Warn("list rollouts", "err", err)
		return
	}
	for _, listed := range ros {
		done, err := e.ro.tryClaim(listed.ID)
		if err != nil {
			continue // a create or delete is on it
		}
		if reason := e.rolloutEnd(listed.ID); reason != "" {
			e.ro.deleting(listed.ID)
			e.log.Info("deleting rollout", "rollout", listed.ID, "reason", reason)
			dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			if _, err := e.finishRolloutDelete(dctx, listed.ID, EventDeleted, reason); err != nil && !errdefs.Is(err, errdefs.ErrNotFound) && !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
				e.log.Warn("delete rollout", "rollout", listed.ID, "err", err)
			}
			cancel()
		}
		done()
	}
	recs, err := e.store.list()
	if err != nil {
		return
	}
	for _, r := range recs {
		if r.Rollout == "" || r.State == StateDeleting || e.ro.inFlight(r.Rollout) {
			continue
		}
		// The rollout's record is written before its first member and
		// removed after its last: a member without one is an orphan.
		if _, err := e.store.getRollout(r.Rollout); !errdefs.Is(err, errdefs.ErrNotFound) {
			continue
		}
		e.log.Info("deleting a member of a rollout the node no longer has", "sandbox", r.ID, "rollout", r.Rollout)
		if err := e.deleteOne(ctx, r.ID, EventDeleted, "its rollout is gone"); err != nil && !errdefs.Is(err, errdefs.ErrNotFound) {
			e.log.Warn("delete rollout member", "sandbox", r.ID, "err", err)
		}
	}
	if err := e.store.expireRolloutIdem(time.Now()); err != nil {
		e.log.Warn("expire rollout idempotency keys", "err", err)
	}
}

// rolloutEnd says why rollout id, read now, must be deleted, or "" when it
// lives on; the caller holds its claim.
func (e *Edge) rolloutEnd(id string) string {
	ro, err := e.store.getRollout(id)
	if err != nil {
		return ""
	}
	switch ro.State {
	case RolloutCreating:
		return "its create did not finish"
	case RolloutDeleting:
		if ro.Reason != "" {
			return ro.Reason
		}
		return "its delete did not finish"
	}
	for _, m := range ro.Members {
		if r, err := e.store.get(m.SandboxID); errdefs.Is(err, errdefs.ErrNotFound) || err == nil && r.State == StateDeleting {
			return fmt.Sprintf("its member %s (%s) ended", m.Name, m.SandboxID)
		}
	}
	return ""
}

// rolloutIdemEntry remembers what a rollout create's key made.
type rolloutIdemEntry struct {
	Hash      string        `json:"hash"`
	RolloutID string        `json:"rollout_id"`
	Created   time.Time     `json:"created"`
	Snapshot  RolloutRecord `json:"snapshot"`
}

// putRollout writes ro; with create it must not exist yet.
func (s *store) putRollout(ro *RolloutRecord, create bool) error {
	b, err := json.Marshal(ro)
	if err != nil {
		return err
	}
	return s.updateTx(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists(bucketRollouts)
		if err != nil {
			return err
		}
		if create && bk.Get([]byte(ro.ID)) != nil {
			return errdefs.Newf(errdefs.ErrAlreadyExists, "rollout %s exists", ro.ID)
		}
		return bk.Put([]byte(ro.ID), b)
	})
}

func (s *store) getRollout(id string) (*RolloutRecord, error) {
	var ro *RolloutRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		var v []byte
		if bk := tx.Bucket(bucketRollouts); bk != nil {
			v = bk.Get([]byte(id))
		}
		if v == nil {
			return errdefs.Newf(errdefs.ErrNotFound, "rollout %s not found: it was deleted or never existed (list rollouts with `dsec rollout ls`)", id)
		}
		ro = new(RolloutRecord)
		return json.Unmarshal(v, ro)
	})
	return ro, err
}

func (s *store) listRollouts() ([]*RolloutRecord, error) {
	var out []*RolloutRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRollouts)
		if bk == nil {
			return nil
		}
		return bk.ForEach(func(_, v []byte) error {
			ro := new(RolloutRecord)
			if err := json.Unmarshal(v, ro); err != nil {
				return err
			}
			out = append(out, ro)
			return nil
		})
	})
	return out, err
}

// updateRollout applies fn to rollout id atomically.
func (s *store) updateRollout(id string, fn func(*RolloutRecord) error) (*RolloutRecord, error) {
	var ro *RolloutRecord
	err := s.updateTx(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRollouts)
		var v []byte
		if bk != nil {
			v = bk.Get([]byte(id))
		}
		if v == nil {
			return errdefs.Newf(errdefs.ErrNotFound, "rollout %s not found", id)
		}
		ro = new(RolloutRecord)
		if err := json.Unmarshal(v, ro); err != nil {
			return err
		}
		if err := fn(ro); err != nil {
			return err
		}
		b, err := json.Marshal(ro)
		if err != nil {
			return err
		}
		return bk.Put([]byte(id), b)
	})
	return ro, err
}

func (s *store) deleteRollout(id string) error {
	return s.updateTx(func(tx *bolt.Tx) error {
		if bk := tx.Bucket(bucketRollouts); bk != nil {
			return bk.Delete([]byte(id))
		}
		return nil
	})
}

func (s *store) getRolloutIdem(k []byte) (*rolloutIdemEntry, error) {
	var e *rolloutIdemEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRolloutIdem)
		if bk == nil {
			return nil
		}
		v := bk.Get(k)
		if v == nil {
			return nil
		}
		e = new(rolloutIdemEntry)
		return json.Unmarshal(v, e)
	})
	return e, err
}

func (s *store) putRolloutIdem(k []byte, e *rolloutIdemEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return s.updateTx(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists(bucketRolloutIdem)
		if err != nil {
			return err
		}
		return bk.Put(k, b)
	})
}

// expireRolloutIdem drops keys older than the TTL.
func (s *store) expireRolloutIdem(now time.Time) error {
	var old [][]byte
	err := s.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRolloutIdem)
		if bk == nil {
			return nil
		}
		return bk.ForEach(func(k, v []byte) error {
			var e rolloutIdemEntry
			if json.Unmarshal(v, &e) != nil || now.Sub(e.Created) > idempotencyTTL {
				old = append(old, append([]byte(nil), k...))
			}
			return nil
		})
	})
	if err != nil || len(old) == 0 {
		return err
	}
	return s.updateTx(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRolloutIdem)
		for _, k := range old {
			if err := bk.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}
