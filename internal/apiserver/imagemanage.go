package apiserver

// Image housekeeping: delete, inspect, disk usage, garbage collection of
// layers, and layer download (for `dsec image pull/push`).
//
// A layer is in use while an image references it or a sandbox on any node
// mounts it; GC removes neither (see internal/cluster/gc.go for the whole
// invariant). GC asks every registered node what its sandboxes mount and
// refuses to run when one does not answer: it cannot prove that node does
// not use a layer. Removing a layer deletes its etcd record, then its blob;
// a node keeps its mounted copy until its last sandbox using it is gone.

import (
	"context"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// DefaultGCGrace is how long GC keeps an unreferenced layer after it was
// created or released by an image: longer than a create takes from
// resolving an image to mounting its layers (the edge gives it 2 minutes),
// and than a build or pull takes between uploading a layer and writing
// the image that names it.
const DefaultGCGrace = 10 * time.Minute

// downloadChunk is the size of the data messages of DownloadLayer.
const downloadChunk = 1 << 20

func (a *imageAPI) DeleteImage(ctx context.Context, req *connect.Request[imagev1.DeleteImageRequest]) (*connect.Response[imagev1.DeleteImageResponse], error) {
	ref, err := cluster.ParseRef(req.Msg.GetName())
	if err != nil {
		return nil, err
	}
	img, err := a.s.cfg.Cluster.DeleteImage(ctx, ref, keyFrom(ctx).Principal())
	if err != nil {
		return nil, err
	}
	pi := a.deletedProto(ctx, img)
	return connect.NewResponse(&imagev1.DeleteImageResponse{Image: pi}), nil
}

func (a *imageAPI) GetLayer(ctx context.Context, req *connect.Request[imagev1.GetLayerRequest]) (*connect.Response[imagev1.GetLayerResponse], error) {
	l, err := a.s.cfg.Cluster.GetLayer(ctx, req.Msg.GetDigest())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&imagev1.GetLayerResponse{Layer: layerProto(l)}), nil
}

func layerProto(l cluster.Layer) *imagev1.Layer {
	return &imagev1.Layer{Digest: l.Digest, Size: l.Size, MediaType: l.MediaType}
}

