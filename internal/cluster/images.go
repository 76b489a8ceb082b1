package cluster

import (
	"cmp"
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazyregexp"
)

// Layer is a read-only EROFS layer, addressed by the digest of its bytes.
type Layer struct {
	// Digest is "sha256:" and 64 lowercase hex digits (or sha512 and 128).
	Digest string
	// Size is its length in bytes.
	Size      int64
	MediaType string
	// CreatedAt is set by PutLayer when zero.
	CreatedAt time.Time
	// Lazy is the layer's lazy form, when one was made (dsec up
	// --lazy-layers): nodes with a blob source then mount the layer
	// without downloading it.
	Lazy *LazyForm
}

// LazyForm is a layer split for loading on demand: a metadata-only EROFS
// image whose file data lives in a separate blob (its device 1), read in
// chunks of ChunkSize verified by ChunkDigests.
type LazyForm struct {
	// Meta is the digest of the metadata-only image, fetched eagerly.
	Meta string `json:"meta"`
	// Data is the digest of the data blob, DataSize bytes, block aligned.
	Data     string `json:"data"`
	DataSize int64  `json:"data_size"`
	// ChunkSize is the unit of ChunkDigests ("sha256:<hex>" of each piece
	// of the data blob; the last may be short).
	ChunkSize    int64    `json:"chunk_size"`
	ChunkDigests []string `json:"chunk_digests"`
}

func (f *LazyForm) validate() error {
	if f == nil {
		return nil
	}
	if err := validateDigest(f.Meta); err != nil {
		return err
	}
	if err := validateDigest(f.Data); err != nil {
		return err
	}
	if f.DataSize < 0 || f.ChunkSize <= 0 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "lazy form: data size %d, chunk size %d", f.DataSize, f.ChunkSize)
	}
	if want := (f.DataSize + f.ChunkSize - 1) / f.ChunkSize; int64(len(f.ChunkDigests)) != want {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "lazy form: %d chunk digests, want %d", len(f.ChunkDigests), want)
	}
	return nil
}

