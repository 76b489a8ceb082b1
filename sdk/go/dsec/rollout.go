package dsec

import (
	"context"
	"maps"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	rolloutv1 "github.com/dsecproject/dsec/api/dsec/rollout/v1"
)

// Rollouts group the sandboxes of one agent rollout: a worker that runs
// the agent loop, the agent's sandbox and any helpers, made together on
// one node with one ID, shared labels, one lifetime and a small key/value
// status the worker writes and the trainer reads. A trainer that lost its
// GPU job (and its process) reconnects to its rollouts by ID; their
// sandboxes, paused by label meanwhile, resume on the next request.
// docs/rollouts.md in the repository has the whole story.

// The roles of a rollout's members (RolloutMember.Role).
const (
	RoleWorker  = "worker"
	RoleSandbox = "sandbox"
)

// RolloutLabel is the label every member of a rollout carries, whose value
// is the rollout's ID: only the server sets it.
const RolloutLabel = "dsec.rollout"

// RolloutSpec describes a rollout: its members (1 to 16, made in order,
// all or none) and what they share.
type RolloutSpec struct {
	// Labels are the rollout's, and every member gets them too (a job's
	// label, to pause all of its sandboxes with one selector).
	Labels map[string]string
	// TTL, IdleTTL and PausedTTL are every member's (their own TTLs in
	// Sandbox are ignored): hard TTL (default 1h), idle TTL (default 15m;
	// the rollout is idle only while every member is) and paused TTL
	// (default 24h). IdleAction is "delete" (default) or "pause".
	TTL, IdleTTL, PausedTTL time.Duration
	IdleAction              string
	Members                 []RolloutMember
}

// RolloutMember is one member of a RolloutSpec.
type RolloutMember struct {
	// Name is unique in the rollout: 1-32 of [a-z0-9-], starting with a
	// letter.
	Name string
	// Role is RoleWorker for the member that runs the loop (at most one),
	// else RoleSandbox (the default).
	Role string
	// Sandbox is the member's sandbox as Create takes it; its TTLs and
	// idempotency key are the rollout's.
	Sandbox CreateOptions
}

// ParseRolloutSpec reads a rollout spec written as the API's JSON (the
// rollout.v1.Spec message in protobuf's JSON mapping, as `dsec rollout
// create -f` reads it): unknown fields are errors.
func ParseRolloutSpec(data []byte) (RolloutSpec, error) {
	var p rolloutv1.Spec
	if err := protojson.Unmarshal(data, &p); err != nil {
		return RolloutSpec{}, newError(ErrInvalidArgument, "rollout spec: %v (the fields are rollout.v1.Spec's: labels, ttl, idleTtl, pausedTtl, idleAction, members)", err)
	}
	return rolloutSpecOf(&p), nil
}

func rolloutSpecOf(p *rolloutv1.Spec) RolloutSpec {
	s := RolloutSpec{Labels: maps.Clone(p.GetLabels()), IdleAction: p.GetIdleAction()}
	if p.Ttl != nil {
		s.TTL = p.GetTtl().AsDuration()
	}
	if p.IdleTtl != nil {
		s.IdleTTL = p.GetIdleTtl().AsDuration()
	}
	if p.PausedTtl != nil {
		s.PausedTTL = p.GetPausedTtl().AsDuration()
	}
	for _, m := range p.GetMembers() {
		sb := m.GetSandbox()
		opts := CreateOptions{
			Image: sb.GetImage(), Layers: sb.GetLayers(), Labels: maps.Clone(sb.GetLabels()), Env: maps.Clone(sb.GetEnv()),
			Memory: sb.GetResources().GetMemoryBytes(), CPUs: sb.GetResources().GetCpus(),
			Pids: sb.GetResources().GetPids(), Disk: sb.GetResources().GetDiskBytes(),
			Workdir: sb.GetWorkdir(), User: sb.GetUser(), Backend: sb.GetBackend(),
			Network: networkPolicyOf(sb.GetNetwork()),
		}
		if c := sb.GetLayerConfig(); c != nil {
			opts.LayerConfig = &LayerConfig{Env: c.GetEnv(), Workdir: c.GetWorkdir(), User: c.GetUser()}
		}
		s.Members = append(s.Members, RolloutMember{Name: m.GetName(), Role: m.GetRole(), Sandbox: opts})
	}
	return s
}

