package edge

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/layer"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// ImageConfig is how a sandbox runs by default: an image's config, or the
// one given with an explicit list of layers.
type ImageConfig struct {
	Env        []string
	Workdir    string
	User       string
	Entrypoint []string
	Cmd        []string
}

// LayerResolver is the optional capability of an ImageResolver to resolve
// an explicit list of layer digests: each must be a registered layer.
type LayerResolver interface {
	ResolveLayers(ctx context.Context, digests []string, cfg ImageConfig) (Image, error)
}

// LayerStore is the optional capability of an ImageResolver to keep packed
// layers and register the environments made of them (pack_diff).
type LayerStore interface {
	// CheckImage validates NAME[:TAG] for an image of n layers before any
	// work is done, and returns it as NAME:TAG.
	CheckImage(name string, n int) (string, error)
	// StoreLayer stores the EROFS image read from r, size bytes whose
	// digest is digest, and records the layer.
	StoreLayer(ctx context.Context, digest string, size int64, r io.Reader) error
	// ImageConfig returns the config of the image ref; NotFound when it
	// is gone.
	ImageConfig(ctx context.Context, ref string) (ImageConfig, error)
	// PutImage registers ref (NAME:TAG) as layers, lowest first, with
	// cfg, as w says (PermissionDenied for an image of another project,
	// FailedPrecondition for other content without w.Force).
	PutImage(ctx context.Context, ref string, layers []string, cfg ImageConfig, w ImageWrite) error
}

// ImageWrite is who registers a packed environment and how.
type ImageWrite struct {
	By Caller
	// Force replaces an existing NAME:TAG with other layers or config.
	Force bool
	// Public sets its visibility; nil makes a new image private and
	// keeps an existing one's.
	Public *bool
}

// PackOptions are what PackDiff leaves out and how it registers the new
// environment.
type PackOptions struct {
	// Scrub are absolute paths left out of the new layer.
	Scrub  []string
	Force  bool
	Public *bool
}

// PackResult is what PackDiff made.
type PackResult struct {
	Image  string // NAME:TAG
	Layer  sandbox.PackedLayer
	Layers []string // every layer of Image, lowest first
	Frozen time.Duration
}

// resolve turns a create request's image, or explicit list of layers, into
// layers a backend can stack.
func (e *Edge) resolve(ctx context.Context, p CreateParams) (Image, error) {
	if p.resolved != nil {
		return *p.resolved, nil
	}
	if len(p.Layers) == 0 {
		return e.cfg.Images.Resolve(ctx, p.Image)
	}
	lr, ok := e.cfg.Images.(LayerResolver)
	if !ok {
		return Image{}, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"node %s cannot start a sandbox from a list of layers: name an image instead", e.cfg.Node)
	}
	var cfg ImageConfig
	if p.LayerConfig != nil {
		cfg = *p.LayerConfig
	}
	return lr.ResolveLayers(ctx, p.Layers, cfg)
}

// PackDiff turns sandbox id's writable layer into a new layer and
// registers name as the sandbox's layers plus it, with the config of the
// image the sandbox was made from (or, when that image is gone or the
// sandbox was made from a list of layers, the sandbox's own). The sandbox
// is frozen while its writable layer is read and runs on afterwards. On
// failure no image is registered; a layer stored before the failure is
// content-addressed and unreferenced, for image GC to collect.
func (e *Edge) PackDiff(ctx context.Context, caller Caller, id, name string, opts PackOptions) (*PackResult, error) {
	scrub := opts.Scrub
	r, err := e.store.get(id)
	if err != nil {
		return nil, err
	}
	switch {
	case !sees(caller, r):
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s not found: it was deleted or never existed (list sandboxes with `dsec ps`)", id)
	case !states[r.State].visible:
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is being deleted: pack a sandbox that runs, before deleting it", id)
	}
	// A paused sandbox is resumed first, and no pause stops it while its
	// writable layer is packed (a pack freezes and thaws it itself).
	r, done, err := e.ready(ctx, caller, id)
	if err != nil {
		return nil, err
	}
	defer done() // once packed, if not before
	if !r.active() {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s, not running: only a running sandbox can be packed", id, r.State)
	}
	be, err := e.backend(r.Backend)
	if err != nil {
		return nil, err
	}
	pk, ok := be.(sandbox.Packer)
	if !ok {
		return nil, sandbox.Lacks(r.Backend, sandbox.CapPack)
	}
	ls, ok := e.cfg.Images.(LayerStore)
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "node %s has no layer store to pack into", e.cfg.Node)
	}
	ref, err := ls.CheckImage(name, len(r.Layers)+1)
	if err != nil {
		return nil, err
	}
	if _, err := layer.CleanScrub(scrub); err != nil {
		return nil, err
	}
	e.touch(id)
	t0 := time.Now()
	p, err := pk.PackDiff(ctx, id, scrub)
	done() // the sandbox runs on; the layer is the node's now
	if err != nil {
		return nil, err
	}
	defer p.Body.Close()
	tPacked := time.Now()
	layers := make([]string, 0, len(r.Layers)+1)
	for _, l := range r.Layers {
		layers = append(layers, l.Digest)
	}
	switch i := slices.Index(layers, p.Digest); {
	case i == len(layers)-1:
		// Nothing changed since the sandbox's top layer was packed: the
		// same environment.
	case i >= 0:
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s: its changes make layer %s, which its environment holds already below others: change something and pack again", id, p.Digest)
	default:
		layers = append(layers, p.Digest)
	}
	if err := ls.StoreLayer(ctx, p.Digest, p.Size, p.Body); err != nil {
		return nil, fmt.Errorf("store the packed layer: %w", err)
	}
	tStored := time.Now()
	cfg := ImageConfig{Env: r.ImageEnv, Workdir: r.Workdir, User: r.User}
	if r.Image != "" {
		switch c, err := ls.ImageConfig(ctx, r.Image); {
		case err == nil:
			cfg = c
		case !errdefs.Is(err, errdefs.ErrNotFound):
			return nil, err
		}
	}
	if err := ls.PutImage(ctx, ref, layers, cfg, ImageWrite{By: caller, Force: opts.Force, Public: opts.Public}); err != nil {
		return nil, err
	}
	e.log.Debug("pack phases", "sandbox", id, "image", ref, "keeper_ms", ms(tPacked.Sub(t0)), "frozen_ms", ms(p.Frozen),
		"store_ms", ms(tStored.Sub(tPacked)), "register_ms", ms(time.Since(tStored)))
	e.touch(id)
	res := &PackResult{Image: ref, Layer: *p, Layers: layers, Frozen: p.Frozen}
	res.Layer.Body = nil
	return res, nil
}

func (a *sandboxAPI) PackDiff(ctx context.Context, req *connect.Request[sandboxv1.PackDiffRequest]) (*connect.Response[sandboxv1.PackDiffResponse], error) {
	start := time.Now()
	m := req.Msg
	res, err := a.e.PackDiff(ctx, callerOf(req.Header()), m.GetSandboxId(), m.GetName(),
		PackOptions{Scrub: m.GetScrub(), Force: m.GetForce(), Public: m.Public})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.PackDiffResponse{
		Image: res.Image, LayerDigest: res.Layer.Digest, LayerSize: res.Layer.Size,
		Layers: res.Layers, Files: int64(res.Layer.Files),
		Frozen: durationpb.New(res.Frozen), Duration: durationpb.New(time.Since(start)),
	}), nil
}
