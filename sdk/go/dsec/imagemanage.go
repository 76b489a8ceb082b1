package dsec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"connectrpc.com/connect"

	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
)

// LayerUsage is a stored layer with the images that reference it and the
// sandboxes that mount it.
type LayerUsage struct {
	Layer
	CreatedAt time.Time
	// Images are the NAME:TAGs whose layer lists name it.
	Images []string
	// Sandboxes are the IDs of live sandboxes that mount it (of the
	// caller's project; every project for an admin key).
	Sandboxes []string
}

// ImageDetails is an image with the usage of each of its layers.
type ImageDetails struct {
	Image *Image
	// Layers are in the order of Image.Layers.
	Layers []LayerUsage
}

// DiskUsage sums up the layer store.
type DiskUsage struct {
	// Layers are every stored layer, by digest.
	Layers     []LayerUsage
	LayerCount int64
	TotalBytes int64
	// Shared: layers two or more images reference.
	SharedCount, SharedBytes int64
	// Unique: layers exactly one image references.
	UniqueCount, UniqueBytes int64
	// UnreferencedInUse: layers no image references that a sandbox mounts.
	UnreferencedInUseCount, UnreferencedInUseBytes int64
	// Reclaimable: layers neither referenced nor mounted, which
	// GarbageCollect with no grace period removes.
	ReclaimableCount, ReclaimableBytes int64
	Images, Sandboxes                  int64
}

// GCOptions tunes GarbageCollect.
type GCOptions struct {
	// DryRun reports what would be removed and removes nothing.
	DryRun bool
	// Grace keeps layers created, or released by an image, less than Grace
	// ago. Nil: the server's default (10 minutes).
	Grace *time.Duration
}

// KeptLayer is an unreferenced layer GC kept, and why.
type KeptLayer struct {
	Layer
	Reason string
}

// GCResult is what GarbageCollect removed (or, dry, would remove).
type GCResult struct {
	Removed      []Layer
	RemovedBytes int64
	Kept         []KeptLayer
	// OrphanBlobs are stored bytes no layer record names (an upload that
	// failed half-way), older than the grace period: removed too.
	OrphanBlobs []Layer
}

// DeleteImage removes the image called name and returns it as it was. Its
// layers stay until GarbageCollect finds them unused. Only the image's
// project or an admin key may (ErrPermissionDenied; ErrNotFound for a
// private image of another project).
func (c *Client) DeleteImage(ctx context.Context, name string) (*Image, error) {
	resp, err := c.images().DeleteImage(ctx, connect.NewRequest(&imagev1.DeleteImageRequest{Name: name}))
	if err != nil {
		return nil, c.err(err)
	}
	return imageFromProto(resp.Msg.GetImage()), nil
}

// InspectImage returns the image called name with its layers' usage.
func (c *Client) InspectImage(ctx context.Context, name string) (*ImageDetails, error) {
	resp, err := c.images().InspectImage(ctx, connect.NewRequest(&imagev1.InspectImageRequest{Name: name}))
	if err != nil {
		return nil, c.err(err)
	}
	out := &ImageDetails{Image: imageFromProto(resp.Msg.GetImage())}
	for _, u := range resp.Msg.GetLayers() {
		out.Layers = append(out.Layers, usageFromProto(u))
	}
	return out, nil
}

func usageFromProto(u *imagev1.LayerUsage) LayerUsage {
	return LayerUsage{
		Layer: layerFromProto(u.GetLayer()), CreatedAt: timeOf(u.GetCreatedAt()),
		Images: slices.Clone(u.GetImages()), Sandboxes: slices.Clone(u.GetSandboxes()),
	}
}

// DiskUsage describes the layer store.
func (c *Client) DiskUsage(ctx context.Context) (*DiskUsage, error) {
	resp, err := c.images().DiskUsage(ctx, connect.NewRequest(&imagev1.DiskUsageRequest{}))
	if err != nil {
		return nil, c.err(err)
	}
	m := resp.Msg
	out := &DiskUsage{
		LayerCount: m.GetLayerCount(), TotalBytes: m.GetTotalBytes(),
		SharedCount: m.GetSharedCount(), SharedBytes: m.GetSharedBytes(),
		UniqueCount: m.GetUniqueCount(), UniqueBytes: m.GetUniqueBytes(),
		UnreferencedInUseCount: m.GetUnreferencedInUseCount(), UnreferencedInUseBytes: m.GetUnreferencedInUseBytes(),
		ReclaimableCount: m.GetReclaimableCount(), ReclaimableBytes: m.GetReclaimableBytes(),
		Images: m.GetImageCount(), Sandboxes: m.GetSandboxCount(),
	}
	for _, u := range m.GetLayers() {
		out.Layers = append(out.Layers, usageFromProto(u))
	}
	return out, nil
}

// GarbageCollect removes the layers no image references and no sandbox
// mounts (admin keys only).
func (c *Client) GarbageCollect(ctx context.Context, opts GCOptions) (*GCResult, error) {
	req := &imagev1.GarbageCollectRequest{DryRun: opts.DryRun}
	if opts.Grace != nil {
		s := int64(opts.Grace.Seconds())
		req.GraceSeconds = &s
	}
	resp, err := c.images().GarbageCollect(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, c.err(err)
	}
	out := &GCResult{RemovedBytes: resp.Msg.GetRemovedBytes()}
	for _, l := range resp.Msg.GetRemoved() {
		out.Removed = append(out.Removed, layerFromProto(l))
	}
	for _, l := range resp.Msg.GetOrphanBlobs() {
		out.OrphanBlobs = append(out.OrphanBlobs, layerFromProto(l))
	}
	for _, k := range resp.Msg.GetKept() {
		out.Kept = append(out.Kept, KeptLayer{Layer: layerFromProto(k.GetLayer()), Reason: k.GetReason()})
	}
	return out, nil
}

