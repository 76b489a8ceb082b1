package edge

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	rolloutv1 "github.com/dsecproject/dsec/api/dsec/rollout/v1"
	"github.com/dsecproject/dsec/api/dsec/rollout/v1/rolloutv1connect"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// rolloutAPI serves the rollout service on the node: the control plane
// forwards each call to the node a rollout ID names (and a create to the
// node placement picks).
type rolloutAPI struct{ e *Edge }

var _ rolloutv1connect.RolloutServiceHandler = (*rolloutAPI)(nil)

func (a *rolloutAPI) Create(ctx context.Context, req *connect.Request[rolloutv1.CreateRequest]) (*connect.Response[rolloutv1.CreateResponse], error) {
	c := callerOf(req.Header())
	ro, err := a.e.CreateRollout(ctx, c, req.Msg.GetSpec(), req.Msg.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	var members []*Record
	if ro.State != RolloutDeleting {
		members = a.e.rolloutMembers(ctx, ro, false)
	} else {
		members = make([]*Record, len(ro.Members))
	}
	return connect.NewResponse(&rolloutv1.CreateResponse{Rollout: a.e.rolloutProto(ro, members)}), nil
}

func (a *rolloutAPI) Get(ctx context.Context, req *connect.Request[rolloutv1.GetRequest]) (*connect.Response[rolloutv1.GetResponse], error) {
	ro, members, err := a.e.GetRollout(ctx, callerOf(req.Header()), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&rolloutv1.GetResponse{Rollout: a.e.rolloutProto(ro, members)}), nil
}

func (a *rolloutAPI) List(ctx context.Context, req *connect.Request[rolloutv1.ListRequest]) (*connect.Response[rolloutv1.ListResponse], error) {
	ros, members, err := a.e.ListRollouts(ctx, callerOf(req.Header()), req.Msg.GetSelector())
	if err != nil {
		return nil, err
	}
	out := &rolloutv1.ListResponse{Rollouts: make([]*rolloutv1.Rollout, len(ros))}
	for i, ro := range ros {
		out.Rollouts[i] = a.e.rolloutProto(ro, members[i])
	}
	return connect.NewResponse(out), nil
}

func (a *rolloutAPI) Delete(ctx context.Context, req *connect.Request[rolloutv1.DeleteRequest]) (*connect.Response[rolloutv1.DeleteResponse], error) {
	if _, err := a.e.DeleteRollout(ctx, callerOf(req.Header()), req.Msg.GetId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&rolloutv1.DeleteResponse{}), nil
}

func (a *rolloutAPI) SetStatus(ctx context.Context, req *connect.Request[rolloutv1.SetStatusRequest]) (*connect.Response[rolloutv1.SetStatusResponse], error) {
	m := req.Msg
	ro, members, err := a.e.SetRolloutStatus(ctx, callerOf(req.Header()), m.GetId(), m.GetSet(), m.GetRemove())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&rolloutv1.SetStatusResponse{Rollout: a.e.rolloutProto(ro, members)}), nil
}

// rolloutProto is a rollout as the API shows it; members[i] is member
// i's record, nil when it is gone. It expires when its first member does.
func (e *Edge) rolloutProto(ro *RolloutRecord, members []*Record) *rolloutv1.Rollout {
	out := &rolloutv1.Rollout{
		Id: ro.ID, Project: ro.Project, Labels: ro.Labels, Status: ro.Status,
		CreatedAt: timestamppb.New(ro.CreatedAt), Node: e.cfg.Node,
	}
	var expires *timestamppb.Timestamp
	for i, m := range ro.Members {
		ms := &rolloutv1.MemberStatus{Name: m.Name, Role: m.Role, SandboxId: m.SandboxID, State: sandboxv1.State_STATE_DELETED}
		if i < len(members) && members[i] != nil {
			r := members[i]
			ms.State = stateProto[r.State]
			if expires == nil || r.ExpiresAt.Before(expires.AsTime()) {
				expires = timestamppb.New(r.ExpiresAt)
			}
		}
		out.Members = append(out.Members, ms)
	}
	if expires == nil {
		expires = timestamppb.New(ro.CreatedAt.Add(ro.TTL))
	}
	out.ExpiresAt = expires
	return out
}