type layerRecord struct {
	Version   int       `json:"version"`
	Digest    string    `json:"digest"`
	Size      int64     `json:"size"`
	MediaType string    `json:"media_type,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Lazy      *LazyForm `json:"lazy,omitempty"`
}

func (r layerRecord) layer() Layer {
	return Layer{Digest: r.Digest, Size: r.Size, MediaType: r.MediaType, CreatedAt: r.CreatedAt, Lazy: r.Lazy}
}

// MaxImageLayers is the most layers an image may have: etcd checks the
// tag and each layer in the one transaction that writes the image, and it
// allows 128 operations per transaction by default.
const MaxImageLayers = 127

var digestRE = lazyregexp.New(`^(sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128})$`)

func validateDigest(d string) error {
	if !digestRE.MatchString(d) {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"invalid layer digest %q: want sha256: followed by 64 lowercase hex digits", d)
	}
	return nil
}

// PutLayer records a layer. Recording the same digest again is a no-op that
// keeps the first record (except that a lazy form is added to a record
// without one); with another size it is FailedPrecondition, since the same
// digest cannot name two contents.
func (s *Store) PutLayer(ctx context.Context, l Layer) error {
	if err := validateDigest(l.Digest); err != nil {
		return err
	}
	if err := l.Lazy.validate(); err != nil {
		return err
	}
	if l.Size < 0 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "layer %s: negative size %d", l.Digest, l.Size)
	}
	if l.CreatedAt.IsZero() {
		l.CreatedAt = s.now()
	}
	op := "put layer " + l.Digest
	key := s.layerKey(l.Digest)
	rec := layerRecord{Version: schemaVersion, Digest: l.Digest, Size: l.Size, MediaType: l.MediaType, CreatedAt: l.CreatedAt.UTC(), Lazy: l.Lazy}
	txn, err := s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, encode(rec))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return storeErr(op, err)
	}
	if txn.Succeeded {
		return nil
	}
	kvs := txn.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return errdefs.Newf(errdefs.ErrUnavailable, "%s: the layer was deleted while it was written; retry", op)
	}
	var old layerRecord
	if err := decode(key, kvs[0].Value, &old); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if old.Size != l.Size {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"%s: already recorded with size %d, now %d: the layer store is inconsistent", op, old.Size, l.Size)
	}
	if old.Lazy == nil && l.Lazy != nil {
		old.Lazy = l.Lazy
		_, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision)).
			Then(clientv3.OpPut(key, encode(old))).
			Commit()
		if err != nil {
			return storeErr(op, err)
		}
		// Lost a race: another writer changed the record, keep theirs.
	}
	return nil
}

// GetLayer returns the layer with digest, or NotFound.
func (s *Store) GetLayer(ctx context.Context, digest string) (Layer, error) {
	if err := validateDigest(digest); err != nil {
		return Layer{}, err
	}
	key := s.layerKey(digest)
	resp, err := s.c.Get(ctx, key)
	if err != nil {
		return Layer{}, storeErr("get layer "+digest, err)
	}
	if len(resp.Kvs) == 0 {
		return Layer{}, errdefs.Newf(errdefs.ErrNotFound, "layer %s not found", digest)
	}
	var rec layerRecord
	if err := decode(key, resp.Kvs[0].Value, &rec); err != nil {
		return Layer{}, fmt.Errorf("get layer %s: %w", digest, err)
	}
	return rec.layer(), nil
}

// ListLayers returns every layer, by digest.
func (s *Store) ListLayers(ctx context.Context) ([]Layer, error) {
	return list(ctx, s, "list layers", s.layersPrefix(), func(key string, val []byte) (Layer, error) {
		var rec layerRecord
		err := decode(key, val, &rec)
		return rec.layer(), err
	})
}

// Image is a named, tagged list of layers and how to run it.
type Image struct {
	Name, Tag string
	// Layers are layer digests, lowest first.
	Layers []string
	Config ImageConfig
	// CreatedAt is set by PutImage when zero.
	CreatedAt time.Time
	// Project made the image: only it, or an admin key, deletes or
	// rewrites it. Images recorded before images had owners belong to
	// DefaultProject and are public.
	Project string
	// Public images run for every project; private ones only for their
	// own project (and admin keys).
	Public bool
}

// Ref returns the image's NAME:TAG.
func (i Image) Ref() Ref { return Ref{Name: i.Name, Tag: i.Tag} }

// RunnableBy reports whether p may see and run the image.
func (i Image) RunnableBy(p Principal) bool { return p.Admin || i.Public || i.Project == p.Project }

// WritableBy reports whether p may delete, rewrite or re-tag the image.
func (i Image) WritableBy(p Principal) bool { return p.Admin || i.Project == p.Project }

// sameContent reports whether i and o run the same thing: the same layers
// and config.
func (i Image) sameContent(o Image) bool {
	a, b := i.Config, o.Config
	return slices.Equal(i.Layers, o.Layers) && slices.Equal(a.Env, b.Env) && a.Workdir == b.Workdir &&
		a.User == b.User && slices.Equal(a.Entrypoint, b.Entrypoint) && slices.Equal(a.Cmd, b.Cmd)
}

// Principal is who acts on cluster state: an API key's project, and
// whether the key is an admin key.
type Principal struct {
	Project string
	Admin   bool
}

// ImageConfig is what a sandbox started from an image runs with by default.
type ImageConfig struct {
	// Env holds KEY=VALUE entries.
	Env []string
	// Workdir is an absolute path; empty means "/".
	Workdir string
	// User is a user name or uid[:gid]; empty means root.
	User       string
	Entrypoint []string
	Cmd        []string
}

type imageRecord struct {
	Version    int       `json:"version"`
	Name       string    `json:"name"`
	Tag        string    `json:"tag"`
	Layers     []string  `json:"layers"`
	Env        []string  `json:"env,omitempty"`
	Workdir    string    `json:"workdir,omitempty"`
	User       string    `json:"user,omitempty"`
	Entrypoint []string  `json:"entrypoint,omitempty"`
	Cmd        []string  `json:"cmd,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	// Project is empty only in records written before images had owners:
	// those belong to DefaultProject and are public, so that state dirs
	// of older versions keep running what they ran.
	Project string `json:"project,omitempty"`
	Public  bool   `json:"public,omitempty"`
}

