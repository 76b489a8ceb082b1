package apiserver

import (
	"context"
	"io"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/dsecproject/dsec/api/dsec/admin/v1"
	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazylayer"
	"github.com/dsecproject/dsec/internal/streams"
)

// LayerMediaType is the media type of a dsec EROFS layer.
const LayerMediaType = "application/vnd.dsec.layer.v1.erofs"

// maxLayerBytes bounds one uploaded layer.
const maxLayerBytes = 64 << 30

type imageAPI struct{ s *Server }

func (a *imageAPI) UploadLayer(ctx context.Context, stream *connect.ClientStream[imagev1.UploadLayerRequest]) (*connect.Response[imagev1.UploadLayerResponse], error) {
	first, err := streams.First(stream, "upload layer", func(m *imagev1.UploadLayerRequest) bool { return m.GetHeader() != nil })
	if err != nil {
		return nil, err
	}
	h := first.GetHeader()
	if h.GetSize() < 0 || h.GetSize() > maxLayerBytes {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "upload layer: size %d is not between 0 and %d", h.GetSize(), int64(maxLayerBytes))
	}
	data := streams.Reader(stream, "upload layer", func(m *imagev1.UploadLayerRequest) ([]byte, bool) {
		return m.GetData(), m.GetHeader() == nil
	})
	r := &countingReader{r: data, limit: maxLayerBytes}
	a.s.gcMu.RLock()
	defer a.s.gcMu.RUnlock()
	desc, err := a.s.cfg.Blobs.Put(ctx, r, h.GetDigest())
	if err != nil {
		return nil, err
	}
	if h.GetSize() > 0 && desc.Size != h.GetSize() {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "upload layer: got %d bytes, header said %d", desc.Size, h.GetSize())
	}
	l := cluster.Layer{Digest: desc.Digest, Size: desc.Size, MediaType: LayerMediaType}
	if a.s.cfg.LazyLayers {
		if old, err := a.s.cfg.Cluster.GetLayer(ctx, desc.Digest); err == nil && old.Lazy != nil {
			return connect.NewResponse(&imagev1.UploadLayerResponse{Layer: &imagev1.Layer{Digest: old.Digest, Size: old.Size, MediaType: old.MediaType}}), nil
		}
		if l.Lazy, err = lazylayer.Make(ctx, a.s.cfg.Blobs, desc.Digest, a.s.cfg.LazyChunkSize); err != nil {
			return nil, err
		}
	}
	if err := a.s.cfg.Cluster.PutLayer(ctx, l); err != nil {
		return nil, err
	}
	return connect.NewResponse(&imagev1.UploadLayerResponse{Layer: &imagev1.Layer{Digest: l.Digest, Size: l.Size, MediaType: l.MediaType}}), nil
}

type countingReader struct {
	r     io.Reader
	n     int64
	limit int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.limit {
		return n, errdefs.Newf(errdefs.ErrInvalidArgument, "upload is larger than %d bytes", c.limit)
	}
	return n, err
}

func (a *imageAPI) CreateImage(ctx context.Context, req *connect.Request[imagev1.CreateImageRequest]) (*connect.Response[imagev1.CreateImageResponse], error) {
	ref, err := cluster.ParseRef(req.Msg.GetName())
	if err != nil {
		return nil, err
	}
	if len(req.Msg.GetLayerDigests()) == 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "image %s: no layers", ref)
	}
	c := req.Msg.GetConfig()
	img := cluster.Image{
		Name: ref.Name, Tag: ref.Tag, Layers: req.Msg.GetLayerDigests(),
		Config: cluster.ImageConfig{
			Env: c.GetEnv(), Workdir: c.GetWorkdir(), User: c.GetUser(),
			Entrypoint: c.GetEntrypoint(), Cmd: c.GetCmd(),
		},
	}
	got, err := a.s.cfg.Cluster.WriteImage(ctx, img, cluster.ImageWrite{
		By: keyFrom(ctx).Principal(), Force: req.Msg.GetForce(), Public: req.Msg.Public,
	})
	if err != nil {
		return nil, err
	}
	pi, err := a.imageProto(ctx, got)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&imagev1.CreateImageResponse{Image: pi}), nil
}

