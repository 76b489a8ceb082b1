package server

import (
	"context"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/dsecproject/dsec/internal/apiserver"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/edge"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazylayer"
	"github.com/dsecproject/dsec/internal/sandbox"
)

var (
	_ edge.LayerResolver = (*Images)(nil)
	_ edge.LayerStore    = (*Images)(nil)
)

// ResolveLayers implements edge.LayerResolver: every digest must name a
// registered layer whose blob the store has.
func (im *Images) ResolveLayers(ctx context.Context, digests []string, cfg edge.ImageConfig) (edge.Image, error) {
	if n := len(digests); n > cluster.MaxImageLayers {
		return edge.Image{}, errdefs.Newf(errdefs.ErrInvalidArgument,
			"%d layers, at most %d are supported: pack or squash some of them", n, cluster.MaxImageLayers)
	}
	for _, e := range cfg.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return edge.Image{}, errdefs.Newf(errdefs.ErrInvalidArgument, "layer config: environment entry %q is not KEY=VALUE", e)
		}
	}
	if w := cfg.Workdir; w != "" && !path.IsAbs(w) {
		return edge.Image{}, errdefs.Newf(errdefs.ErrInvalidArgument, "layer config: workdir %q is not an absolute path", w)
	}
	out := edge.Image{Env: cfg.Env, Workdir: cfg.Workdir, User: cfg.User}
	seen := map[string]bool{}
	for _, d := range digests {
		if seen[d] {
			return edge.Image{}, errdefs.Newf(errdefs.ErrInvalidArgument, "layer %s listed twice", d)
		}
		seen[d] = true
		if _, err := im.Cluster.GetLayer(ctx, d); err != nil {
			if errdefs.Is(err, errdefs.ErrNotFound) {
				return edge.Image{}, errdefs.Newf(errdefs.ErrNotFound,
					"layer %s is not registered: push or build it first (`dsec image inspect` lists an image's layers)", d)
			}
			return edge.Image{}, err
		}
		p, err := im.Blobs.Path(d)
		if err != nil {
			return edge.Image{}, fmt.Errorf("layer %s: %w", d, err)
		}
		out.Layers = append(out.Layers, sandbox.Layer{Digest: d, Path: p})
	}
	return out, nil
}

// CheckImage implements edge.LayerStore.
func (im *Images) CheckImage(name string, n int) (string, error) {
	ref, err := cluster.ParseRef(name)
	if err != nil {
		return "", err
	}
	if n > cluster.MaxImageLayers {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument,
			"image %s would have %d layers, at most %d are supported: start from an image with fewer layers", ref, n, cluster.MaxImageLayers)
	}
	return ref.String(), nil
}

// StoreLayer implements edge.LayerStore: the blob first, then its record,
// so that a recorded layer always has its bytes.
func (im *Images) StoreLayer(ctx context.Context, digest string, size int64, r io.Reader) error {
	desc, err := im.Blobs.Put(ctx, r, digest)
	if err != nil {
		return err
	}
	if desc.Size != size {
		return errdefs.Newf(errdefs.ErrInternal, "layer %s: stored %d bytes, %d were packed", digest, desc.Size, size)
	}
	l := cluster.Layer{Digest: desc.Digest, Size: desc.Size, MediaType: apiserver.LayerMediaType}
	if im.LazyLayers {
		if l.Lazy, err = lazylayer.Make(ctx, im.Blobs, desc.Digest, im.ChunkSize); err != nil {
			return err
		}
	}
	return im.Cluster.PutLayer(ctx, l)
}

// ImageConfig implements edge.LayerStore.
func (im *Images) ImageConfig(ctx context.Context, name string) (edge.ImageConfig, error) {
	ref, err := cluster.ParseRef(name)
	if err != nil {
		return edge.ImageConfig{}, err
	}
	img, err := im.Cluster.GetImage(ctx, ref)
	if err != nil {
		return edge.ImageConfig{}, err
	}
	c := img.Config
	return edge.ImageConfig{Env: c.Env, Workdir: c.Workdir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}, nil
}

// PutImage implements edge.LayerStore, with the ownership rules of
// cluster.Store.WriteImage.
func (im *Images) PutImage(ctx context.Context, name string, layers []string, cfg edge.ImageConfig, w edge.ImageWrite) error {
	ref, err := cluster.ParseRef(name)
	if err != nil {
		return err
	}
	_, err = im.Cluster.WriteImage(ctx, cluster.Image{
		Name: ref.Name, Tag: ref.Tag, Layers: layers,
		Config: cluster.ImageConfig{Env: cfg.Env, Workdir: cfg.Workdir, User: cfg.User, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd},
	}, cluster.ImageWrite{By: cluster.Principal{Project: w.By.Project, Admin: w.By.Admin}, Force: w.Force, Public: w.Public})
	return err
}
