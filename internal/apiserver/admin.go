package apiserver

// The admin API's keys and projects, and image visibility.

import (
	"context"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	adminv1 "github.com/dsecproject/dsec/api/dsec/admin/v1"
	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
)

func requireAdmin(ctx context.Context, what string) error {
	if !keyFrom(ctx).Admin {
		return errdefs.Newf(errdefs.ErrPermissionDenied, "only admin keys can %s: ask an administrator, or use <state-dir>/admin.key on the server", what)
	}
	return nil
}

func (a *adminAPI) ListKeys(ctx context.Context, _ *connect.Request[adminv1.ListKeysRequest]) (*connect.Response[adminv1.ListKeysResponse], error) {
	if err := requireAdmin(ctx, "list keys"); err != nil {
		return nil, err
	}
	keys, err := a.s.cfg.Cluster.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	out := &adminv1.ListKeysResponse{}
	for _, k := range keys {
		out.Keys = append(out.Keys, keyProto(k))
	}
	return connect.NewResponse(out), nil
}

func (a *adminAPI) RevokeKey(ctx context.Context, req *connect.Request[adminv1.RevokeKeyRequest]) (*connect.Response[adminv1.RevokeKeyResponse], error) {
	if err := requireAdmin(ctx, "revoke keys"); err != nil {
		return nil, err
	}
	k, err := a.s.cfg.Cluster.RevokeKey(ctx, req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	a.s.log.Info("API key revoked", "key", k.ID, "name", k.Name, "project", k.Project, "by", keyFrom(ctx).ID)
	return connect.NewResponse(&adminv1.RevokeKeyResponse{Key: keyProto(k)}), nil
}

func (a *adminAPI) projectProto(p cluster.Project, keys int64) *adminv1.Project {
	u := a.s.usage.used(p.Name, a.s.cfg.Watcher.Nodes(), time.Now())
	return &adminv1.Project{
		Name: p.Name,
		Limits: &adminv1.ProjectLimits{
			MemoryBytes: p.Limits.MemoryBytes, Sandboxes: p.Limits.Sandboxes, MaxTtl: durationpb.New(p.Limits.MaxTTL),
		},
		Usage: &adminv1.ProjectUsage{MemoryBytes: u.memory, Sandboxes: u.sandboxes},
		Keys:  keys,
	}
}

// keysByProject counts the keys of each project; nil for a non-admin key
// (which may not list keys).
func (a *adminAPI) keysByProject(ctx context.Context) (map[string]int64, error) {
	if !keyFrom(ctx).Admin {
		return nil, nil
	}
	keys, err := a.s.cfg.Cluster.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	n := map[string]int64{}
	for _, k := range keys {
		n[k.Project]++
	}
	return n, nil
}

func (a *adminAPI) GetProject(ctx context.Context, req *connect.Request[adminv1.GetProjectRequest]) (*connect.Response[adminv1.GetProjectResponse], error) {
	k := keyFrom(ctx)
	name := req.Msg.GetName()
	if name == "" {
		name = k.Project
	}
	if !k.Admin && name != k.Project {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "a key of project %s sees only its own project's limits: ask an administrator", k.Project)
	}
	p, err := a.s.cfg.Cluster.GetProject(ctx, name)
	if err != nil {
		return nil, err
	}
	keys, err := a.keysByProject(ctx)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&adminv1.GetProjectResponse{Project: a.projectProto(p, keys[name])}), nil
}

func (a *adminAPI) SetProjectLimits(ctx context.Context, req *connect.Request[adminv1.SetProjectLimitsRequest]) (*connect.Response[adminv1.SetProjectLimitsResponse], error) {
	if err := requireAdmin(ctx, "set project limits"); err != nil {
		return nil, err
	}
	m := req.Msg
	u := cluster.LimitsUpdate{MemoryBytes: m.MemoryBytes, Sandboxes: m.Sandboxes}
	if m.MaxTtl != nil {
		d := m.GetMaxTtl().AsDuration()
		u.MaxTTL = &d
	}
	p, err := a.s.cfg.Cluster.SetProjectLimits(ctx, m.GetName(), u)
	if err != nil {
		return nil, err
	}
	a.s.log.Info("project limits set", "project", p.Name, "memory_bytes", p.Limits.MemoryBytes,
		"sandboxes", p.Limits.Sandboxes, "max_ttl", p.Limits.MaxTTL, "by", keyFrom(ctx).ID)
	keys, err := a.keysByProject(ctx)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&adminv1.SetProjectLimitsResponse{Project: a.projectProto(p, keys[p.Name])}), nil
}

func (a *adminAPI) ListProjects(ctx context.Context, _ *connect.Request[adminv1.ListProjectsRequest]) (*connect.Response[adminv1.ListProjectsResponse], error) {
	if err := requireAdmin(ctx, "list projects"); err != nil {
		return nil, err
	}
	set, err := a.s.cfg.Cluster.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := a.keysByProject(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string]cluster.Project{}
	for _, p := range set {
		byName[p.Name] = p
	}
	for name := range keys {
		if _, ok := byName[name]; !ok {
			if byName[name], err = a.s.cfg.Cluster.GetProject(ctx, name); err != nil {
				return nil, err
			}
		}
	}
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	slices.Sort(names)
	out := &adminv1.ListProjectsResponse{}
	for _, name := range names {
		out.Projects = append(out.Projects, a.projectProto(byName[name], keys[name]))
	}
	return connect.NewResponse(out), nil
}

func (a *imageAPI) SetImagePublic(ctx context.Context, req *connect.Request[imagev1.SetImagePublicRequest]) (*connect.Response[imagev1.SetImagePublicResponse], error) {
	ref, err := cluster.ParseRef(req.Msg.GetName())
	if err != nil {
		return nil, err
	}
	img, err := a.s.cfg.Cluster.SetImagePublic(ctx, ref, req.Msg.GetPublic(), keyFrom(ctx).Principal())
	if err != nil {
		return nil, err
	}
	pi, err := a.imageProto(ctx, img)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&imagev1.SetImagePublicResponse{Image: pi}), nil
}

// deletedProto describes a deleted image, with its layers' sizes where
// they are still recorded.
func (a *imageAPI) deletedProto(ctx context.Context, img cluster.Image) *imagev1.Image {
	if pi, err := a.imageProto(ctx, img); err == nil {
		return pi
	}
	pi, _ := a.imageProto(ctx, cluster.Image{Name: img.Name, Tag: img.Tag, CreatedAt: img.CreatedAt, Project: img.Project, Public: img.Public, Config: img.Config})
	for _, d := range img.Layers {
		pi.Layers = append(pi.Layers, &imagev1.Layer{Digest: d})
	}
	return pi
}

// visibleState keeps of st what the caller may see: every image for an
// admin key; otherwise the images it may run, and the layers those name or
// its own sandboxes use.
func visibleState(ctx context.Context, st cluster.LayerState, use map[string][]sandboxRef) cluster.LayerState {
	k := keyFrom(ctx)
	if k.Admin {
		return st
	}
	out := cluster.LayerState{Revision: st.Revision}
	named := map[string]bool{}
	for _, img := range st.Images {
		if img.RunnableBy(k.Principal()) {
			out.Images = append(out.Images, img)
			for _, d := range img.Layers {
				named[d] = true
			}
		}
	}
	for _, l := range st.Layers {
		if named[l.Digest] || slices.ContainsFunc(use[l.Digest], func(r sandboxRef) bool { return r.project == k.Project }) {
			out.Layers = append(out.Layers, l)
		}
	}
	return out
}
