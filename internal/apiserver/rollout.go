package apiserver

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	rolloutv1 "github.com/dsecproject/dsec/api/dsec/rollout/v1"
	"github.com/dsecproject/dsec/api/dsec/rollout/v1/rolloutv1connect"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/edgeclient"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/placement"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// The rollout service (docs/rollouts.md). A rollout lives on one node,
// which its ID names, with all its members: the API server checks a
// create as it checks each member's sandbox (the project's maximum TTL,
// who may run the image, its limits), places the members together on one
// node, and forwards every other call to the node the ID names; List asks
// every node. The node keeps the rollout and is its authority.

type rolloutProxy struct{ s *Server }

var _ rolloutv1connect.RolloutServiceHandler = (*rolloutProxy)(nil)

// maxRolloutMembers is the edge's bound, checked here before placement.
const maxRolloutMembers = 16

// edgeForRollout returns the connection to the node that owns a rollout.
func (s *Server) edgeForRollout(ctx context.Context, id string) (*edgeclient.Conn, error) {
	node, ok := sandbox.NodeOfRolloutID(id)
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%.80q is not a rollout ID (list rollouts with `dsec rollout ls`)", id)
	}
	n, err := s.node(ctx, node)
	if err != nil {
		return nil, err
	}
	return s.cfg.Pool.Get(n.Name, n.Addr)
}

// ownRollout refuses a rollout member's own key any rollout but its own.
func ownRollout(ctx context.Context, id string) error {
	if k := keyFrom(ctx); k.Rollout != "" && k.Rollout != id {
		return errdefs.Newf(errdefs.ErrNotFound, "rollout %.80s not found: it was deleted or never existed (list rollouts with `dsec rollout ls`)", id)
	}
	return nil
}

