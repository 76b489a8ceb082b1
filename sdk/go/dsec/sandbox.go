package dsec

import (
	"context"
	"maps"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// Sandbox states (Sandbox.State).
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StatePaused   = "paused"
	// StateExited: the sandbox's init died; its files stay until deleted.
	StateExited  = "exited"
	StateFailed  = "failed"
	StateDeleted = "deleted"
	// StateUnknown is what an unset or newer state reads as.
	StateUnknown = "unknown"
)

var stateNames = map[sandboxv1.State]string{
	sandboxv1.State_STATE_CREATING: StateCreating,
	sandboxv1.State_STATE_RUNNING:  StateRunning,
	sandboxv1.State_STATE_PAUSED:   StatePaused,
	sandboxv1.State_STATE_EXITED:   StateExited,
	sandboxv1.State_STATE_FAILED:   StateFailed,
	sandboxv1.State_STATE_DELETED:  StateDeleted,
}

// Resources a sandbox may use. In CreateOptions, zero fields take the
// server's defaults.
type Resources struct {
	// Memory limit in bytes (default 512 MiB).
	Memory int64
	// CPUs is a cap in cores, possibly fractional (default 1).
	CPUs float64
	// Pids is the most processes and threads (default 4096).
	Pids int64
	// Disk is the writable layer's size in bytes (default 10 GiB).
	Disk int64
}

// Sandbox is a snapshot of one sandbox as the server last described it, and
// a handle to act on it. Its methods that call the server may be used
// concurrently, except Refresh, which rewrites the fields.
type Sandbox struct {
	ID     string
	Image  string
	Labels map[string]string
	// State is one of the State* constants.
	State string
	// Reason says why the sandbox failed or exited.
	Reason    string
	Resources Resources
	Node      string
	Backend   string
	Project   string
	CreatedAt time.Time
	// ExpiresAt is when the hard TTL ends the sandbox.
	ExpiresAt time.Time
	IdleTTL   time.Duration
	// IdleExpiresAt is when the idle TTL ends (or pauses) the sandbox
	// unless something uses it first; zero while a stream is open, while
	// it is paused, or without an idle TTL.
	IdleExpiresAt time.Time
	// IdleAction is what its idle TTL does when it runs out: IdleDelete
	// or IdlePause.
	IdleAction string
	// PausedTTL is how long it may stay paused. While it is paused,
	// PausedAt is when it was paused and PausedExpiresAt when its paused
	// TTL deletes it (both zero otherwise), and ExpiresAt is when its hard
	// TTL would end it were it resumed now (paused time does not count).
	PausedTTL       time.Duration
	PausedAt        time.Time
	PausedExpiresAt time.Time
	// User and Workdir are the defaults of execs.
	User    string
	Workdir string
	// Env is added to every exec's environment.
	Env map[string]string
	// NetworkPolicy is the sandbox's network policy; nil is none. The
	// Network method reports its counters and denials.
	NetworkPolicy *NetworkPolicy
	// Rollout is the rollout the sandbox is a member of, if any.
	Rollout string

	c *Client
}

// CreateOptions describe a new sandbox. Only Image is required; zero fields
// take the defaults of CONTRACT.md.
type CreateOptions struct {
	// Image is an image or environment, NAME[:TAG].
	Image string
	// Layers, instead of Image, is an explicit environment: layer digests
	// ("sha256:<hex>"), lowest first, each a registered layer, run with
	// LayerConfig.
	Layers      []string
	LayerConfig *LayerConfig
	Labels      map[string]string
	// Env is added to every exec's environment, on top of the image's.
	Env map[string]string
	// Memory limit in bytes (default 512 MiB); see ParseSize.
	Memory int64
	// CPUs cap in cores (default 1).
	CPUs float64
	// Pids limit (default 4096).
	Pids int64
	// Disk is the writable layer's size in bytes (default 10 GiB).
	Disk int64
	// Workdir and User are the defaults of execs (default the image's, else
	// / and root).
	Workdir string
	User    string
	// TTL ends the sandbox this long after creation (default 1h); IdleTTL
	// ends it after this long without use (default 15m).
	TTL     time.Duration
	IdleTTL time.Duration
	// PausedTTL bounds the time the sandbox may stay paused (default 24h);
	// past it the sandbox is deleted.
	PausedTTL time.Duration
	// IdleAction is what the idle TTL does when it runs out: IdleDelete
	// (the default) or IdlePause (the sandbox pauses, and the next request
	// resumes it).
	IdleAction string
	// Backend is the isolation backend (default "container").
	Backend string
	// IdempotencyKey makes retries of the same create return the same
	// sandbox (kept 24h per API key). In BatchCreate, item i is keyed
	// IdempotencyKey/i.
	IdempotencyKey string
	// Network is the sandbox's egress policy (NetworkFlag,
	// NetworkServices, or rules); nil is none, loopback only.
	Network *NetworkPolicy
}