// GetLayer returns the stored layer digest; ErrNotFound when the server
// does not have it.
func (c *Client) GetLayer(ctx context.Context, digest string) (Layer, error) {
	resp, err := c.images().GetLayer(ctx, connect.NewRequest(&imagev1.GetLayerRequest{Digest: digest}))
	if err != nil {
		return Layer{}, c.err(err)
	}
	return layerFromProto(resp.Msg.GetLayer()), nil
}

// DownloadLayer streams the bytes of the stored layer digest. The reader
// fails at its end when the bytes do not have the digest or the size the
// server announced; close it when done.
func (c *Client) DownloadLayer(ctx context.Context, digest string) (Layer, io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.images().DownloadLayer(ctx, connect.NewRequest(&imagev1.DownloadLayerRequest{Digest: digest}))
	if err != nil {
		cancel()
		return Layer{}, nil, c.err(err)
	}
	if !stream.Receive() {
		err := stream.Err()
		cancel()
		if err == nil {
			err = newError(ErrInternal, "download layer %s: the server sent nothing", digest)
		}
		return Layer{}, nil, c.err(err)
	}
	l := layerFromProto(stream.Msg().GetLayer())
	if l.Digest != digest {
		cancel()
		return Layer{}, nil, newError(ErrInternal, "download layer %s: the server announced layer %q", digest, l.Digest)
	}
	return l, &layerReader{c: c, stream: stream, cancel: cancel, want: l, h: sha256.New()}, nil
}

type layerReader struct {
	c      *Client
	stream *connect.ServerStreamForClient[imagev1.DownloadLayerResponse]
	cancel context.CancelFunc
	want   Layer
	h      interface {
		io.Writer
		Sum([]byte) []byte
	}
	buf []byte
	n   int64
	err error
}

func (r *layerReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if !r.stream.Receive() {
			if err := r.stream.Err(); err != nil {
				r.err = r.c.err(err)
				return 0, r.err
			}
			r.err = r.verify()
			return 0, r.err
		}
		r.buf = r.stream.Msg().GetData()
		r.n += int64(len(r.buf))
		_, _ = r.h.Write(r.buf)
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// ErrDigestMismatch is wrapped by the error of a layer whose bytes do not
// have the digest they were announced with.
var ErrDigestMismatch = errors.New("digest mismatch")

func (r *layerReader) verify() error {
	got := "sha256:" + hex.EncodeToString(r.h.Sum(nil))
	if got != r.want.Digest || r.n != r.want.Size {
		return fmt.Errorf("%w: %w", ErrDigestMismatch, newError(ErrInvalidArgument,
			"layer %s: received %d bytes with digest %s, want %d bytes: the source store's copy is corrupt; rebuild or re-import it there",
			r.want.Digest, r.n, got, r.want.Size))
	}
	return io.EOF
}

func (r *layerReader) Close() error {
	r.cancel()
	return r.stream.Close()
}

// CopyProgress reports a copy's progress: the layer being copied (index
// of count), its bytes so far, and whether the target already had it.
type CopyProgress func(index, count int, l Layer, done int64, skipped bool)

// CopyImage copies the image name, its layers and config, from the server
// of src to the server of dst (each with its own store). Layers dst already
// has are skipped; the others stream through this process and are verified
// against their digests on arrival, by dst and here. The image is
// registered on dst only after all its layers arrived: a failed copy
// registers no image (layers already copied stay, unreferenced, until GC).
// On dst the image belongs to dst's key's project; opts say how it is
// written there (WithForce, WithPublic).
func CopyImage(ctx context.Context, src, dst *Client, name string, progress CopyProgress, opts ...ImageOption) (*Image, error) {
	img, err := src.GetImage(ctx, name)
	if err != nil {
		return nil, err
	}
	digests := make([]string, len(img.Layers))
	for i, l := range img.Layers {
		digests[i] = l.Digest
		if _, err := dst.GetLayer(ctx, l.Digest); err == nil {
			if progress != nil {
				progress(i, len(img.Layers), l, l.Size, true)
			}
			continue
		} else if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		if err := copyLayer(ctx, src, dst, i, len(img.Layers), l, progress); err != nil {
			return nil, err
		}
	}
	return dst.CreateImage(ctx, img.Name, digests, img.Config, opts...)
}

func copyLayer(ctx context.Context, src, dst *Client, i, n int, l Layer, progress CopyProgress) error {
	_, rc, err := src.DownloadLayer(ctx, l.Digest)
	if err != nil {
		return err
	}
	defer rc.Close()
	var r io.Reader = rc
	if progress != nil {
		r = &progressReader{r: rc, reported: -1, f: func(done int64) { progress(i, n, l, done, false) }}
	}
	if _, err := dst.UploadLayer(ctx, r, l.Digest, l.Size); err != nil {
		return fmt.Errorf("copy layer %d of %d: %w", i+1, n, err)
	}
	return nil
}

// progressReader reports the bytes read so far at most every 200 ms and
// at the end, never the same count twice (a caller counts "done" once).
type progressReader struct {
	r        io.Reader
	n        int64
	reported int64
	last     time.Time
	f        func(int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if p.n != p.reported && (err != nil || time.Since(p.last) > 200*time.Millisecond) {
		p.last, p.reported = time.Now(), p.n
		p.f(p.n)
	}
	return n, err
}