func (r imageRecord) image() Image {
	img := Image{
		Name: r.Name, Tag: r.Tag, Layers: r.Layers, CreatedAt: r.CreatedAt, Project: r.Project, Public: r.Public,
		Config: ImageConfig{Env: r.Env, Workdir: r.Workdir, User: r.User, Entrypoint: r.Entrypoint, Cmd: r.Cmd},
	}
	if img.Project == "" {
		img.Project, img.Public = DefaultProject, true
	}
	return img
}

func recordOf(img Image) imageRecord {
	return imageRecord{
		Version: schemaVersion, Name: img.Name, Tag: img.Tag, Layers: img.Layers,
		Env: img.Config.Env, Workdir: img.Config.Workdir, User: img.Config.User,
		Entrypoint: img.Config.Entrypoint, Cmd: img.Config.Cmd, CreatedAt: img.CreatedAt.UTC(),
		Project: img.Project, Public: img.Public,
	}
}

func validateImage(img Image) error {
	ref := img.Ref()
	if err := ref.validate(); err != nil {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "invalid image reference %.80q: %v", ref, err)
	}
	switch n := len(img.Layers); {
	case n == 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "image %s: no layers", ref)
	case n > MaxImageLayers:
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"image %s: %d layers, at most %d are supported: squash some of them", ref, n, MaxImageLayers)
	}
	seen := make(map[string]bool, len(img.Layers))
	for _, d := range img.Layers {
		if err := validateDigest(d); err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
		if seen[d] {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "image %s: layer %s listed twice", ref, d)
		}
		seen[d] = true
	}
	for _, e := range img.Config.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "image %s: environment entry %.80q is not KEY=VALUE", ref, e)
		}
	}
	if w := img.Config.Workdir; w != "" && !path.IsAbs(w) {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "image %s: workdir %.80q is not an absolute path", ref, w)
	}
	return nil
}

// ImageWrite says who writes an image and how.
type ImageWrite struct {
	// By is the writer. A new image belongs to its project (DefaultProject
	// when empty); an existing one only its project or an admin may write.
	By Principal
	// Force replaces an existing image that has other layers or config;
	// without it that is FailedPrecondition. The same layers and config
	// again are a no-op either way.
	Force bool
	// Public sets the image's visibility; nil makes a new image private
	// and keeps an existing one's.
	Public *bool
}

// PutImage records img, replacing any image of the same NAME:TAG: what
// WriteImage does for an admin with Force. A new image belongs to
// img.Project (DefaultProject when empty); a replaced one keeps its
// project. Either gets img.Public. For tests and tools that seed
// state; the API writes with WriteImage.
func (s *Store) PutImage(ctx context.Context, img Image) error {
	p := img.Project
	if p == "" {
		p = DefaultProject
	}
	_, err := s.WriteImage(ctx, img, ImageWrite{By: Principal{Project: p, Admin: true}, Force: true, Public: &img.Public})
	return err
}

