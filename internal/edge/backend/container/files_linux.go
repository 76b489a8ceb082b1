package container

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"strconv"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandboxfs"
)

// box is a sandbox's root, open as its init sees it, and its host ids.
type box struct {
	*sandboxfs.Root
	ids rootfs.IDMap
}

// openRoot opens the sandbox's root as its init sees it and makes sure the
// pid still names that init (a reused pid would name another root), in
// the mount namespace it was started in (an init an agent moved elsewhere
// would show the agent's view, not the sandbox's).
func (b *Backend) openRoot(ctx context.Context, id string) (box, error) {
	info, err := b.keeper.Status(ctx, id)
	if err != nil {
		return box{}, err
	}
	if info.State != keeper.StateRunning || info.Pid <= 0 {
		return box{}, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s: its files can no longer be reached", id, info.State)
	}
	root, err := sandboxfs.OpenRoot("/proc/" + strconv.Itoa(info.Pid) + "/root")
	if err != nil {
		return box{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	st, err := keeper.ProcStartTime(info.Pid)
	if err != nil || st != info.StartTime {
		root.Close()
		return box{}, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s: its init has ended", id)
	}
	if err := keeper.CheckNamespaces(info.Pid, info.NS); err != nil {
		root.Close()
		return box{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return box{Root: root, ids: info.IDs(b.cfg.IDMap)}, nil
}

// ReadFile implements sandbox.Backend.
func (b *Backend) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, sandbox.FileInfo, error) {
	root, err := b.openRoot(ctx, id)
	if err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	defer root.Close()
	f, info, err := root.OpenRead(path)
	if err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	return f, root.fileInfo(info), nil
}

// WriteFile implements sandbox.Backend.
func (b *Backend) WriteFile(ctx context.Context, id, path string, opts sandbox.WriteOptions, r io.Reader) (sandbox.FileInfo, error) {
	root, err := b.openRoot(ctx, id)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	defer root.Close()
	uid, gid, err := root.hostIDs(opts.UID, opts.GID)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	info, err := root.WriteFile(path, sandboxfs.WriteOptions{
		Mode: opts.Mode, MakeParents: opts.MakeParents,
		UID: uid, GID: gid, MaxBytes: b.cfg.MaxFileBytes,
	}, r)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	return root.fileInfo(info), nil
}

func (x box) fileInfo(i sandboxfs.Info) sandbox.FileInfo {
	return sandbox.FileInfo{
		Path: i.Path, Name: i.Name, LinkTarget: i.LinkTarget, Size: i.Size, Mode: i.Mode, ModTime: i.ModTime,
		UID: x.ids.FromHost(i.UID), GID: x.ids.FromHost(i.GID),
	}
}

// withRoot runs fn with the sandbox's root open.
func (b *Backend) withRoot(ctx context.Context, id string, fn func(box) error) error {
	root, err := b.openRoot(ctx, id)
	if err != nil {
		return err
	}
	defer root.Close()
	return fn(root)
}

// Stat implements sandbox.Backend.
func (b *Backend) Stat(ctx context.Context, id, path string) (sandbox.FileInfo, error) {
	var out sandbox.FileInfo
	err := b.withRoot(ctx, id, func(r box) error {
		info, err := r.Stat(path)
		out = r.fileInfo(info)
		return err
	})
	return out, err
}

// ReadDir implements sandbox.Backend.
func (b *Backend) ReadDir(ctx context.Context, id, path string, limit int) ([]sandbox.FileInfo, bool, error) {
	var out []sandbox.FileInfo
	var truncated bool
	err := b.withRoot(ctx, id, func(r box) error {
		ents, trunc, err := r.ReadDir(path, limit)
		if err != nil {
			return err
		}
		truncated = trunc
		out = make([]sandbox.FileInfo, len(ents))
		for i, e := range ents {
			out[i] = r.fileInfo(e)
		}
		return nil
	})
	return out, truncated, err
}

// hostIDs maps a sandbox owner to host ids.
func (x box) hostIDs(uid, gid uint32) (int, int, error) {
	hu, ok := x.ids.ToHost(uid)
	hg, ok2 := x.ids.ToHost(gid)
	if !ok || !ok2 {
		return 0, 0, errdefs.Newf(errdefs.ErrInvalidArgument, "owner %d:%d is outside the sandbox's ids (0-%d)", uid, gid, x.ids.Size-1)
	}
	return int(hu), int(hg), nil
}

// Mkdir implements sandbox.Backend.
func (b *Backend) Mkdir(ctx context.Context, id, path string, mode fs.FileMode, parents bool, uid, gid uint32) (sandbox.FileInfo, error) {
	var out sandbox.FileInfo
	err := b.withRoot(ctx, id, func(r box) error {
		hu, hg, err := r.hostIDs(uid, gid)
		if err != nil {
			return err
		}
		info, err := r.Mkdir(path, mode, parents, hu, hg)
		out = r.fileInfo(info)
		return err
	})
	return out, err
}

// Remove implements sandbox.Backend.
func (b *Backend) Remove(ctx context.Context, id, path string, recursive bool) error {
	return b.withRoot(ctx, id, func(r box) error { return r.Remove(path, recursive) })
}

// Rename implements sandbox.Backend.
func (b *Backend) Rename(ctx context.Context, id, from, to string, overwrite bool) error {
	return b.withRoot(ctx, id, func(r box) error { return r.Rename(from, to, overwrite) })
}

// DownloadTar implements sandbox.Backend.
func (b *Backend) DownloadTar(ctx context.Context, id, path string, w io.Writer) error {
	return b.withRoot(ctx, id, func(r box) error {
		_, err := r.WriteTar(ctx, path, w, sandboxfs.TarOptions{
			MapID:    func(u, g uint32) (uint32, uint32) { return r.ids.FromHost(u), r.ids.FromHost(g) },
			MaxBytes: b.cfg.MaxTarBytes,
		})
		return err
	})
}

// DownloadTarStats is DownloadTar that also says what the archive left
// out (TarStats.Skipped: devices, sockets, files on kernel file systems),
// with the file data bounded by maxBytes (0: the backend's bound); a grade
// refuses what it cannot copy rather than copying less.
func (b *Backend) DownloadTarStats(ctx context.Context, id, path string, w io.Writer, maxBytes int64) (sandbox.TarStats, error) {
	if maxBytes <= 0 || b.cfg.MaxTarBytes > 0 && maxBytes > b.cfg.MaxTarBytes {
		maxBytes = b.cfg.MaxTarBytes
	}
	var out sandbox.TarStats
	err := b.withRoot(ctx, id, func(r box) error {
		st, err := r.WriteTar(ctx, path, w, sandboxfs.TarOptions{
			MapID:    func(u, g uint32) (uint32, uint32) { return r.ids.FromHost(u), r.ids.FromHost(g) },
			MaxBytes: maxBytes,
		})
		out = sandbox.TarStats{Files: st.Files, Dirs: st.Dirs, Links: st.Links, Bytes: st.Bytes, Skipped: st.Skipped}
		return err
	})
	return out, err
}

// UploadTar implements sandbox.Backend.
func (b *Backend) UploadTar(ctx context.Context, id, dir string, rd io.Reader, opts sandbox.TarOptions) (sandbox.TarStats, error) {
	return b.uploadTar(ctx, id, dir, rd, opts, false)
}

// UploadTarLinks is UploadTar that keeps symbolic links whatever their
// targets (sandboxfs.ExtractOptions.LinksAnywhere), for a copy between
// sandboxes.
func (b *Backend) UploadTarLinks(ctx context.Context, id, dir string, rd io.Reader, opts sandbox.TarOptions) (sandbox.TarStats, error) {
	return b.uploadTar(ctx, id, dir, rd, opts, true)
}

func (b *Backend) uploadTar(ctx context.Context, id, dir string, rd io.Reader, opts sandbox.TarOptions, linksAnywhere bool) (sandbox.TarStats, error) {
	var out sandbox.TarStats
	err := b.withRoot(ctx, id, func(r box) error {
		hu, hg, err := r.hostIDs(opts.UID, opts.GID)
		if err != nil {
			return err
		}
		st, err := r.ExtractTar(ctx, dir, rd, sandboxfs.ExtractOptions{
			UID: hu, GID: hg, MakeParents: opts.MakeParents, MaxBytes: b.cfg.MaxTarBytes,
			SpoolDir: b.keeper.SandboxDir(id), LinksAnywhere: linksAnywhere,
		})
		out = sandbox.TarStats{Files: st.Files, Dirs: st.Dirs, Links: st.Links, Bytes: st.Bytes, Skipped: st.Skipped}
		return err
	})
	return out, err
}
