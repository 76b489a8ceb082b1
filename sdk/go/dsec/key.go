package dsec

import (
	"context"
	"time"

	"connectrpc.com/connect"

	adminv1 "github.com/dsecproject/dsec/api/dsec/admin/v1"
)

// Key describes an API key (never its secret).
type Key struct {
	// ID is the key's public identifier (its secret's prefix).
	ID   string
	Name string
	// Project is the project whose sandboxes the key sees.
	Project string
	// Admin keys may create keys.
	Admin     bool
	CreatedAt time.Time
}

// KeyOptions describe a new API key.
type KeyOptions struct {
	Name string
	// Project defaults to "default".
	Project string
	Admin   bool
}

// CreateKey makes a new API key and returns its secret, which the server
// shows only this once, and its description. Only admin keys may call it.
func (c *Client) CreateKey(ctx context.Context, opts KeyOptions) (secret string, key Key, err error) {
	resp, err := c.admin.CreateKey(ctx, connect.NewRequest(&adminv1.CreateKeyRequest{
		Name:    opts.Name,
		Project: opts.Project,
		Admin:   opts.Admin,
	}))
	if err != nil {
		return "", Key{}, c.err(err)
	}
	return resp.Msg.GetSecret(), keyFromProto(resp.Msg.GetKey()), nil
}

// WhoAmI describes the key the client calls with.
func (c *Client) WhoAmI(ctx context.Context) (Key, error) {
	resp, err := c.admin.WhoAmI(ctx, connect.NewRequest(&adminv1.WhoAmIRequest{}))
	if err != nil {
		return Key{}, c.err(err)
	}
	return keyFromProto(resp.Msg.GetKey()), nil
}

func keyFromProto(k *adminv1.Key) Key {
	return Key{
		ID:        k.GetId(),
		Name:      k.GetName(),
		Project:   k.GetProject(),
		Admin:     k.GetAdmin(),
		CreatedAt: timeOf(k.GetCreatedAt()),
	}
}
