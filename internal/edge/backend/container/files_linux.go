package container

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"strconv"

	"github.com/dsecproject/dsec/internal/edge/sandbox"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/sandboxfs"
)

// openRoot opens the sandbox's root as its init sees it and makes sure the
// pid still names that init (a reused pid would name another root).
func (b *Backend) openRoot(ctx context.Context, id string) (*sandboxfs.Root, error) {
	info, err := b.keeper.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	if info.State != sandbox.StateRunning || info.Pid <= 0 {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s: its files can no longer be reached", id, info.State)
	}
	root, err := sandboxfs.OpenRoot("/proc/" + strconv.Itoa(info.Pid) + "/root")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	st, err := keeper.ProcStartTime(info.Pid)
	if err != nil || st != info.StartTime {
		root.Close()
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s: its init has ended", id)
	}
	return root, nil
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
	return f, b.fileInfo(info), nil
}

// WriteFile implements sandbox.Backend.
func (b *Backend) WriteFile(ctx context.Context, id, path string, opts sandbox.WriteOptions, r io.Reader) (sandbox.FileInfo, error) {
	uid, ok := b.cfg.IDMap.ToHost(opts.UID)
	gid, ok2 := b.cfg.IDMap.ToHost(opts.GID)
	if !ok || !ok2 {
		return sandbox.FileInfo{}, errdefs.Newf(errdefs.ErrInvalidArgument, "owner %d:%d is outside the sandbox's ids (0-%d)", opts.UID, opts.GID, b.cfg.IDMap.Size-1)
	}
	root, err := b.openRoot(ctx, id)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	defer root.Close()
	info, err := root.WriteFile(path, sandboxfs.WriteOptions{
		Mode: opts.Mode, MakeParents: opts.MakeParents,
		UID: int(uid), GID: int(gid), MaxBytes: b.cfg.MaxFileBytes,
	}, r)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	return b.fileInfo(info), nil
}

func (b *Backend) fileInfo(i sandboxfs.Info) sandbox.FileInfo {
	return sandbox.FileInfo{
		Path: i.Path, Name: i.Name, LinkTarget: i.LinkTarget, Size: i.Size, Mode: i.Mode, ModTime: i.ModTime,
		UID: b.cfg.IDMap.FromHost(i.UID), GID: b.cfg.IDMap.FromHost(i.GID),
	}
}

// withRoot runs fn with the sandbox's root open.
func (b *Backend) withRoot(ctx context.Context, id string, fn func(*sandboxfs.Root) error) error {
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
	err := b.withRoot(ctx, id, func(r *sandboxfs.Root) error {
		info, err := r.Stat(path)
		out = b.fileInfo(info)
		return err
	})
	return out, err
}

// ReadDir implements sandbox.Backend.
func (b *Backend) ReadDir(ctx context.Context, id, path string, limit int) ([]sandbox.FileInfo, bool, error) {
	var out []sandbox.FileInfo
	var truncated bool
	err := b.withRoot(ctx, id, func(r *sandboxfs.Root) error {
		ents, trunc, err := r.ReadDir(path, limit)
		if err != nil {
			return err
		}
		truncated = trunc
		out = make([]sandbox.FileInfo, len(ents))
		for i, e := range ents {
			out[i] = b.fileInfo(e)
		}
		return nil
	})
	return out, truncated, err
}

// hostIDs maps a sandbox owner to host ids.
func (b *Backend) hostIDs(uid, gid uint32) (int, int, error) {
	hu, ok := b.cfg.IDMap.ToHost(uid)
	hg, ok2 := b.cfg.IDMap.ToHost(gid)
	if !ok || !ok2 {
		return 0, 0, errdefs.Newf(errdefs.ErrInvalidArgument, "owner %d:%d is outside the sandbox's ids (0-%d)", uid, gid, b.cfg.IDMap.Size-1)
	}
	return int(hu), int(hg), nil
}

// Mkdir implements sandbox.Backend.
func (b *Backend) Mkdir(ctx context.Context, id, path string, mode fs.FileMode, parents bool, uid, gid uint32) (sandbox.FileInfo, error) {
	hu, hg, err := b.hostIDs(uid, gid)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	var out sandbox.FileInfo
	err = b.withRoot(ctx, id, func(r *sandboxfs.Root) error {
		info, err := r.Mkdir(path, mode, parents, hu, hg)
		out = b.fileInfo(info)
		return err
	})
	return out, err
}

// Remove implements sandbox.Backend.
func (b *Backend) Remove(ctx context.Context, id, path string, recursive bool) error {
	return b.withRoot(ctx, id, func(r *sandboxfs.Root) error { return r.Remove(path, recursive) })
}

// Rename implements sandbox.Backend.
func (b *Backend) Rename(ctx context.Context, id, from, to string, overwrite bool) error {
	return b.withRoot(ctx, id, func(r *sandboxfs.Root) error { return r.Rename(from, to, overwrite) })
}

// DownloadTar implements sandbox.Backend.
func (b *Backend) DownloadTar(ctx context.Context, id, path string, w io.Writer) error {
	return b.withRoot(ctx, id, func(r *sandboxfs.Root) error {
		_, err := r.WriteTar(ctx, path, w, sandboxfs.TarOptions{
			MapID:    func(u, g uint32) (uint32, uint32) { return b.cfg.IDMap.FromHost(u), b.cfg.IDMap.FromHost(g) },
			MaxBytes: b.cfg.MaxTarBytes,
		})
		return err
	})
}

// UploadTar implements sandbox.Backend.
func (b *Backend) UploadTar(ctx context.Context, id, dir string, rd io.Reader, opts sandbox.TarOptions) (sandbox.TarStats, error) {
	hu, hg, err := b.hostIDs(opts.UID, opts.GID)
	if err != nil {
		return sandbox.TarStats{}, err
	}
	var out sandbox.TarStats
	err = b.withRoot(ctx, id, func(r *sandboxfs.Root) error {
		st, err := r.ExtractTar(ctx, dir, rd, sandboxfs.ExtractOptions{
			UID: hu, GID: hg, MakeParents: opts.MakeParents, MaxBytes: b.cfg.MaxTarBytes,
			SpoolDir: b.keeper.SandboxDir(id),
		})
		out = sandbox.TarStats{Files: st.Files, Dirs: st.Dirs, Links: st.Links, Bytes: st.Bytes, Skipped: st.Skipped}
		return err
	})
	return out, err
}
