package edge

import (
	"context"
	"errors"
	"io"
	"io/fs"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// ReadFile streams a file of a sandbox: send gets the file's info with the
// first chunk (which may be empty), then the data from offset, at most
// limit bytes (0: to the end). A paused sandbox is resumed first; the
// file of one that exited can still be read.
func (e *Edge) ReadFile(ctx context.Context, caller Caller, id, path string, offset, limit int64, send func(*sandbox.FileInfo, []byte) error) error {
	if offset < 0 || limit < 0 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "offset and limit must not be negative")
	}
	be, _, opened, err := e.readyBackend(ctx, caller, id)
	if err != nil {
		return err
	}
	defer opened()
	e.touch(id)
	rc, info, err := be.ReadFile(ctx, id, path)
	opened() // what is open is read from the host's side
	if err != nil {
		return err
	}
	defer rc.Close()
	var src io.Reader = rc
	if offset > 0 {
		ra, ok := rc.(io.ReaderAt)
		if !ok {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "this backend cannot read from an offset")
		}
		src = &offsetReader{ra: ra, off: offset}
	}
	if limit > 0 {
		src = io.LimitReader(src, limit)
	}
	buf := make([]byte, chunkSize)
	first := true
	for {
		n, rerr := io.ReadFull(src, buf)
		if n > 0 || first {
			var ip *sandbox.FileInfo
			if first {
				ip = &info
				first = false
			}
			if err := send(ip, buf[:n]); err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// WriteParams is a file write request's header.
type WriteParams struct {
	Sandbox     string
	Path        string
	Mode        fs.FileMode
	MakeParents bool
	User        string
}

// WriteFile writes a file into a sandbox from r, resuming a paused one
// first.
func (e *Edge) WriteFile(ctx context.Context, caller Caller, p WriteParams, r io.Reader) (sandbox.FileInfo, error) {
	rec, done, err := e.ready(ctx, caller, p.Sandbox)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	defer done()
	if !rec.active() {
		return sandbox.FileInfo{}, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s: its files can no longer be written", rec.ID, rec.State)
	}
	if p.Mode&^(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
		return sandbox.FileInfo{}, errdefs.Newf(errdefs.ErrInvalidArgument, "file mode %v: only permission bits", p.Mode)
	}
	be, err := e.backend(rec.Backend)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	e.touch(p.Sandbox)
	opts := sandbox.WriteOptions{Mode: p.Mode, MakeParents: p.MakeParents}
	if p.User != "" {
		id, err := resolveUser(ctx, p.User, sandboxFiles(be, rec.ID))
		if err != nil {
			return sandbox.FileInfo{}, err
		}
		opts.UID, opts.GID = id.UID, id.GID
	}
	return be.WriteFile(ctx, p.Sandbox, p.Path, opts, r)
}

// offsetReader reads an io.ReaderAt from an offset on.
type offsetReader struct {
	ra  io.ReaderAt
	off int64
}

func (r *offsetReader) Read(p []byte) (int, error) {
	n, err := r.ra.ReadAt(p, r.off)
	r.off += int64(n)
	if n > 0 && errors.Is(err, io.EOF) {
		err = nil
	}
	return n, err
}

// sandboxFiles reads small files (such as /etc/passwd) of a sandbox.
func sandboxFiles(be sandbox.Backend, id string) fileReader {
	return func(ctx context.Context, path string) ([]byte, error) {
		rc, _, err := be.ReadFile(ctx, id, path)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return io.ReadAll(io.LimitReader(rc, 4<<20))
	}
}

// fileBackend returns the backend of a running sandbox caller may see,
// resuming a paused one first; done ends the file operation (no pause
// stops the sandbox until then).
func (e *Edge) fileBackend(ctx context.Context, caller Caller, id string) (sandbox.Backend, *Record, func(), error) {
	be, r, done, err := e.readyBackend(ctx, caller, id)
	if err != nil {
		return nil, nil, nil, err
	}
	if !r.active() {
		done()
		return nil, nil, nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s: its files can no longer be reached", r.ID, r.State)
	}
	e.touch(id)
	return be, r, done, nil
}

// Stat describes a file.
func (e *Edge) Stat(ctx context.Context, caller Caller, id, path string) (sandbox.FileInfo, error) {
	be, _, done, err := e.fileBackend(ctx, caller, id)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	defer done()
	return be.Stat(ctx, id, path)
}

// maxListEntries bounds one ListDir.
const maxListEntries = 10000

// ListDir lists a directory.
func (e *Edge) ListDir(ctx context.Context, caller Caller, id, path string, limit int) ([]sandbox.FileInfo, bool, error) {
	be, _, done, err := e.fileBackend(ctx, caller, id)
	if err != nil {
		return nil, false, err
	}
	defer done()
	if limit <= 0 || limit > maxListEntries {
		limit = maxListEntries
	}
	return be.ReadDir(ctx, id, path, limit)
}

// MakeDir makes a directory owned by user (default root).
func (e *Edge) MakeDir(ctx context.Context, caller Caller, id, path string, mode fs.FileMode, parents bool, user string) (sandbox.FileInfo, error) {
	be, r, done, err := e.fileBackend(ctx, caller, id)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	defer done()
	if mode == 0 {
		mode = 0o755
	}
	var uid, gid uint32
	if user != "" {
		ident, err := resolveUser(ctx, user, sandboxFiles(be, r.ID))
		if err != nil {
			return sandbox.FileInfo{}, err
		}
		uid, gid = ident.UID, ident.GID
	}
	return be.Mkdir(ctx, id, path, mode, parents, uid, gid)
}

// Remove removes a file or, with recursive, a tree.
func (e *Edge) Remove(ctx context.Context, caller Caller, id, path string, recursive bool) error {
	be, _, done, err := e.fileBackend(ctx, caller, id)
	if err != nil {
		return err
	}
	defer done()
	return be.Remove(ctx, id, path, recursive)
}

// Rename renames a file or directory.
func (e *Edge) Rename(ctx context.Context, caller Caller, id, from, to string, overwrite bool) error {
	be, _, done, err := e.fileBackend(ctx, caller, id)
	if err != nil {
		return err
	}
	defer done()
	return be.Rename(ctx, id, from, to, overwrite)
}

// DownloadTar writes the tree at path as a tar archive to w.
func (e *Edge) DownloadTar(ctx context.Context, caller Caller, id, path string, w io.Writer) error {
	be, _, done, err := e.fileBackend(ctx, caller, id)
	if err != nil {
		return err
	}
	defer done()
	return be.DownloadTar(ctx, id, path, w)
}

// UploadTar extracts a tar archive into dir, owned by user (default root).
func (e *Edge) UploadTar(ctx context.Context, caller Caller, id, dir string, makeParents bool, user string, r io.Reader) (sandbox.TarStats, error) {
	be, rec, done, err := e.fileBackend(ctx, caller, id)
	if err != nil {
		return sandbox.TarStats{}, err
	}
	defer done()
	opts := sandbox.TarOptions{MakeParents: makeParents}
	if user != "" {
		ident, err := resolveUser(ctx, user, sandboxFiles(be, rec.ID))
		if err != nil {
			return sandbox.TarStats{}, err
		}
		opts.UID, opts.GID = ident.UID, ident.GID
	}
	return be.UploadTar(ctx, id, dir, r, opts)
}
