package dsec

import (
	"context"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// LayerConfig is how a sandbox created from an explicit list of layers
// runs by default, as an image's config says for an image.
type LayerConfig struct {
	// Env holds KEY=VALUE entries.
	Env []string
	// Workdir is an absolute path (default /).
	Workdir string
	// User is a name, uid or uid:gid (default root).
	User string
}

func (c *LayerConfig) proto() *sandboxv1.LayerConfig {
	if c == nil {
		return nil
	}
	return &sandboxv1.LayerConfig{Env: c.Env, Workdir: c.Workdir, User: c.User}
}

// Pack is the environment PackDiff registered.
type Pack struct {
	// Image is the new environment, NAME:TAG.
	Image string
	// LayerDigest and LayerSize describe the new layer.
	LayerDigest string
	LayerSize   int64
	// Layers are every layer of Image, lowest first (the new one last).
	Layers []string
	// Files counts the names in the new layer.
	Files int64
	// Frozen is how long the sandbox was frozen; Duration the whole call.
	Frozen   time.Duration
	Duration time.Duration
}

// PackDiff turns the sandbox's writable layer into a new layer and
// registers name (NAME[:TAG]) as the sandbox's environment plus that
// layer, so that many sandboxes can start from the sandbox's state
// (branching). Files deleted in the sandbox stay deleted, replaced
// directories stay replaced, owners and modes are kept. The scrub paths
// (absolute) are left out: the new environment shows them as the
// sandbox's environment had them. The sandbox is frozen while its writable
// layer is read and runs on afterwards.
//
// A second PackDiff of the same sandbox while one runs, or of a sandbox
// being deleted, is ErrFailedPrecondition; a deleted sandbox is
// ErrNotFound.
func (s *Sandbox) PackDiff(ctx context.Context, name string, scrub ...string) (*Pack, error) {
	return s.PackDiffWith(ctx, name, scrub)
}

// PackDiffWith is PackDiff with options for writing the new environment:
// onto an existing NAME:TAG with other layers only WithForce, and only by
// its project (ErrPermissionDenied otherwise); WithPublic sets its
// visibility.
func (s *Sandbox) PackDiffWith(ctx context.Context, name string, scrub []string, opts ...ImageOption) (*Pack, error) {
	if name == "" {
		return nil, newError(ErrInvalidArgument, "pack: no name given for the new environment (example: myenv:1)")
	}
	w := imageWriteOf(opts)
	resp, err := s.c.sandboxes.PackDiff(ctx, connect.NewRequest(&sandboxv1.PackDiffRequest{
		SandboxId: s.ID, Name: name, Scrub: scrub, Force: w.force, Public: w.public,
	}))
	if err != nil {
		return nil, s.c.err(err)
	}
	m := resp.Msg
	return &Pack{
		Image: m.GetImage(), LayerDigest: m.GetLayerDigest(), LayerSize: m.GetLayerSize(),
		Layers: m.GetLayers(), Files: m.GetFiles(),
		Frozen: m.GetFrozen().AsDuration(), Duration: m.GetDuration().AsDuration(),
	}, nil
}