// proto is s on the wire.
func (s RolloutSpec) proto() (*rolloutv1.Spec, error) {
	if len(s.Members) == 0 {
		return nil, newError(ErrInvalidArgument, "rollout: no members: give at least one (a worker and the agent's sandbox, say)")
	}
	p := &rolloutv1.Spec{
		Labels: s.Labels, Ttl: optDuration(s.TTL), IdleTtl: optDuration(s.IdleTTL), PausedTtl: optDuration(s.PausedTTL),
		IdleAction: s.IdleAction,
	}
	for _, m := range s.Members {
		if m.Sandbox.IdempotencyKey != "" || m.Sandbox.TTL != 0 || m.Sandbox.IdleTTL != 0 {
			return nil, newError(ErrInvalidArgument, "rollout member %s: its TTLs and idempotency key are the rollout's: set them on the RolloutSpec and CreateRolloutOptions", m.Name)
		}
		req, err := createRequest(m.Sandbox)
		if err != nil {
			return nil, newError(ErrInvalidArgument, "rollout member %s: %v", m.Name, err)
		}
		p.Members = append(p.Members, &rolloutv1.Member{Name: m.Name, Role: m.Role, Sandbox: req})
	}
	return p, nil
}

// Rollout is a snapshot of one rollout as the server last described it,
// and a handle to act on it.
type Rollout struct {
	ID      string
	Project string
	// Node runs the rollout and all its members.
	Node    string
	Labels  map[string]string
	Members []RolloutMemberStatus
	// Status is what its members and its owner set (SetStatus).
	Status    map[string]string
	CreatedAt time.Time
	// ExpiresAt is when the rollout ends: when its first member's hard TTL
	// does.
	ExpiresAt time.Time

	c *Client
}

// RolloutMemberStatus is one member of a Rollout.
type RolloutMemberStatus struct {
	Name      string
	Role      string
	SandboxID string
	// State is the member's sandbox's (StateDeleted once it is gone).
	State string
}

// CreateRolloutOptions are the options of CreateRollout.
type CreateRolloutOptions struct {
	// IdempotencyKey makes a retry of the same create return the same
	// rollout (kept 24h per API key); another spec under it is
	// ErrFailedPrecondition.
	IdempotencyKey string
}

// CreateRollout makes a rollout and every member, all or none, on one
// node, and returns it once every member runs. With Config.CreateRetries
// a refusal that waiting can help is tried again, as for Create.
func (c *Client) CreateRollout(ctx context.Context, spec RolloutSpec, opts CreateRolloutOptions) (*Rollout, error) {
	p, err := spec.proto()
	if err != nil {
		return nil, err
	}
	req := &rolloutv1.CreateRequest{Spec: p, IdempotencyKey: opts.IdempotencyKey}
	var resp *connect.Response[rolloutv1.CreateResponse]
	err = c.retry(ctx, "create rollout", opts.IdempotencyKey != "", func() error {
		var err error
		resp, err = c.rollouts().Create(ctx, connect.NewRequest(req))
		return c.err(err)
	})
	if err != nil {
		return nil, err
	}
	return c.rolloutFromProto(resp.Msg.GetRollout()), nil
}

// Rollout returns the rollout with the given ID: how a trainer reconnects
// to its rollouts after a restart.
func (c *Client) Rollout(ctx context.Context, id string) (*Rollout, error) {
	if id == "" {
		return nil, newError(ErrInvalidArgument, "rollout: empty ID (dsec rollout ls lists them)")
	}
	resp, err := c.rollouts().Get(ctx, connect.NewRequest(&rolloutv1.GetRequest{Id: id}))
	if err != nil {
		return nil, c.err(err)
	}
	return c.rolloutFromProto(resp.Msg.GetRollout()), nil
}

