// Package ociimport turns container images (from an OCI registry, an OCI
// image layout directory or a `docker save` archive) into dsec images: each
// tar layer becomes one EROFS layer (internal/layer, OCI whiteouts
// converted to overlayfs's), stored through a Store, and the image config
// becomes the dsec image's run config.
//
// Invariants:
//   - Every byte read from the source is checked before anything is
//     stored: the manifest's digest of each compressed blob and of the
//     config, and the config's diff_id of each uncompressed layer. All
//     layers are converted and checked first; only then are they uploaded
//     and the image registered, so a bad layer (corrupt, truncated, of an
//     unknown media type, with a path leaving the root) registers nothing.
//   - Layers the store already has (Store.HasLayer) are not uploaded again.
//   - Temporary files (one EROFS image per layer, the layer builder's spool)
//     live in Options.TempDir and are removed before Import returns.
package ociimport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Store keeps layers and registers images: the dsec API, in the CLI.
type Store interface {
	// HasLayer reports whether the store holds the EROFS layer of digest.
	HasLayer(ctx context.Context, digest string) (bool, error)
	// UploadLayer stores the EROFS layer r yields, of digest and size.
	UploadLayer(ctx context.Context, r io.Reader, digest string, size int64) error
	// CreateImage registers name as layers (EROFS digests, lowest first)
	// run as cfg says.
	CreateImage(ctx context.Context, name string, layers []string, cfg Config) error
}

// Config is how to run an imported image, taken from the image config.
type Config struct {
	// Env holds K=V entries, PATH among them when the image sets one.
	Env        []string
	Workdir    string
	User       string
	Entrypoint []string
	Cmd        []string
}

// Options tune an import. The zero value works.
type Options struct {
	// Platform picks the image from an index (multi-platform image).
	// Empty means linux/amd64.
	Platform string
	// Keychain finds registry credentials; nil means authn.DefaultKeychain
	// (~/.docker/config.json and credential helpers). Auth, when set, is
	// used instead.
	Keychain authn.Keychain
	Auth     authn.Authenticator
	// Insecure allows plain HTTP (and unverified TLS) to the registry.
	// Loopback and private addresses use plain HTTP anyway.
	Insecure bool
	// Transport carries registry requests; nil means http.DefaultTransport.
	Transport http.RoundTripper
	// TempDir holds the converted layers until they are uploaded; empty
	// means os.TempDir(). It needs room for the EROFS images of all layers
	// plus the file data of the largest one.
	TempDir string
	// MaxLayerSize, when positive, bounds one layer's file data (a
	// decompression bomb stops there).
	MaxLayerSize int64
	// Progress, when set, is called from Import's goroutine as work
	// advances.
	Progress func(Event)
	// Log receives debug records; nil discards them.
	Log *slog.Logger
}

// Phase is what an Event reports.
type Phase int

const (
	// PhaseConvert: Done of Total compressed bytes of the layer read
	// (Total is 0 when the source does not say) and converted.
	PhaseConvert Phase = iota
	// PhaseConverted: the layer is converted (Layer.Digest etc. set).
	PhaseConverted
	// PhaseUpload: Done of Total bytes of the EROFS layer sent.
	PhaseUpload
	// PhaseStored: the layer is in the store (Layer.Uploaded says whether
	// this import sent it).
	PhaseStored
)

// Event is a step of an import.
type Event struct {
	Phase Phase
	// Index is the layer's position, 0 for the lowest; Count the number
	// of layers.
	Index, Count int
	Done, Total  int64
	Layer        LayerResult
}

// LayerResult describes one converted layer.
type LayerResult struct {
	// Source is the digest of the compressed blob in the source; DiffID
	// the digest of the uncompressed tar; MediaType the source's.
	Source, DiffID, MediaType string
	// Digest and Size are those of the EROFS layer.
	Digest string
	Size   int64
	// Files and Skipped as in layer.Info (Skipped: device nodes, sockets
	// and aufs metadata left out).
	Files, Skipped int
	// Uploaded is false for a layer the store already had.
	Uploaded bool
}

// Result describes an import.
type Result struct {
	Name     string
	Platform string
	// Layers are lowest first.
	Layers []LayerResult
	Config Config
}