// WriteImage records an image (img's Name, Tag, Layers, Config and
// CreatedAt; its Project and Public come from w) and returns it as stored.
//
// Onto an existing NAME:TAG: a writer that is neither its project nor an
// admin gets PermissionDenied (the name is taken, whoever may see it); the
// same layers and config are a no-op (only w.Public applies); others need
// w.Force, else FailedPrecondition. A replaced image keeps its project.
//
// It writes in one transaction that checks every layer exists and that the
// tag did not change since it was read; a missing layer is
// FailedPrecondition naming its digest, and nothing is written.
func (s *Store) WriteImage(ctx context.Context, img Image, w ImageWrite) (Image, error) {
	if err := validateImage(img); err != nil {
		return Image{}, err
	}
	if img.CreatedAt.IsZero() {
		img.CreatedAt = s.now()
	}
	if w.By.Project == "" {
		w.By.Project = DefaultProject
	}
	ref := img.Ref()
	op := "put image " + ref.String()
	key := s.imageKey(ref)
	defer s.images.forget(ref.String())
	for range 5 {
		resp, err := s.c.Get(ctx, key)
		if err != nil {
			return Image{}, storeErr(op, err)
		}
		next := img
		next.Project, next.Public = w.By.Project, false
		var modRev int64
		if len(resp.Kvs) > 0 {
			var rec imageRecord
			if err := decode(key, resp.Kvs[0].Value, &rec); err != nil {
				return Image{}, fmt.Errorf("%s: %w", op, err)
			}
			old := rec.image()
			if err := CheckWritable(old, w.By); err != nil {
				return Image{}, err
			}
			modRev = resp.Kvs[0].ModRevision
			if old.sameContent(img) {
				if w.Public == nil || *w.Public == old.Public {
					return old, nil
				}
				next = old
			} else {
				if !w.Force {
					return Image{}, errdefs.Newf(errdefs.ErrFailedPrecondition,
						"image %s exists with other layers or config: give --force (API: force) to replace it, or choose another tag", ref)
				}
				// The layers the old image named are released (GC keeps
				// them for its grace period, see gc.go).
				if err := s.releaseLayers(ctx, old.Layers); err != nil {
					return Image{}, fmt.Errorf("%s: %w", op, err)
				}
				next.Project, next.Public = old.Project, old.Public
			}
		}
		if w.Public != nil {
			next.Public = *w.Public
		}
		// The layer checks nest inside the tag's check: etcd bounds the
		// compares of each (sub)transaction, not of the whole.
		cmps := make([]clientv3.Cmp, len(next.Layers))
		gets := make([]clientv3.Op, len(next.Layers))
		for i, d := range next.Layers {
			cmps[i] = clientv3.Compare(clientv3.CreateRevision(s.layerKey(d)), ">", 0)
			gets[i] = clientv3.OpGet(s.layerKey(d), clientv3.WithCountOnly())
		}
		txn, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpTxn(cmps, []clientv3.Op{clientv3.OpPut(key, encode(recordOf(next)))}, gets)).
			Commit()
		if err != nil {
			return Image{}, storeErr(op, err)
		}
		if txn.Succeeded {
			inner := txn.Responses[0].GetResponseTxn()
			if inner.GetSucceeded() {
				return recordOf(next).image(), nil
			}
			for i, r := range inner.GetResponses() {
				if r.GetResponseRange().GetCount() == 0 {
					return Image{}, errdefs.Newf(errdefs.ErrFailedPrecondition,
						"%s: layer %s not found: push or build the layer before the image that uses it", op, next.Layers[i])
				}
			}
			return Image{}, errdefs.Newf(errdefs.ErrUnavailable, "%s: a layer changed while the image was written; retry", op)
		}
		// The tag changed since it was read: decide again.
	}
	return Image{}, errdefs.Newf(errdefs.ErrUnavailable, "%s: the image keeps changing; retry", op)
}

// CheckWritable returns nil when p may write img, else PermissionDenied,
// naming the owner project only to those who may see the image.
func CheckWritable(img Image, p Principal) error {
	switch {
	case img.WritableBy(p):
		return nil
	case img.RunnableBy(p):
		return errdefs.Newf(errdefs.ErrPermissionDenied,
			"image %s belongs to project %s: only that project or an admin key may change or delete it; use another name", img.Ref(), img.Project)
	default:
		return errdefs.Newf(errdefs.ErrPermissionDenied,
			"image name %s is taken by another project: use another name", img.Ref())
	}
}

// SetImagePublic makes the image ref names public or private, as its
// project or an admin (PermissionDenied for others, NotFound for those who
// may not see it), and returns it.
func (s *Store) SetImagePublic(ctx context.Context, ref Ref, public bool, by Principal) (Image, error) {
	if err := ref.validate(); err != nil {
		return Image{}, errdefs.Newf(errdefs.ErrInvalidArgument, "invalid image reference %.80q: %v", ref, err)
	}
	if by.Project == "" {
		by.Project = DefaultProject
	}
	op := "set image visibility " + ref.String()
	key := s.imageKey(ref)
	defer s.images.forget(ref.String())
	for range 5 {
		resp, err := s.c.Get(ctx, key)
		if err != nil {
			return Image{}, storeErr(op, err)
		}
		if len(resp.Kvs) == 0 {
			return Image{}, imageNotFound(ref)
		}
		var rec imageRecord
		if err := decode(key, resp.Kvs[0].Value, &rec); err != nil {
			return Image{}, fmt.Errorf("%s: %w", op, err)
		}
		img := rec.image()
		if !img.RunnableBy(by) {
			return Image{}, imageNotFound(ref)
		}
		if err := CheckWritable(img, by); err != nil {
			return Image{}, err
		}
		if img.Public == public && rec.Project != "" {
			return img, nil
		}
		img.Public = public
		txn, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(key, encode(recordOf(img)))).
			Commit()
		if err != nil {
			return Image{}, storeErr(op, err)
		}
		if txn.Succeeded {
			return img, nil
		}
	}
	return Image{}, errdefs.Newf(errdefs.ErrUnavailable, "%s: the image keeps changing; retry", op)
}