// Create starts a sandbox and returns it once it runs. With
// Config.CreateRetries, a refusal that waiting can help is tried again (see
// there); the error is then the server's last.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Sandbox, error) {
	req, err := createRequest(opts)
	if err != nil {
		return nil, err
	}
	var resp *connect.Response[sandboxv1.CreateResponse]
	err = c.retry(ctx, "create", opts.IdempotencyKey != "", func() error {
		var err error
		resp, err = c.sandboxes.Create(ctx, connect.NewRequest(req))
		return c.err(err)
	})
	if err != nil {
		return nil, err
	}
	return c.sandboxFromProto(resp.Msg.GetSandbox()), nil
}

// createRequest is opts on the wire.
func createRequest(opts CreateOptions) (*sandboxv1.CreateRequest, error) {
	if opts.Image == "" && len(opts.Layers) == 0 {
		return nil, newError(ErrInvalidArgument, "create: no image given (example: debian:12)")
	}
	return &sandboxv1.CreateRequest{
		Layers:      opts.Layers,
		LayerConfig: opts.LayerConfig.proto(),
		Image:       opts.Image,
		Labels:      opts.Labels,
		Resources: &sandboxv1.Resources{
			MemoryBytes: opts.Memory,
			Cpus:        opts.CPUs,
			Pids:        opts.Pids,
			DiskBytes:   opts.Disk,
		},
		Env:            opts.Env,
		Workdir:        opts.Workdir,
		User:           opts.User,
		Ttl:            optDuration(opts.TTL),
		IdleTtl:        optDuration(opts.IdleTTL),
		PausedTtl:      optDuration(opts.PausedTTL),
		IdleAction:     opts.IdleAction,
		Backend:        opts.Backend,
		IdempotencyKey: opts.IdempotencyKey,
		Network:        opts.Network.Proto(),
	}, nil
}

// Get returns the sandbox with the given ID.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	if id == "" {
		return nil, newError(ErrInvalidArgument, "get: empty sandbox ID")
	}
	resp, err := c.sandboxes.Get(ctx, connect.NewRequest(&sandboxv1.GetRequest{Id: id}))
	if err != nil {
		return nil, c.err(err)
	}
	return c.sandboxFromProto(resp.Msg.GetSandbox()), nil
}

// Sandbox returns a handle to the sandbox with the given ID without asking
// the server, for example to exec in a sandbox created by an earlier
// process. Its other fields are empty until Refresh.
func (c *Client) Sandbox(id string) *Sandbox {
	return &Sandbox{ID: id, c: c}
}

// List returns the sandboxes whose labels match every k=v of selector; an
// empty selector lists every sandbox the key may see.
func (c *Client) List(ctx context.Context, selector map[string]string) ([]*Sandbox, error) {
	resp, err := c.sandboxes.List(ctx, connect.NewRequest(&sandboxv1.ListRequest{Selector: selector}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]*Sandbox, 0, len(resp.Msg.GetSandboxes()))
	for _, s := range resp.Msg.GetSandboxes() {
		out = append(out, c.sandboxFromProto(s))
	}
	return out, nil
}

