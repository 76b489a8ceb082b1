package cluster

// Garbage collection of layers.
//
// A layer may be removed only when nothing can still need it:
//   - no image references it, at one etcd revision R (LayerState);
//   - no sandbox on any node mounts it (the caller asks every edge, after R);
//   - it was recorded, and last released by an image (deleted, or replaced
//     by a tag pointing elsewhere), more than a grace period ago, so that a
//     create that resolved an image before it was deleted, or an upload
//     whose image is not written yet, finds its layers;
//   - DeleteLayer removes the record in a transaction that fails when any
//     image was written after R or the layer's record changed since R: an
//     image written meanwhile that names the layer keeps it, and an image
//     written after the delete fails (PutImage checks its layers exist).

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func (s *Store) releasedPrefix() string           { return s.prefix + "released/" }
func (s *Store) releasedKey(digest string) string { return s.releasedPrefix() + digest }

type releasedRecord struct {
	Version    int       `json:"version"`
	ReleasedAt time.Time `json:"released_at"`
}

// releaseLayers records that an image stopped naming digests now; GC keeps
// them for its grace period from then. It runs before the image write that
// releases them, so a failed write only delays their collection.
func (s *Store) releaseLayers(ctx context.Context, digests []string) error {
	rec := encode(releasedRecord{Version: schemaVersion, ReleasedAt: s.now().UTC()})
	for len(digests) > 0 {
		n := min(len(digests), MaxImageLayers)
		ops := make([]clientv3.Op, n)
		for i, d := range digests[:n] {
			ops[i] = clientv3.OpPut(s.releasedKey(d), rec)
		}
		if _, err := s.c.Txn(ctx).Then(ops...).Commit(); err != nil {
			return storeErr("release layers", err)
		}
		digests = digests[n:]
	}
	return nil
}

// LayerState is the images and layers of the cluster at one etcd revision.
type LayerState struct {
	// Revision is the etcd revision everything was read at.
	Revision int64
	Images   []Image
	Layers   []StoredLayer
}

// StoredLayer is a layer with what GC needs to know about its record.
type StoredLayer struct {
	Layer
	// ReleasedAt is when an image last stopped naming the layer (zero:
	// never).
	ReleasedAt time.Time
	// modRevision is the revision the layer's record was last written at.
	modRevision int64
}

// LayerState reads every image and layer at one revision.
func (s *Store) LayerState(ctx context.Context) (LayerState, error) {
	const op = "read layer state"
	resp, err := s.c.Txn(ctx).Then(
		clientv3.OpGet(s.imagesPrefix(), clientv3.WithPrefix()),
		clientv3.OpGet(s.layersPrefix(), clientv3.WithPrefix()),
		clientv3.OpGet(s.releasedPrefix(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return LayerState{}, storeErr(op, err)
	}
	st := LayerState{Revision: resp.Header.Revision}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var rec imageRecord
		if err := decode(string(kv.Key), kv.Value, &rec); err != nil {
			return LayerState{}, fmt.Errorf("%s: %w", op, err)
		}
		st.Images = append(st.Images, rec.image())
	}
	released := map[string]time.Time{}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		var rec releasedRecord
		if err := decode(string(kv.Key), kv.Value, &rec); err != nil {
			return LayerState{}, fmt.Errorf("%s: %w", op, err)
		}
		released[string(kv.Key[len(s.releasedPrefix()):])] = rec.ReleasedAt
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var rec layerRecord
		if err := decode(string(kv.Key), kv.Value, &rec); err != nil {
			return LayerState{}, fmt.Errorf("%s: %w", op, err)
		}
		st.Layers = append(st.Layers, StoredLayer{Layer: rec.layer(), ReleasedAt: released[rec.Digest], modRevision: kv.ModRevision})
	}
	return st, nil
}

// References maps each layer digest to the images (NAME:TAG) naming it.
func (st LayerState) References() map[string][]string {
	refs := map[string][]string{}
	for _, img := range st.Images {
		for _, d := range img.Layers {
			refs[d] = append(refs[d], img.Ref().String())
		}
	}
	return refs
}

// Collectable returns the layers of st that no image references, with the
// ones kept for the grace period (created or released less than grace
// before now) apart, each with its reason. The caller still has to rule out
// the layers that sandboxes use.
func (st LayerState) Collectable(now time.Time, grace time.Duration) (remove []StoredLayer, kept map[string]string) {
	refs := st.References()
	kept = map[string]string{}
	for _, l := range st.Layers {
		switch {
		case len(refs[l.Digest]) > 0:
			continue
		case now.Sub(l.CreatedAt) < grace:
			kept[l.Digest] = fmt.Sprintf("created %s ago, within the grace period of %s", now.Sub(l.CreatedAt).Round(time.Second), grace)
		case now.Sub(l.ReleasedAt) < grace:
			kept[l.Digest] = fmt.Sprintf("released by an image %s ago, within the grace period of %s", now.Sub(l.ReleasedAt).Round(time.Second), grace)
		default:
			remove = append(remove, l)
		}
	}
	return remove, kept
}

// DeleteLayer removes the record of a layer st found collectable, unless an
// image was written, or the layer's record changed, after st was read: then
// it returns FailedPrecondition and removes nothing. The blob is the
// caller's to remove, after this succeeded.
func (s *Store) DeleteLayer(ctx context.Context, st LayerState, l StoredLayer) error {
	op := "delete layer " + l.Digest
	txn, err := s.c.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(s.imagesPrefix()), "<", st.Revision+1).WithPrefix(),
		clientv3.Compare(clientv3.ModRevision(s.layerKey(l.Digest)), "=", l.modRevision),
	).Then(
		clientv3.OpDelete(s.layerKey(l.Digest)),
		clientv3.OpDelete(s.releasedKey(l.Digest)),
	).Commit()
	if err != nil {
		return storeErr(op, err)
	}
	if !txn.Succeeded {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "%s: images or the layer changed during the collection; run it again", op)
	}
	return nil
}
