package dsec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"connectrpc.com/connect"

	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
)

// Layer is a stored read-only EROFS layer.
type Layer struct {
	// Digest is sha256:<hex> of the EROFS image.
	Digest    string
	Size      int64
	MediaType string
}

// ImageConfig says how to run an image.
type ImageConfig struct {
	// Env holds K=V entries.
	Env        []string
	Workdir    string
	User       string
	Entrypoint []string
	Cmd        []string
}

// Image is a named, ordered list of layers (an environment).
type Image struct {
	// Name is NAME:TAG.
	Name string
	// Layers are lowest first.
	Layers    []Layer
	Config    ImageConfig
	CreatedAt time.Time
	// Size is the sum of the layers' sizes.
	Size int64
	// Project made the image: only it (or an admin key) deletes or
	// rewrites it.
	Project string
	// Public images run for every project; private ones only for their
	// own project and admin keys.
	Public bool
}

// ImageOption changes how CreateImage (and PackDiffWith, CopyImage) write
// an image.
type ImageOption func(*imageWrite)

type imageWrite struct {
	force  bool
	public *bool
}

// WithForce replaces an existing NAME:TAG that has other layers or config;
// without it that is ErrFailedPrecondition. Writing the same layers and
// config again needs no force: it changes nothing. Either way only the
// image's project (or an admin key) may write onto it
// (ErrPermissionDenied).
func WithForce() ImageOption { return func(w *imageWrite) { w.force = true } }

// WithPublic makes the image public (every project may run it) or private
// (only its own). Without it a new image is private and an existing one
// keeps its visibility.
func WithPublic(public bool) ImageOption { return func(w *imageWrite) { w.public = &public } }

func imageWriteOf(opts []ImageOption) imageWrite {
	var w imageWrite
	for _, o := range opts {
		o(&w)
	}
	return w
}

// UploadLayer stores the EROFS layer that r yields, of the given digest
// (sha256:<hex>) and size, streamed in chunks of at most 1 MiB. Uploading a
// layer the server already has is cheap and returns it. If reading r fails
// the upload is abandoned.
func (c *Client) UploadLayer(ctx context.Context, r io.Reader, digest string, size int64) (Layer, error) {
	if digest == "" || size < 0 {
		return Layer{}, newError(ErrInvalidArgument, "upload layer: need its digest (sha256:<hex>) and a size ≥ 0, got %q and %d", digest, size)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := c.images().UploadLayer(ctx)
	resp, err := sendChunks(stream, cancel,
		&imagev1.UploadLayerRequest{Msg: &imagev1.UploadLayerRequest_Header{Header: &imagev1.UploadLayerHeader{Digest: digest, Size: size}}},
		r, func(b []byte) *imagev1.UploadLayerRequest {
			return &imagev1.UploadLayerRequest{Msg: &imagev1.UploadLayerRequest_Data{Data: b}}
		})
	if err != nil {
		var re *readError
		if errors.As(err, &re) {
			return Layer{}, fmt.Errorf("upload layer %s: %w", digest, re.err)
		}
		return Layer{}, c.err(err)
	}
	return layerFromProto(resp.Msg.GetLayer()), nil
}

// CreateImage registers name (NAME[:TAG]) as the given stored layers, lowest
// first, run as cfg says, owned by the caller's project (see WithForce and
// WithPublic).
func (c *Client) CreateImage(ctx context.Context, name string, layerDigests []string, cfg ImageConfig, opts ...ImageOption) (*Image, error) {
	w := imageWriteOf(opts)
	resp, err := c.images().CreateImage(ctx, connect.NewRequest(&imagev1.CreateImageRequest{
		Force:        w.force,
		Public:       w.public,
		Name:         name,
		LayerDigests: layerDigests,
		Config: &imagev1.ImageConfig{
			Env:        cfg.Env,
			Workdir:    cfg.Workdir,
			User:       cfg.User,
			Entrypoint: cfg.Entrypoint,
			Cmd:        cfg.Cmd,
		},
	}))
	if err != nil {
		return nil, c.err(err)
	}
	return imageFromProto(resp.Msg.GetImage()), nil
}

// SetImagePublic makes the image called name public or private and returns
// it; only its project or an admin key may.
func (c *Client) SetImagePublic(ctx context.Context, name string, public bool) (*Image, error) {
	resp, err := c.images().SetImagePublic(ctx, connect.NewRequest(&imagev1.SetImagePublicRequest{Name: name, Public: public}))
	if err != nil {
		return nil, c.err(err)
	}
	return imageFromProto(resp.Msg.GetImage()), nil
}

// GetImage returns the image called name (NAME[:TAG]), if the caller may
// run it (ErrNotFound otherwise).
func (c *Client) GetImage(ctx context.Context, name string) (*Image, error) {
	resp, err := c.images().GetImage(ctx, connect.NewRequest(&imagev1.GetImageRequest{Name: name}))
	if err != nil {
		return nil, c.err(err)
	}
	return imageFromProto(resp.Msg.GetImage()), nil
}

// ListImages returns every image the caller may run: its project's and
// the public ones (all for an admin key).
func (c *Client) ListImages(ctx context.Context) ([]*Image, error) {
	resp, err := c.images().ListImages(ctx, connect.NewRequest(&imagev1.ListImagesRequest{}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]*Image, 0, len(resp.Msg.GetImages()))
	for _, im := range resp.Msg.GetImages() {
		out = append(out, imageFromProto(im))
	}
	return out, nil
}

func layerFromProto(l *imagev1.Layer) Layer {
	return Layer{Digest: l.GetDigest(), Size: l.GetSize(), MediaType: l.GetMediaType()}
}

func imageFromProto(p *imagev1.Image) *Image {
	im := &Image{
		Name: p.GetName(),
		Config: ImageConfig{
			Env:        slices.Clone(p.GetConfig().GetEnv()),
			Workdir:    p.GetConfig().GetWorkdir(),
			User:       p.GetConfig().GetUser(),
			Entrypoint: slices.Clone(p.GetConfig().GetEntrypoint()),
			Cmd:        slices.Clone(p.GetConfig().GetCmd()),
		},
		CreatedAt: timeOf(p.GetCreatedAt()),
		Size:      p.GetSize(),
		Project:   p.GetProject(),
		Public:    p.GetPublic(),
	}
	for _, l := range p.GetLayers() {
		im.Layers = append(im.Layers, layerFromProto(l))
	}
	return im
}
