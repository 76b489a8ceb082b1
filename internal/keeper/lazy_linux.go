package keeper

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/dsecproject/dsec/internal/blobsource"
	"github.com/dsecproject/dsec/internal/chunkcache"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazyfs"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// lazyLayers mounts layers from their lazy form: the metadata image is
// fetched whole from the blob source into metaDir, the data blob is served
// by one lazyfs connection per mounted layer, read through the node's
// chunk cache. The keeper holds the FUSE descriptors, so the connections
// live as long as it does.
type lazyLayers struct {
	src     blobsource.Source
	cache   *chunkcache.Cache
	metaDir string // fetched metadata images, by digest hex
	fuseDir string // FUSE mount points, one per mounted layer
	ctl     string // the keeper's own fusectl mount
	cfg     Config
	log     *slog.Logger
	// failed is called when reading a layer's data failed.
	failed func(digest string, err error)

	mu sync.Mutex // serialises metadata fetches
}

func newLazyLayers(cfg Config, runDir string, log *slog.Logger, failed func(string, error)) (*lazyLayers, error) {
	src, err := blobsource.Open(cfg.BlobSource)
	if err != nil {
		return nil, fmt.Errorf("--blob-source: %w", err)
	}
	z := &lazyLayers{
		src: src, cfg: cfg, log: log, failed: failed,
		metaDir: filepath.Join(cfg.StateDir, "lazy-meta"),
		fuseDir: filepath.Join(runDir, "lazy"),
		ctl:     filepath.Join(runDir, "fusectl"),
	}
	// Mounts an earlier keeper left: their servers died with it.
	if err := lazyfs.Cleanup(z.fuseDir); err != nil {
		return nil, err
	}
	for _, d := range []string{z.metaDir, z.fuseDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("lazy layers: %w", err)
		}
	}
	if err := lazyfs.MountControl(z.ctl); err != nil {
		return nil, err
	}
	z.cache, err = chunkcache.New(cfg.ChunkCache, src, chunkcache.Options{ChunkSize: cfg.ChunkSize, MaxBytes: cfg.ChunkCacheSize, DirectIO: true})
	if err != nil {
		_ = lazyfs.UnmountControl(z.ctl)
		return nil, fmt.Errorf("chunk cache %s: %w", cfg.ChunkCache, err)
	}
	log.Info("lazy layers on", "source", cfg.BlobSource, "cache", cfg.ChunkCache, "cap", cfg.ChunkCacheSize)
	return z, nil
}

// close stops the cache; mounted layers' connections end with the keeper.
func (z *lazyLayers) close() {
	if err := z.cache.Close(); err != nil {
		z.log.Warn("close chunk cache", "err", err)
	}
}

// opener returns what rootfs.Layers calls to mount l the first time.
func (z *lazyLayers) opener(ctx context.Context, l Layer) rootfs.LazyOpener {
	return func() (string, string, io.Closer, error) {
		f := l.Lazy
		if f.ChunkSize != z.cache.ChunkSize() {
			return "", "", nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
				"its chunk digests are for %d-byte chunks, the node's chunk cache uses %d", f.ChunkSize, z.cache.ChunkSize())
		}
		meta, err := z.fetchMeta(ctx, f.Meta)
		if err != nil {
			return "", "", nil, err
		}
		hexPart := strings.TrimPrefix(l.Digest, "sha256:")
		conn, err := lazyfs.Mount(lazyfs.Config{
			Dir: filepath.Join(z.fuseDir, hexPart[:min(16, len(hexPart))]), Size: f.DataSize,
			ReadTimeout: z.cfg.LazyReadTimeout, Fusectl: z.ctl, Logger: z.log,
			OnError: func(err error) { z.failed(l.Digest, err) },
		}, z.cache.Blob(f.Data, f.DataSize, f.ChunkDigests))
		if err != nil {
			return "", "", nil, err
		}
		return meta, conn.Path(), conn, nil
	}
}

// fetchMeta returns the local copy of metadata image digest, fetching and
// checking it first when missing.
func (z *lazyLayers) fetchMeta(ctx context.Context, digest string) (string, error) {
	hexPart, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hexPart) != 64 || strings.ContainsAny(hexPart, "/.") {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "metadata image digest %q", digest)
	}
	p := filepath.Join(z.metaDir, hexPart)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	size, err := z.src.Size(ctx, digest)
	if err != nil {
		return "", fmt.Errorf("fetch metadata image %s: %w", digest, err)
	}
	tmp, err := os.CreateTemp(z.metaDir, ".fetch-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; {
		n, err := z.src.ReadAt(ctx, digest, buf[:min(int64(len(buf)), size-off)], off)
		if n > 0 {
			h.Write(buf[:n])
			if _, werr := tmp.Write(buf[:n]); werr != nil {
				return "", werr
			}
			off += int64(n)
		}
		if err != nil && !(errors.Is(err, io.EOF) && off == size) {
			return "", fmt.Errorf("fetch metadata image %s: %w", digest, err)
		}
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return "", errdefs.Newf(errdefs.ErrUnavailable, "metadata image %s: fetched bytes have digest %s", digest, got)
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return "", err
	}
	return p, nil
}

// lazyFailed reports a failed read of a lazy layer's data as a failure of
// the sandbox whose process read, found by its cgroup; when the read
// cannot be traced to one (the kernel's own read, or an abort of the
// connection), as a failure of every sandbox using the layer. Each sandbox
// is reported once.
func (c *containerDriver) lazyFailed(digest string, err error) {
	slot := ""
	if re, ok := errors.AsType[*lazyfs.ReadError](err); ok && re.Pid != 0 {
		if b, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", re.Pid)); rerr == nil {
			marker := "/" + c.cfg.CgroupParent + "/"
			for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
				if _, rest, ok := strings.Cut(l, marker); ok {
					slot, _, _ = strings.Cut(rest, "/")
				}
			}
		}
	}
	boxes := c.k.allBoxes()
	for _, b := range boxes {
		b.mu.Lock()
		uses := false
		for _, d := range b.ct.layers {
			uses = uses || d == digest
		}
		if slot != "" && b.info.slot() != slot {
			uses = false
		}
		first := uses && !b.ct.layerFailed
		if first {
			b.ct.layerFailed = true
		}
		id := b.info.ID
		b.mu.Unlock()
		if first {
			c.log.Warn("lazy layer read failed", "sandbox", id, "layer", digest, "err", err)
			c.k.events.add(id, EventFailed, fmt.Sprintf("layer %s: its data could not be read from the blob source (%v)", digest, err))
		}
	}
}