func (a *imageAPI) DownloadLayer(ctx context.Context, req *connect.Request[imagev1.DownloadLayerRequest], stream *connect.ServerStream[imagev1.DownloadLayerResponse]) error {
	l, err := a.s.cfg.Cluster.GetLayer(ctx, req.Msg.GetDigest())
	if err != nil {
		return err
	}
	f, err := a.s.cfg.Blobs.Open(l.Digest)
	if err != nil {
		return errdefs.Newf(errdefs.ErrNotFound, "layer %s is recorded but its blob is missing from the store: upload it again", l.Digest)
	}
	defer f.Close()
	if err := stream.Send(&imagev1.DownloadLayerResponse{Msg: &imagev1.DownloadLayerResponse_Layer{Layer: layerProto(l)}}); err != nil {
		return err
	}
	buf := make([]byte, downloadChunk)
	for {
		n, rerr := io.ReadFull(f, buf)
		if n > 0 {
			if err := stream.Send(&imagev1.DownloadLayerResponse{Msg: &imagev1.DownloadLayerResponse_Data{Data: buf[:n]}}); err != nil {
				return err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return nil
		}
		if rerr != nil {
			return errdefs.Newf(errdefs.ErrInternal, "read layer %s: %v", l.Digest, rerr)
		}
	}
}

// layerUse maps each layer digest to the sandboxes (ID, project) that
// mount it, on every registered node. A node that does not answer is an
// Unavailable error: what it mounts is unknown.
type sandboxRef struct{ id, project string }

func (s *Server) layerUse(ctx context.Context) (map[string][]sandboxRef, int, error) {
	nodes, err := s.cfg.Cluster.ListNodes(ctx)
	if err != nil {
		return nil, 0, err
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		count int
	)
	use := map[string][]sandboxRef{}
	for _, n := range nodes {
		conn, err := s.cfg.Pool.Get(n.Name, n.Addr)
		if err != nil {
			return nil, 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			resp, err := conn.LayerUse.ListLayerUse(cctx, connect.NewRequest(&imagev1.ListLayerUseRequest{}))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = errdefs.RetryAfter(errdefs.Newf(errdefs.ErrUnavailable,
						"node %s did not say which layers its sandboxes use (%v): bring it back, or wait until it leaves the cluster, and retry",
						n.Name, edgeErr(n.Name, err)), 5*time.Second)
				}
				return
			}
			for _, sb := range resp.Msg.GetSandboxes() {
				count++
				for _, d := range sb.GetLayerDigests() {
					use[d] = append(use[d], sandboxRef{id: sb.GetSandboxId(), project: sb.GetProject()})
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return nil, 0, first
	}
	return use, count, nil
}

// visibleIDs returns the IDs of refs the caller may see: all for an admin
// key, its own project's otherwise.
func visibleIDs(ctx context.Context, refs []sandboxRef) []string {
	k := keyFrom(ctx)
	var ids []string
	for _, r := range refs {
		if k.Admin || r.project == k.Project || (k.Project == "" && r.project == "default") {
			ids = append(ids, r.id)
		}
	}
	slices.Sort(ids)
	return ids
}

func (a *imageAPI) usageProto(ctx context.Context, l cluster.StoredLayer, refs map[string][]string, use map[string][]sandboxRef) *imagev1.LayerUsage {
	imgs := slices.Clone(refs[l.Digest])
	slices.Sort(imgs)
	return &imagev1.LayerUsage{
		Layer:     layerProto(l.Layer),
		CreatedAt: timestamppb.New(l.CreatedAt),
		Images:    imgs,
		Sandboxes: visibleIDs(ctx, use[l.Digest]),
	}
}

func (a *imageAPI) InspectImage(ctx context.Context, req *connect.Request[imagev1.InspectImageRequest]) (*connect.Response[imagev1.InspectImageResponse], error) {
	ref, err := cluster.ParseRef(req.Msg.GetName())
	if err != nil {
		return nil, err
	}
	st, err := a.s.cfg.Cluster.LayerState(ctx)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(st.Images, func(img cluster.Image) bool { return img.Ref() == ref })
	if i >= 0 && !st.Images[i].RunnableBy(keyFrom(ctx).Principal()) {
		return nil, hiddenImage(ref)
	}
	if i < 0 {
		_, err := a.s.cfg.Cluster.GetImage(ctx, ref) // the NotFound with its hint
		if err == nil {
			err = errdefs.Newf(errdefs.ErrUnavailable, "image %s was created meanwhile: retry", ref)
		}
		return nil, err
	}
	img := st.Images[i]
	use, _, err := a.s.layerUse(ctx)
	if err != nil {
		return nil, err
	}
	byDigest := map[string]cluster.StoredLayer{}
	for _, l := range st.Layers {
		byDigest[l.Digest] = l
	}
	refs := visibleState(ctx, st, use).References()
	out := &imagev1.InspectImageResponse{}
	for _, d := range img.Layers {
		l, ok := byDigest[d]
		if !ok {
			return nil, errdefs.Newf(errdefs.ErrInternal, "image %s names layer %s, which is not recorded", ref, d)
		}
		out.Layers = append(out.Layers, a.usageProto(ctx, l, refs, use))
	}
	if out.Image, err = a.imageProto(ctx, img); err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

func (a *imageAPI) DiskUsage(ctx context.Context, _ *connect.Request[imagev1.DiskUsageRequest]) (*connect.Response[imagev1.DiskUsageResponse], error) {
	st, err := a.s.cfg.Cluster.LayerState(ctx)
	if err != nil {
		return nil, err
	}
	use, sandboxes, err := a.s.layerUse(ctx)
	if err != nil {
		return nil, err
	}
	if !keyFrom(ctx).Admin {
		// Other projects' private images, their layers and sandboxes stay
		// out, and so do their counts.
		st = visibleState(ctx, st, use)
		ids := map[string]bool{}
		for _, refs := range use {
			for _, id := range visibleIDs(ctx, refs) {
				ids[id] = true
			}
		}
		sandboxes = len(ids)
	}
	refs := st.References()
	out := &imagev1.DiskUsageResponse{ImageCount: int64(len(st.Images)), SandboxCount: int64(sandboxes)}
	for _, l := range st.Layers {
		out.Layers = append(out.Layers, a.usageProto(ctx, l, refs, use))
		out.LayerCount++
		out.TotalBytes += l.Size
		switch n := len(refs[l.Digest]); {
		case n >= 2:
			out.SharedCount++
			out.SharedBytes += l.Size
		case n == 1:
			out.UniqueCount++
			out.UniqueBytes += l.Size
		case len(use[l.Digest]) > 0:
			out.UnreferencedInUseCount++
			out.UnreferencedInUseBytes += l.Size
		default:
			out.ReclaimableCount++
			out.ReclaimableBytes += l.Size
		}
	}
	return connect.NewResponse(out), nil
}

func (a *imageAPI) GarbageCollect(ctx context.Context, req *connect.Request[imagev1.GarbageCollectRequest]) (*connect.Response[imagev1.GarbageCollectResponse], error) {
	if !keyFrom(ctx).Admin {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "only admin keys can collect layers: ask an administrator")
	}
	grace := DefaultGCGrace
	if req.Msg.GraceSeconds != nil {
		g := req.Msg.GetGraceSeconds()
		if g < 0 {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grace period %ds is negative: give 0 or more seconds", g)
		}
		grace = time.Duration(g) * time.Second
	}
	dry := req.Msg.GetDryRun()
	// Uploads hold gcMu shared from storing the blob to recording the
	// layer; a collection that removes holds it exclusively, so an upload
	// that found the blob present never records it after GC removed it.
	if !dry {
		a.s.gcMu.Lock()
		defer a.s.gcMu.Unlock()
	}
	// The order matters: the state first (revision R), then the nodes. A
	// sandbox that a node does not list yet resolved its image after R,
	// and so found the layer referenced at R, or released after R.
	st, err := a.s.cfg.Cluster.LayerState(ctx)
	if err != nil {
		return nil, err
	}
	use, _, err := a.s.layerUse(ctx)
	if err != nil {
		return nil, err
	}
	candidates, keptWhy := st.Collectable(time.Now(), grace)
	out := &imagev1.GarbageCollectResponse{}
	for _, l := range candidates {
		if ids := use[l.Digest]; len(ids) > 0 {
			keptWhy[l.Digest] = "in use by " + plural(len(ids), "sandbox", "sandboxes")
			continue
		}
		if !dry {
			if err := a.s.cfg.Cluster.DeleteLayer(ctx, st, l); err != nil {
				if errdefs.Is(err, errdefs.ErrFailedPrecondition) {
					keptWhy[l.Digest] = "images changed during the collection"
					continue
				}
				return nil, err
			}
			if err := a.s.cfg.Blobs.Delete(l.Digest); err != nil {
				a.s.log.Warn("layer record removed, blob left behind", "layer", l.Digest, "err", err)
			}
		}
		out.Removed = append(out.Removed, layerProto(l.Layer))
		out.RemovedBytes += l.Size
	}
	if err := a.collectOrphanBlobs(ctx, st, grace, dry, out); err != nil {
		return nil, err
	}
	for _, l := range st.Layers {
		if why, ok := keptWhy[l.Digest]; ok {
			out.Kept = append(out.Kept, &imagev1.KeptLayer{Layer: layerProto(l.Layer), Reason: why})
		}
	}
	if !dry && len(out.Removed) > 0 {
		a.s.log.Info("layers collected", "layers", len(out.Removed), "bytes", out.RemovedBytes)
	}
	return connect.NewResponse(out), nil
}

// collectOrphanBlobs removes the blobs no layer record names that are
// older than grace: an upload that stored a blob and then failed to record
// the layer (a lost etcd connection, a crash) leaves one. Uploads through
// this server are excluded by gcMu; a layer recorded after st was read is
// looked up again before its blob is taken for an orphan.
func (a *imageAPI) collectOrphanBlobs(ctx context.Context, st cluster.LayerState, grace time.Duration, dry bool, out *imagev1.GarbageCollectResponse) error {
	blobs, err := a.s.cfg.Blobs.List()
	if err != nil {
		return err
	}
	recorded := make(map[string]bool, len(st.Layers))
	for _, l := range st.Layers {
		recorded[l.Digest] = true
		if l.Lazy != nil {
			// A removed layer's lazy blobs become orphans here, so that
			// one shared by another layer is kept.
			recorded[l.Lazy.Meta], recorded[l.Lazy.Data] = true, true
		}
	}
	for _, b := range blobs {
		if recorded[b.Digest] {
			continue
		}
		p, err := a.s.cfg.Blobs.Path(b.Digest)
		if err != nil {
			continue // removed meanwhile
		}
		fi, err := os.Stat(p)
		if err != nil || time.Since(fi.ModTime()) < grace {
			continue
		}
		switch _, err := a.s.cfg.Cluster.GetLayer(ctx, b.Digest); {
		case err == nil:
			continue
		case !errdefs.Is(err, errdefs.ErrNotFound):
			return err
		}
		if !dry {
			if err := a.s.cfg.Blobs.Delete(b.Digest); err != nil {
				return err
			}
		}
		out.OrphanBlobs = append(out.OrphanBlobs, &imagev1.Layer{Digest: b.Digest, Size: b.Size})
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