// GetImage returns the image ref names, or NotFound with a hint.
func (s *Store) GetImage(ctx context.Context, ref Ref) (Image, error) {
	if err := ref.validate(); err != nil {
		return Image{}, errdefs.Newf(errdefs.ErrInvalidArgument, "invalid image reference %.80q: %v", ref, err)
	}
	key := s.imageKey(ref)
	resp, err := s.c.Get(ctx, key)
	if err != nil {
		return Image{}, storeErr("get image "+ref.String(), err)
	}
	if len(resp.Kvs) == 0 {
		return Image{}, imageNotFound(ref)
	}
	var rec imageRecord
	if err := decode(key, resp.Kvs[0].Value, &rec); err != nil {
		return Image{}, fmt.Errorf("get image %s: %w", ref, err)
	}
	return rec.image(), nil
}

func imageNotFound(ref Ref) error {
	return errdefs.Newf(errdefs.ErrNotFound,
		"image %s not found: build it with `dsec image build` or list images with `dsec image ls`", ref)
}

// ListImages returns every image, by name and then tag.
func (s *Store) ListImages(ctx context.Context) ([]Image, error) {
	imgs, err := list(ctx, s, "list images", s.imagesPrefix(), func(key string, val []byte) (Image, error) {
		var rec imageRecord
		err := decode(key, val, &rec)
		return rec.image(), err
	})
	if err != nil {
		return nil, err
	}
	// Keys sort "a-b:x" before "a:x"; users expect "a" first.
	slices.SortFunc(imgs, func(a, b Image) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Tag, b.Tag))
	})
	return imgs, nil
}

// DeleteImage removes the image ref names as by and returns it as it was:
// by must be its project or an admin (PermissionDenied for others, NotFound
// for those who may not see it, as for an image that does not exist). Its
// layers stay, released: GC removes them once unused and the grace period
// is over.
func (s *Store) DeleteImage(ctx context.Context, ref Ref, by Principal) (Image, error) {
	if err := ref.validate(); err != nil {
		return Image{}, errdefs.Newf(errdefs.ErrInvalidArgument, "invalid image reference %.80q: %v", ref, err)
	}
	if by.Project == "" {
		by.Project = DefaultProject
	}
	op := "delete image " + ref.String()
	key := s.imageKey(ref)
	defer s.images.forget(ref.String())
	// Delete the version whose layers were released; a write in between
	// (the tag moved to other layers) makes us release those too.
	for range 5 {
		resp, err := s.c.Get(ctx, key)
		if err != nil {
			return Image{}, storeErr(op, err)
		}
		if len(resp.Kvs) == 0 {
			return Image{}, imageNotFound(ref)
		}
		var rec imageRecord
		if err := decode(key, resp.Kvs[0].Value, &rec); err != nil {
			return Image{}, fmt.Errorf("%s: %w", op, err)
		}
		img := rec.image()
		if !img.RunnableBy(by) {
			return Image{}, imageNotFound(ref)
		}
		if err := CheckWritable(img, by); err != nil {
			return Image{}, err
		}
		if err := s.releaseLayers(ctx, rec.Layers); err != nil {
			return Image{}, fmt.Errorf("%s: %w", op, err)
		}
		txn, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
			Then(clientv3.OpDelete(key)).
			Commit()
		if err != nil {
			return Image{}, storeErr(op, err)
		}
		if txn.Succeeded {
			return img, nil
		}
	}
	return Image{}, errdefs.Newf(errdefs.ErrUnavailable, "%s: the image keeps changing; retry", op)
}
