package container

import (
	"context"
	"fmt"
	"io"
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
		Path: i.Path, Size: i.Size, Mode: i.Mode, ModTime: i.ModTime,
		UID: b.cfg.IDMap.FromHost(i.UID), GID: b.cfg.IDMap.FromHost(i.GID),
	}
}