// ListRollouts returns the rollouts whose labels match every k=v of
// selector (all of them when it is empty), in ID order.
func (c *Client) ListRollouts(ctx context.Context, selector map[string]string) ([]*Rollout, error) {
	resp, err := c.rollouts().List(ctx, connect.NewRequest(&rolloutv1.ListRequest{Selector: selector}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]*Rollout, len(resp.Msg.GetRollouts()))
	for i, p := range resp.Msg.GetRollouts() {
		out[i] = c.rolloutFromProto(p)
	}
	return out, nil
}

// DeleteRollout deletes a rollout and every member.
func (c *Client) DeleteRollout(ctx context.Context, id string) error {
	_, err := c.rollouts().Delete(ctx, connect.NewRequest(&rolloutv1.DeleteRequest{Id: id}))
	return c.err(err)
}

// SetRolloutStatus sets the keys of set and removes those of remove in a
// rollout's status, and returns the rollout as it now is. A status holds at
// most 64 keys (1-128 of [A-Za-z0-9_.:/-]) and values up to 4 KiB, 64 KiB
// in all.
func (c *Client) SetRolloutStatus(ctx context.Context, id string, set map[string]string, remove ...string) (*Rollout, error) {
	resp, err := c.rollouts().SetStatus(ctx, connect.NewRequest(&rolloutv1.SetStatusRequest{Id: id, Set: set, Remove: remove}))
	if err != nil {
		return nil, c.err(err)
	}
	return c.rolloutFromProto(resp.Msg.GetRollout()), nil
}

// SetStatus sets and removes keys of the rollout's status (see
// SetRolloutStatus) and updates r.
func (r *Rollout) SetStatus(ctx context.Context, set map[string]string, remove ...string) error {
	got, err := r.c.SetRolloutStatus(ctx, r.ID, set, remove...)
	if err != nil {
		return err
	}
	*r = *got
	return nil
}

// Refresh rereads the rollout from the server into r.
func (r *Rollout) Refresh(ctx context.Context) error {
	got, err := r.c.Rollout(ctx, r.ID)
	if err != nil {
		return err
	}
	*r = *got
	return nil
}

// Delete deletes the rollout and every member.
func (r *Rollout) Delete(ctx context.Context) error { return r.c.DeleteRollout(ctx, r.ID) }

// Member returns a handle to the sandbox of the member called name, or nil
// when the rollout has none.
func (r *Rollout) Member(name string) *Sandbox {
	for _, m := range r.Members {
		if m.Name == name {
			return r.c.Sandbox(m.SandboxID)
		}
	}
	return nil
}

// Worker returns a handle to the sandbox of the worker member, or nil.
func (r *Rollout) Worker() *Sandbox {
	for _, m := range r.Members {
		if m.Role == RoleWorker {
			return r.c.Sandbox(m.SandboxID)
		}
	}
	return nil
}

func (c *Client) rolloutFromProto(p *rolloutv1.Rollout) *Rollout {
	r := &Rollout{
		ID: p.GetId(), Project: p.GetProject(), Node: p.GetNode(), Labels: maps.Clone(p.GetLabels()),
		Status: maps.Clone(p.GetStatus()), CreatedAt: timeOf(p.GetCreatedAt()), ExpiresAt: timeOf(p.GetExpiresAt()), c: c,
	}
	if r.Status == nil {
		r.Status = map[string]string{}
	}
	for _, m := range p.GetMembers() {
		r.Members = append(r.Members, RolloutMemberStatus{Name: m.GetName(), Role: m.GetRole(), SandboxID: m.GetSandboxId(), State: stateName(m.GetState())})
	}
	return r
}