func (a *imageAPI) GetImage(ctx context.Context, req *connect.Request[imagev1.GetImageRequest]) (*connect.Response[imagev1.GetImageResponse], error) {
	ref, err := cluster.ParseRef(req.Msg.GetName())
	if err != nil {
		return nil, err
	}
	img, err := a.s.cfg.Cluster.GetImage(ctx, ref)
	if err != nil {
		return nil, err
	}
	if !img.RunnableBy(keyFrom(ctx).Principal()) {
		return nil, hiddenImage(ref)
	}
	pi, err := a.imageProto(ctx, img)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&imagev1.GetImageResponse{Image: pi}), nil
}

func (a *imageAPI) ListImages(ctx context.Context, _ *connect.Request[imagev1.ListImagesRequest]) (*connect.Response[imagev1.ListImagesResponse], error) {
	imgs, err := a.s.cfg.Cluster.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	out := &imagev1.ListImagesResponse{}
	by := keyFrom(ctx).Principal()
	for _, img := range imgs {
		if !img.RunnableBy(by) {
			continue
		}
		pi, err := a.imageProto(ctx, img)
		if err != nil {
			return nil, err
		}
		out.Images = append(out.Images, pi)
	}
	return connect.NewResponse(out), nil
}

func (a *imageAPI) imageProto(ctx context.Context, img cluster.Image) (*imagev1.Image, error) {
	pi := &imagev1.Image{
		Name:      img.Ref().String(),
		CreatedAt: timestamppb.New(img.CreatedAt),
		Project:   img.Project,
		Public:    img.Public,
		Config: &imagev1.ImageConfig{
			Env: img.Config.Env, Workdir: img.Config.Workdir, User: img.Config.User,
			Entrypoint: img.Config.Entrypoint, Cmd: img.Config.Cmd,
		},
	}
	for _, d := range img.Layers {
		l, err := a.s.cfg.Cluster.GetLayer(ctx, d)
		if err != nil {
			return nil, err
		}
		pi.Layers = append(pi.Layers, &imagev1.Layer{Digest: l.Digest, Size: l.Size, MediaType: l.MediaType})
		pi.Size += l.Size
	}
	return pi, nil
}

type adminAPI struct{ s *Server }

func keyProto(k cluster.Key) *adminv1.Key {
	p := &adminv1.Key{Id: k.ID, Name: k.Name, Project: k.Project, Admin: k.Admin, CreatedAt: timestamppb.New(k.CreatedAt)}
	if !k.ExpiresAt.IsZero() {
		p.ExpiresAt = timestamppb.New(k.ExpiresAt)
	}
	return p
}

func (a *adminAPI) CreateKey(ctx context.Context, req *connect.Request[adminv1.CreateKeyRequest]) (*connect.Response[adminv1.CreateKeyResponse], error) {
	if !keyFrom(ctx).Admin {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "only admin keys can create keys: ask an administrator, or use <state-dir>/admin.key on the server")
	}
	m := req.Msg
	if m.ExpiresIn != nil && m.GetExpiresIn().AsDuration() <= 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "key lifetime %s: give a positive duration, or none for a key that never expires", m.GetExpiresIn().AsDuration())
	}
	secret, k, err := a.s.cfg.Cluster.CreateKey(ctx, cluster.KeySpec{
		Name: m.GetName(), Project: m.GetProject(), Admin: m.GetAdmin(), ExpiresIn: m.GetExpiresIn().AsDuration(),
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&adminv1.CreateKeyResponse{Key: keyProto(k), Secret: secret}), nil
}

func (a *adminAPI) WhoAmI(ctx context.Context, _ *connect.Request[adminv1.WhoAmIRequest]) (*connect.Response[adminv1.WhoAmIResponse], error) {
	return connect.NewResponse(&adminv1.WhoAmIResponse{Key: keyProto(keyFrom(ctx))}), nil
}
