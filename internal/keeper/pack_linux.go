package keeper

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/layer"
)

// packRoutes adds the pack endpoint: POST /v1/sandbox/pack with a
// PackRequest; the reply's body is the layer, its headers say its digest,
// names and how long the sandbox was frozen.
func (k *Keeper) packRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandbox/pack", func(w http.ResponseWriter, r *http.Request) {
		var req PackRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		if k.ct == nil {
			reply(w, nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "this node keeper has no driver that packs sandboxes"))
			return
		}
		f, info, frozen, err := k.ct.pack(r.Context(), req)
		if err != nil {
			reply(w, nil, err)
			return
		}
		defer f.Close()
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.FormatInt(info.Size, 10))
		h.Set(headerPackDigest, info.Digest)
		h.Set(headerPackFiles, strconv.Itoa(info.Files))
		h.Set(headerPackFrozen, strconv.FormatInt(int64(frozen), 10))
		if _, err := io.Copy(w, f); err != nil {
			k.log.Warn("send packed layer", "sandbox", req.Sandbox, "err", err)
		}
	})
}

// beginPack marks id as being packed, or fails when it is already.
func (c *containerDriver) beginPack(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.packing[id] {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s is being packed by another call: wait for it to end, then pack again", id)
	}
	if other := c.sealing[id]; other != "" {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s runs sealed exec %s: wait for it to end, then pack it", id, other)
	}
	if c.packing == nil {
		c.packing = map[string]bool{}
	}
	c.packing[id] = true
	return nil
}

func (c *containerDriver) endPack(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.packing, id)
}

// pack freezes the sandbox, builds a layer of its writable layer into an
// unlinked temporary file and thaws it. The file is returned open at its
// start; nothing of it is left on disk on any path.
func (c *containerDriver) pack(ctx context.Context, req PackRequest) (_ *os.File, _ layer.Info, frozen time.Duration, err error) {
	if err := validID(req.Sandbox); err != nil {
		return nil, layer.Info{}, 0, err
	}
	if _, err := layer.CleanScrub(req.Scrub); err != nil {
		return nil, layer.Info{}, 0, err
	}
	b, err := c.k.lookup(req.Sandbox)
	if err != nil {
		return nil, layer.Info{}, 0, err
	}
	if err := c.beginPack(req.Sandbox); err != nil {
		return nil, layer.Info{}, 0, err
	}
	defer c.endPack(req.Sandbox)
	if err := packable(b); err != nil {
		return nil, layer.Info{}, 0, err
	}
	// Delete, create and exec starts wait for the pack; checked again
	// since a delete may have begun while we waited.
	b.op.Lock()
	defer b.op.Unlock()
	if err := packable(b); err != nil {
		return nil, layer.Info{}, 0, err
	}
	tm := newPhases("pack")
	defer func() { c.log.Debug("pack phases", "sandbox", req.Sandbox, "ms", tm.String()) }()
	info := b.snapshot()
	upper := boxPaths{dir: b.dir(c.l)}.upper()
	if c.disk != nil && info.Disk != "" {
		release, err := c.disk.Reach(info.Disk)
		if err != nil {
			return nil, layer.Info{}, 0, fmt.Errorf("reach the writable layer of sandbox %s: %w", req.Sandbox, err)
		}
		defer func() {
			if rerr := release(); rerr != nil {
				c.log.Warn("detach the writable layer again", "sandbox", req.Sandbox, "err", rerr)
			}
			tm.mark("detach")
		}()
		upper = c.disk.Dir(info.Disk).Upper
	}
	tm.mark("reach")

	tmp, err := os.CreateTemp(c.l.RunDir(), "pack-*.erofs")
	if err != nil {
		return nil, layer.Info{}, 0, fmt.Errorf("pack: %w", err)
	}
	// Unlinked at once: the open file is all there is, and it goes with
	// its last descriptor, whatever happens next.
	if err := os.Remove(tmp.Name()); err != nil {
		tmp.Close()
		return nil, layer.Info{}, 0, fmt.Errorf("pack: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
		}
	}()

	slot := info.slot()
	if err := c.cg.Freeze(ctx, slot); err != nil {
		return nil, layer.Info{}, 0, fmt.Errorf("freeze sandbox %s: %w", req.Sandbox, err)
	}
	tm.mark("freeze")
	t0 := time.Now()
	var thawOnce sync.Once
	thaw := func() {
		thawOnce.Do(func() {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if terr := c.cg.Thaw(tctx, slot); terr != nil {
				c.log.Error("thaw sandbox after pack", "sandbox", req.Sandbox, "err", terr)
				if err == nil {
					err = fmt.Errorf("thaw sandbox %s: %w", req.Sandbox, terr)
				}
			}
			frozen = time.Since(t0)
		})
	}
	defer thaw()
	li, err := layer.BuildDiff(ctx, upper, tmp, layer.Diff{
		HostID: info.IDs(c.cfg.IDMap).HostID, Size: info.IDs(c.cfg.IDMap).Size, Scrub: req.Scrub,
	}, layer.Options{TempDir: c.l.RunDir()})
	tm.mark("build")
	thaw()
	tm.mark("thaw")
	if err != nil {
		return nil, layer.Info{}, 0, fmt.Errorf("pack sandbox %s: %w", req.Sandbox, err)
	}
	if _, err = tmp.Seek(0, io.SeekStart); err != nil {
		return nil, layer.Info{}, 0, fmt.Errorf("pack: %w", err)
	}
	return tmp, li, frozen, nil
}

// packable says why b cannot be packed now, if it cannot.
func packable(b *box) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.deleting:
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s is being deleted: pack a sandbox that runs, before deleting it", b.info.ID)
	case b.info.State != StateRunning:
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s is %s, not running: only a running sandbox's writable layer can be packed", b.info.ID, b.info.State)
	case b.info.Paused:
		return pausedError(b.info.ID)
	}
	return nil
}
