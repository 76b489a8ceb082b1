package dsec

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	adminv1 "github.com/dsecproject/dsec/api/dsec/admin/v1"
)

// Key describes an API key (never its secret).
type Key struct {
	// ID is the key's public identifier (its secret's prefix).
	ID   string
	Name string
	// Project is the project whose sandboxes the key sees.
	Project string
	// Admin keys may create, list and revoke keys.
	Admin     bool
	CreatedAt time.Time
	// ExpiresAt is when the key stops working; zero: never.
	ExpiresAt time.Time
}

// KeyOptions describe a new API key.
type KeyOptions struct {
	Name string
	// Project defaults to "default".
	Project string
	Admin   bool
	// ExpiresIn is how long the key works; 0: forever. An expired key is
	// refused with ErrUnauthenticated saying it expired.
	ExpiresIn time.Duration
}

// CreateKey makes a new API key and returns its secret, which the server
// shows only this once, and its description. Only admin keys may call it.
func (c *Client) CreateKey(ctx context.Context, opts KeyOptions) (secret string, key Key, err error) {
	req := &adminv1.CreateKeyRequest{
		Name:    opts.Name,
		Project: opts.Project,
		Admin:   opts.Admin,
	}
	if opts.ExpiresIn != 0 {
		req.ExpiresIn = durationpb.New(opts.ExpiresIn)
	}
	resp, err := c.admin().CreateKey(ctx, connect.NewRequest(req))
	if err != nil {
		return "", Key{}, c.err(err)
	}
	return resp.Msg.GetSecret(), keyFromProto(resp.Msg.GetKey()), nil
}

// WhoAmI describes the key the client calls with.
func (c *Client) WhoAmI(ctx context.Context) (Key, error) {
	resp, err := c.admin().WhoAmI(ctx, connect.NewRequest(&adminv1.WhoAmIRequest{}))
	if err != nil {
		return Key{}, c.err(err)
	}
	return keyFromProto(resp.Msg.GetKey()), nil
}

// ListKeys describes every API key, by ID (never a secret). Only admin
// keys may call it.
func (c *Client) ListKeys(ctx context.Context) ([]Key, error) {
	resp, err := c.admin().ListKeys(ctx, connect.NewRequest(&adminv1.ListKeysRequest{}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]Key, 0, len(resp.Msg.GetKeys()))
	for _, k := range resp.Msg.GetKeys() {
		out = append(out, keyFromProto(k))
	}
	return out, nil
}

// RevokeKey deletes the API key with the ID id and returns it as it was.
// Every server refuses it within a second. Only admin keys may call it.
func (c *Client) RevokeKey(ctx context.Context, id string) (Key, error) {
	resp, err := c.admin().RevokeKey(ctx, connect.NewRequest(&adminv1.RevokeKeyRequest{Id: id}))
	if err != nil {
		return Key{}, c.err(err)
	}
	return keyFromProto(resp.Msg.GetKey()), nil
}

func keyFromProto(k *adminv1.Key) Key {
	out := Key{
		ID:        k.GetId(),
		Name:      k.GetName(),
		Project:   k.GetProject(),
		Admin:     k.GetAdmin(),
		CreatedAt: timeOf(k.GetCreatedAt()),
	}
	if k.ExpiresAt != nil {
		out.ExpiresAt = timeOf(k.GetExpiresAt())
	}
	return out
}

// ProjectLimits bound what a project's sandboxes hold at once, on all
// nodes together.
type ProjectLimits struct {
	// MemoryBytes bounds the sum of their memory limits; 0: no limit.
	MemoryBytes int64
	// Sandboxes bounds how many live at once; 0: no limit.
	Sandboxes int64
	// MaxTTL is the longest hard or idle TTL a create or SetTimeout may
	// ask for (7 days unless set); above it is ErrInvalidArgument.
	MaxTTL time.Duration
}

// Project is a project's limits and what its sandboxes hold (as the
// nodes last reported, every 2 s).
type Project struct {
	Name   string
	Limits ProjectLimits
	// MemoryBytes and Sandboxes are its live sandboxes' memory limits and
	// count.
	MemoryBytes int64
	Sandboxes   int64
	// Keys counts its API keys (filled in for admin keys only).
	Keys int64
}

// LimitsUpdate changes some of a project's limits; nil fields keep theirs.
// A memory or sandbox limit of 0 removes it.
type LimitsUpdate struct {
	MemoryBytes *int64
	Sandboxes   *int64
	MaxTTL      *time.Duration
}

// GetProject returns the project called name ("" for the key's own). A
// non-admin key may ask only for its own.
func (c *Client) GetProject(ctx context.Context, name string) (*Project, error) {
	resp, err := c.admin().GetProject(ctx, connect.NewRequest(&adminv1.GetProjectRequest{Name: name}))
	if err != nil {
		return nil, c.err(err)
	}
	return projectFromProto(resp.Msg.GetProject()), nil
}

// SetProjectLimits changes the limits of the project called name and
// returns it. Only admin keys may call it. Creates beyond a project's
// memory or sandbox limit are ErrResourceExhausted.
func (c *Client) SetProjectLimits(ctx context.Context, name string, u LimitsUpdate) (*Project, error) {
	req := &adminv1.SetProjectLimitsRequest{Name: name, MemoryBytes: u.MemoryBytes, Sandboxes: u.Sandboxes}
	if u.MaxTTL != nil {
		req.MaxTtl = durationpb.New(*u.MaxTTL)
	}
	resp, err := c.admin().SetProjectLimits(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, c.err(err)
	}
	return projectFromProto(resp.Msg.GetProject()), nil
}

// ListProjects returns the projects that have keys or limits, by name.
// Only admin keys may call it.
func (c *Client) ListProjects(ctx context.Context) ([]*Project, error) {
	resp, err := c.admin().ListProjects(ctx, connect.NewRequest(&adminv1.ListProjectsRequest{}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]*Project, 0, len(resp.Msg.GetProjects()))
	for _, p := range resp.Msg.GetProjects() {
		out = append(out, projectFromProto(p))
	}
	return out, nil
}

func projectFromProto(p *adminv1.Project) *Project {
	l := p.GetLimits()
	return &Project{
		Name: p.GetName(),
		Limits: ProjectLimits{
			MemoryBytes: l.GetMemoryBytes(), Sandboxes: l.GetSandboxes(), MaxTTL: l.GetMaxTtl().AsDuration(),
		},
		MemoryBytes: p.GetUsage().GetMemoryBytes(),
		Sandboxes:   p.GetUsage().GetSandboxes(),
		Keys:        p.GetKeys(),
	}
}