// rolloutUnary forwards a call about rollout id to its node.
func rolloutUnary[Req, Resp any](ctx context.Context, s *Server, id string, msg *Req,
	call func(rolloutv1connect.RolloutServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
) (*connect.Response[Resp], error) {
	if err := ownRollout(ctx, id); err != nil {
		return nil, err
	}
	conn, err := s.edgeForRollout(ctx, id)
	if err != nil {
		return nil, err
	}
	resp, err := call(conn.Rollout, ctx, forward(ctx, msg))
	if err != nil {
		return nil, edgeErr(conn.Name, err)
	}
	return connect.NewResponse(resp.Msg), nil
}

func (p *rolloutProxy) Get(ctx context.Context, req *connect.Request[rolloutv1.GetRequest]) (*connect.Response[rolloutv1.GetResponse], error) {
	return rolloutUnary(ctx, p.s, req.Msg.GetId(), req.Msg, rolloutv1connect.RolloutServiceClient.Get)
}

func (p *rolloutProxy) SetStatus(ctx context.Context, req *connect.Request[rolloutv1.SetStatusRequest]) (*connect.Response[rolloutv1.SetStatusResponse], error) {
	return rolloutUnary(ctx, p.s, req.Msg.GetId(), req.Msg, rolloutv1connect.RolloutServiceClient.SetStatus)
}

func (p *rolloutProxy) Delete(ctx context.Context, req *connect.Request[rolloutv1.DeleteRequest]) (*connect.Response[rolloutv1.DeleteResponse], error) {
	defer p.s.usage.touched()
	return rolloutUnary(ctx, p.s, req.Msg.GetId(), req.Msg, rolloutv1connect.RolloutServiceClient.Delete)
}

func (p *rolloutProxy) List(ctx context.Context, req *connect.Request[rolloutv1.ListRequest]) (*connect.Response[rolloutv1.ListResponse], error) {
	var mu sync.Mutex
	out := &rolloutv1.ListResponse{}
	err := p.s.fanOut(ctx, func(ctx context.Context, _ string, c *edgeclient.Conn) error {
		resp, err := c.Rollout.List(ctx, forward(ctx, req.Msg))
		if err != nil {
			return err
		}
		mu.Lock()
		out.Rollouts = append(out.Rollouts, resp.Msg.GetRollouts()...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out.Rollouts, func(i, j int) bool { return out.Rollouts[i].GetId() < out.Rollouts[j].GetId() })
	return connect.NewResponse(out), nil
}

// Create admits every member as a create of its own (checkCreate, the
// project's limits), then places them together: on the least loaded node
// that has room for all of them (one with an idempotency key pinned by
// it, so a retry reaches the node that remembers it), trying the next on
// a refusal.
func (p *rolloutProxy) Create(ctx context.Context, req *connect.Request[rolloutv1.CreateRequest]) (*connect.Response[rolloutv1.CreateResponse], error) {
	s := p.s
	msg := req.Msg
	spec := msg.GetSpec()
	if spec == nil || len(spec.GetMembers()) == 0 || len(spec.GetMembers()) > maxRolloutMembers {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "a rollout has 1 to %d members: give them in its spec (example in docs/rollouts.md)", maxRolloutMembers)
	}
	msg = proto.Clone(msg).(*rolloutv1.CreateRequest)
	spec = msg.GetSpec()
	backend := ""
	var need placement.Request
	mems := make([]int64, len(spec.GetMembers()))
	for i, m := range spec.GetMembers() {
		sb := m.GetSandbox()
		if sb == nil {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "rollout member %.40q has no sandbox: give its image", m.GetName())
		}
		// Checked as its own create, with the rollout's TTLs.
		probe := proto.Clone(sb).(*sandboxv1.CreateRequest)
		probe.Ttl, probe.IdleTtl = spec.GetTtl(), spec.GetIdleTtl()
		if _, err := s.checkCreate(ctx, probe); err != nil {
			return nil, fmt.Errorf("rollout member %s: %w", m.GetName(), err)
		}
		// The members' TTLs are the rollout's: a default above the
		// project's maximum is brought down to it, as for a sandbox.
		if spec.Ttl == nil && probe.Ttl != nil {
			spec.Ttl = probe.Ttl
		}
		if spec.IdleTtl == nil && probe.IdleTtl != nil {
			spec.IdleTtl = probe.IdleTtl
		}
		b := sb.GetBackend()
		if b == "" {
			b = s.cfg.DefaultBackend
		}
		if backend == "" {
			backend = b
		} else if b != backend {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "rollout members ask for backends %s and %s: members of a rollout run on one backend", backend, b)
		}
		mem := sb.GetResources().GetMemoryBytes()
		if mem <= 0 {
			mem = s.cfg.DefaultMemory
		}
		mems[i] = mem
		need.MemoryBytes += mem
		need.Pids = max(need.Pids, sb.GetResources().GetPids())
		need.DiskBytes += sb.GetResources().GetDiskBytes()
	}
	need.Backend = backend
	proj, err := s.cfg.Cluster.GetProject(ctx, keyFrom(ctx).Project)
	if err != nil {
		return nil, err
	}
	var dones []func(string, bool)
	finish := func(node string, ok bool) {
		for _, d := range dones {
			d(node, ok)
		}
	}
	for _, mem := range mems {
		done, err := s.reserve(ctx, proj, mem)
		if err != nil {
			finish("", false)
			return nil, err
		}
		dones = append(dones, done)
	}
	resp, node, err := s.placeRollout(ctx, msg, need)
	finish(node, err == nil)
	if err != nil {
		return nil, err
	}
	for i, m := range resp.GetRollout().GetMembers() {
		if i < len(mems) {
			s.cfg.Placer.Placed(node, m.GetSandboxId(), mems[i])
		}
	}
	s.usage.touched()
	return connect.NewResponse(resp), nil
}

// placeRollout sends a rollout's create to the node placement picks for
// all its members together (need), as place does for one sandbox.
func (s *Server) placeRollout(ctx context.Context, msg *rolloutv1.CreateRequest, need placement.Request) (*rolloutv1.CreateResponse, string, error) {
	nodes := s.cfg.Watcher.Placement()
	var order []string
	if key := msg.GetIdempotencyKey(); key != "" {
		order = placement.Pinned(nodes, need.Backend, keyFrom(ctx).ID+"/rollout/"+key)
	} else {
		order = s.cfg.Placer.Order(nodes, need)
		if len(order) == 0 && s.usage.refresh(ctx, s.cfg.Watcher, oldestReport(nodes)) {
			nodes = s.cfg.Watcher.Placement()
			order = s.cfg.Placer.Order(nodes, need)
		}
	}
	if len(order) == 0 {
		return nil, "", s.noRoom(nodes, need)
	}
	var lastErr error
	for i, name := range order {
		if i == 3 {
			break
		}
		st, ok := s.cfg.Watcher.Node(name)
		if !ok {
			continue
		}
		conn, err := s.cfg.Pool.Get(name, st.Node.Addr)
		if err != nil {
			lastErr = err
			continue
		}
		resp, err := conn.Rollout.Create(ctx, forward(ctx, msg))
		if err == nil {
			return resp.Msg, name, nil
		}
		lastErr = edgeErr(name, err)
		if !errdefs.Is(lastErr, errdefs.ErrResourceExhausted) && !errdefs.Is(lastErr, errdefs.ErrUnavailable) {
			return nil, "", lastErr
		}
	}
	return nil, "", lastErr
}