// Import converts the image src names and registers it in store as name
// (NAME[:TAG], which the caller has validated).
func Import(ctx context.Context, src Source, name string, store Store, opts Options) (*Result, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	img, err := src.open(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer img.close()

	cfg, err := verifiedConfig(img.img)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	m, err := img.img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("%s: read manifest: %w", src, err)
	}
	var diffIDs []v1.Hash
	if len(cfg.RootFS.DiffIDs) == len(m.Layers) {
		diffIDs = cfg.RootFS.DiffIDs
	} else if len(cfg.RootFS.DiffIDs) > 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: the manifest has %d layers but the config lists %d diff_ids: the image is malformed", src, len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	if len(m.Layers) == 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: the image has no layers", src)
	}
	for i, d := range m.Layers {
		if !supported(d.MediaType) {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: layer %d of %d (%s) has media type %q, which is not a tar layer dsec can import (supported: %s)",
				src, i+1, len(m.Layers), d.Digest, d.MediaType, supportedList())
		}
	}

	// Convert and check every layer before storing any.
	res := &Result{Name: name, Platform: img.platform, Config: runConfig(cfg)}
	files := make([]*os.File, 0, len(m.Layers))
	defer func() {
		for _, f := range files {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	for i, d := range m.Layers {
		f, err := os.CreateTemp(opts.TempDir, ".dsec-import-*.erofs")
		if err != nil {
			return nil, fmt.Errorf("create temporary layer: %w", err)
		}
		files = append(files, f)
		var want v1.Hash
		if diffIDs != nil {
			want = diffIDs[i]
		}
		lr, err := convert(ctx, img.img, d, want, f, i, len(m.Layers), opts)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %d of %d (%s): %w", src, i+1, len(m.Layers), d.Digest, err)
		}
		res.Layers = append(res.Layers, lr)
		opts.progress(Event{Phase: PhaseConverted, Index: i, Count: len(m.Layers), Layer: lr})
	}

	digests := make([]string, 0, len(res.Layers))
	for i := range res.Layers {
		lr := &res.Layers[i]
		digests = append(digests, lr.Digest)
		if slices.Contains(digests[:i], lr.Digest) {
			opts.progress(Event{Phase: PhaseStored, Index: i, Count: len(res.Layers), Layer: *lr})
			continue
		}
		has, err := store.HasLayer(ctx, lr.Digest)
		if err != nil {
			return nil, fmt.Errorf("look up layer %s: %w", lr.Digest, err)
		}
		if !has {
			if _, err := files[i].Seek(0, io.SeekStart); err != nil {
				return nil, err
			}
			r := &countReader{r: files[i], report: func(n int64) {
				opts.progress(Event{Phase: PhaseUpload, Index: i, Count: len(res.Layers), Done: n, Total: lr.Size, Layer: *lr})
			}}
			if err := store.UploadLayer(ctx, r, lr.Digest, lr.Size); err != nil {
				return nil, fmt.Errorf("upload layer %d of %d: %w", i+1, len(res.Layers), err)
			}
			lr.Uploaded = true
		}
		opts.progress(Event{Phase: PhaseStored, Index: i, Count: len(res.Layers), Layer: *lr})
	}
	if err := store.CreateImage(ctx, name, digests, res.Config); err != nil {
		return nil, fmt.Errorf("register image %s: %w", name, err)
	}
	return res, nil
}

func (o *Options) progress(e Event) {
	if o.Progress != nil {
		o.Progress(e)
	}
}

// verifiedConfig reads the image config and checks it against the
// manifest's digest.
func verifiedConfig(img v1.Image) (*v1.ConfigFile, error) {
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read image config: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	got, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if m.Config.Digest != (v1.Hash{}) && got != m.Config.Digest {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "image config has digest %s, the manifest says %s: the image is corrupt or was tampered with", got, m.Config.Digest)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "parse image config: %v", err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "the image is for %s; dsec runs linux images: pick one with --platform", cfg.OS)
	}
	return cfg, nil
}

// runConfig maps the image config to dsec's.
func runConfig(cfg *v1.ConfigFile) Config {
	c := cfg.Config
	return Config{
		Env:        slices.Clone(c.Env),
		Workdir:    c.WorkingDir,
		User:       c.User,
		Entrypoint: slices.Clone(c.Entrypoint),
		Cmd:        slices.Clone(c.Cmd),
	}
}

// countReader reports the bytes read through it, at most every 4 MiB and
// at the end.
type countReader struct {
	r        io.Reader
	n, last  int64
	report   func(int64)
	finished bool
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.report != nil && (c.n-c.last >= 4<<20 || errors.Is(err, io.EOF) && !c.finished) {
		c.last = c.n
		c.finished = errors.Is(err, io.EOF)
		c.report(c.n)
	}
	return n, err
}