// Delete stops and removes a sandbox. Deleting one that is already gone is
// ErrNotFound.
func (c *Client) Delete(ctx context.Context, id string) error {
	if id == "" {
		return newError(ErrInvalidArgument, "delete: empty sandbox ID")
	}
	_, err := c.sandboxes.Delete(ctx, connect.NewRequest(&sandboxv1.DeleteRequest{Id: id}))
	return c.err(err)
}

// DeleteSelector stops and removes every sandbox whose labels match every
// k=v of selector and returns their IDs. The selector must not be empty.
func (c *Client) DeleteSelector(ctx context.Context, selector map[string]string) ([]string, error) {
	if len(selector) == 0 {
		return nil, newError(ErrInvalidArgument, "delete: empty label selector; give at least one label (example: job=run-42), or delete sandboxes by ID")
	}
	resp, err := c.sandboxes.Delete(ctx, connect.NewRequest(&sandboxv1.DeleteRequest{Selector: selector}))
	if err != nil {
		return nil, c.err(err)
	}
	return resp.Msg.GetDeleted(), nil
}

// Delete stops and removes the sandbox; its State becomes StateDeleted.
func (s *Sandbox) Delete(ctx context.Context) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := s.c.Delete(ctx, s.ID); err != nil {
		return err
	}
	s.State = StateDeleted
	return nil
}

// Refresh rereads the sandbox from the server into s.
func (s *Sandbox) Refresh(ctx context.Context) error {
	if err := s.check(); err != nil {
		return err
	}
	fresh, err := s.c.Get(ctx, s.ID)
	if err != nil {
		return err
	}
	*s = *fresh
	return nil
}

// check reports whether s can call the server.
func (s *Sandbox) check() error {
	if s == nil || s.c == nil {
		return newError(ErrInvalidArgument, "this Sandbox has no client: get it from Client.Create, Get, List or Sandbox")
	}
	if s.ID == "" {
		return newError(ErrInvalidArgument, "this Sandbox has no ID")
	}
	return nil
}

func (c *Client) sandboxFromProto(p *sandboxv1.Sandbox) *Sandbox {
	s := &Sandbox{
		ID:      p.GetId(),
		Image:   p.GetImage(),
		Labels:  maps.Clone(p.GetLabels()),
		State:   stateName(p.GetState()),
		Reason:  p.GetReason(),
		Node:    p.GetNode(),
		Backend: p.GetBackend(),
		Project: p.GetProject(),
		User:    p.GetUser(),
		Workdir: p.GetWorkdir(),
		Env:     maps.Clone(p.GetEnv()),
		Resources: Resources{
			Memory: p.GetResources().GetMemoryBytes(),
			CPUs:   p.GetResources().GetCpus(),
			Pids:   p.GetResources().GetPids(),
			Disk:   p.GetResources().GetDiskBytes(),
		},
		CreatedAt:       timeOf(p.GetCreatedAt()),
		ExpiresAt:       timeOf(p.GetExpiresAt()),
		IdleExpiresAt:   timeOf(p.GetIdleExpiresAt()),
		NetworkPolicy:   networkPolicyOf(p.GetNetwork()),
		IdleAction:      p.GetIdleAction(),
		PausedAt:        timeOf(p.GetPausedAt()),
		PausedExpiresAt: timeOf(p.GetPausedExpiresAt()),
		Rollout:         p.GetRollout(),
		c:               c,
	}
	if p.GetIdleTtl() != nil {
		s.IdleTTL = p.GetIdleTtl().AsDuration()
	}
	if p.GetPausedTtl() != nil {
		s.PausedTTL = p.GetPausedTtl().AsDuration()
	}
	return s
}

func stateName(st sandboxv1.State) string {
	if n, ok := stateNames[st]; ok {
		return n
	}
	return StateUnknown
}

// optDuration returns d on the wire, or nil for zero (the server's default).
func optDuration(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// timeOf returns t as a time, the zero time when unset.
func timeOf(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}
