package sandboxfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/api/sparse"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// WriteTar writes the file or directory tree at p to w as a PAX tar
// archive, named relative to p's parent (so /work gives work/, work/a, …;
// "/" gives ./, ./etc, …). Symlinks in p's parent path are followed inside
// the sandbox; p itself and everything under it are not: the walk goes
// from descriptor to descriptor (openat with O_NOFOLLOW), never by path.
//
// The archive holds directories, regular files, symbolic links (targets as
// they are), fifos and hard links (an inode's data once, its later names as
// hard link entries), with modes, modification times and owners mapped
// through opts.MapID. A file with holes (SEEK_DATA/SEEK_HOLE) is a PAX GNU
// sparse 1.0 entry that carries only its data (internal/sparse), so a 20 GiB
// file made with truncate costs the archive next to nothing. Left out and counted in TarStats.Skipped: device
// nodes and sockets, anything on a kernel file system (a sandbox's /proc,
// /sys: see the package doc), files held by a lease, and paths longer than
// MaxPathLen. File data past opts.MaxBytes (holes do not count) stops the
// walk with a ResourceExhausted error; so does ctx. On error, what was written to w is
// not a complete archive.
//
// A p that is a device or socket is InvalidArgument; one on a kernel file
// system is PermissionDenied.
func (r *Root) WriteTar(ctx context.Context, p string, w io.Writer, opts TarOptions) (TarStats, error) {
	rel, err := Clean(p)
	if err != nil {
		return TarStats{}, err
	}
	abs := display(rel)
	if opts.MaxBytes < 0 {
		return TarStats{}, errdefs.Newf(errdefs.ErrInvalidArgument, "copy %s: the size limit %d is negative", abs, opts.MaxBytes)
	}
	fd, err := r.resolve(rel, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return TarStats{}, fsError("copy", abs, err)
	}
	defer unix.Close(fd)
	st, err := fstat(fd)
	if err != nil {
		return TarStats{}, fsError("copy", abs, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFSOCK:
		return TarStats{}, errdefs.Newf(errdefs.ErrInvalidArgument,
			"%s in the sandbox is a device or socket; only files, directories, symbolic links and fifos can be copied", abs)
	}
	if err := checkFS(fd, "copy", abs); err != nil {
		return TarStats{}, err
	}
	name := path.Base(abs)
	if rel == "." {
		name = "."
	}
	tw := &tarWriter{ctx: ctx, tw: sparse.NewWriter(w), opts: opts, links: map[fileID]string{}}
	if err := tw.add(fd, &st, name, abs, 0); err != nil {
		return tw.stats, err
	}
	if err := tw.tw.Close(); err != nil {
		return tw.stats, fmt.Errorf("copy %s: write the archive: %w", abs, err)
	}
	return tw.stats, nil
}

// fileID names an inode.
type fileID struct{ dev, ino uint64 }

type tarWriter struct {
	ctx   context.Context
	tw    *sparse.Writer
	opts  TarOptions
	stats TarStats
	links map[fileID]string // inodes with more than one link → first name written
}

// add writes the file at the O_PATH descriptor fd, described by st, as
// name, and what is under it. abs is its sandbox path, for messages.
func (t *tarWriter) add(fd int, st *unix.Stat_t, name, abs string, depth int) error {
	if err := t.ctx.Err(); err != nil {
		return err
	}
	if len(name) >= MaxPathLen || depth > maxWalkDepth {
		t.stats.Skipped++
		return nil
	}
	typ := st.Mode & unix.S_IFMT
	switch typ {
	case unix.S_IFDIR, unix.S_IFREG, unix.S_IFLNK, unix.S_IFIFO:
	default:
		t.stats.Skipped++ // devices, sockets
		return nil
	}
	if m, err := fsMagic(fd); err != nil {
		return fsError("copy", abs, err)
	} else if _, ok := fsAllowed(m); !ok {
		t.stats.Skipped++ // procfs, sysfs, …
		return nil
	}
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		ModTime: time.Unix(st.Mtim.Unix()),
		Format:  tar.FormatPAX,
	}
	uid, gid := st.Uid, st.Gid
	if t.opts.MapID != nil {
		uid, gid = t.opts.MapID(uid, gid)
	}
	hdr.Uid, hdr.Gid = int(uid), int(gid)

	id := fileID{uint64(st.Dev), uint64(st.Ino)}
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		if first, ok := t.links[id]; ok {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			t.stats.Links++
			return t.header(hdr, abs)
		}
	}
	switch typ {
	case unix.S_IFDIR:
		return t.dir(fd, st, hdr, abs, depth)
	case unix.S_IFLNK:
		target, err := readlink(fd, "")
		if err != nil {
			return fsError("copy", abs, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		t.stats.Links++
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
		t.stats.Files++
	case unix.S_IFREG:
		written, err := t.file(fd, st, hdr, abs)
		if err != nil || !written {
			return err
		}
		if st.Nlink > 1 {
			t.links[id] = name
		}
		return nil
	}
	if err := t.header(hdr, abs); err != nil {
		return err
	}
	if st.Nlink > 1 {
		t.links[id] = name
	}
	return nil
}

func (t *tarWriter) header(hdr *tar.Header, abs string) error {
	if err := t.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("copy %s: write the archive: %w", abs, err)
	}
	return nil
}

// dir writes the directory at fd and its entries, in name order.
func (t *tarWriter) dir(fd int, st *unix.Stat_t, hdr *tar.Header, abs string, depth int) error {
	dfd, err := reopenDir(fd, st)
	if err != nil {
		return fsError("copy", abs, err)
	}
	defer unix.Close(dfd)
	names, err := readNames(dfd)
	if err != nil {
		return fsError("copy", abs, err)
	}
	slices.Sort(names)
	hdr.Typeflag = tar.TypeDir
	dirName := hdr.Name
	hdr.Name += "/"
	if err := t.header(hdr, abs); err != nil {
		return err
	}
	t.stats.Dirs++
	for _, n := range names {
		cabs := path.Join(abs, n)
		cfd, err := ignoringEINTR2(func() (int, error) {
			return unix.Openat(dfd, n, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		})
		if err == unix.ENOENT {
			continue // removed meanwhile
		} else if err != nil {
			return fsError("copy", cabs, err)
		}
		cst, err := fstat(cfd)
		if err == nil {
			err = t.add(cfd, &cst, dirName+"/"+n, cabs, depth+1)
		} else {
			err = fsError("copy", cabs, err)
		}
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// file writes the regular file at the O_PATH descriptor fd. It reports
// whether it wrote it (a file held by a lease is skipped).
func (t *tarWriter) file(fd int, st *unix.Stat_t, hdr *tar.Header, abs string) (bool, error) {
	// O_NONBLOCK: a sandbox process holding a write lease makes the open
	// fail at once instead of waiting.
	rfd, err := reopen(fd, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK)
	if err == unix.EWOULDBLOCK {
		t.stats.Skipped++
		return false, nil
	} else if err != nil {
		return false, fsError("copy", abs, err)
	}
	f := os.NewFile(uintptr(rfd), abs)
	defer f.Close()
	if err := unix.SetNonblock(rfd, false); err != nil {
		return false, fsError("copy", abs, err)
	}
	segs, err := sparse.Segments(f, st.Size)
	if err != nil {
		return false, fsError("copy", abs, err)
	}
	data := st.Size
	if sparse.Holey(segs, st.Size) {
		data = 0
		for _, s := range segs {
			data += s.Length
		}
	}
	if t.opts.MaxBytes > 0 && t.stats.Bytes+data > t.opts.MaxBytes {
		return false, errdefs.Newf(errdefs.ErrResourceExhausted,
			"copy: the files to copy hold more than %d bytes, the most one copy may carry (at %s, %d bytes); copy a smaller directory, or large files one by one",
			t.opts.MaxBytes, abs, data)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	if data < st.Size {
		err := t.tw.WriteSparse(t.ctx, hdr, f, segs)
		var fe *sparse.FileError
		switch {
		case err == nil:
		case t.ctx.Err() != nil:
			return false, t.ctx.Err()
		case errors.As(err, &fe):
			return false, fsError("copy", abs, fe.Err)
		default:
			return false, fmt.Errorf("copy %s: write the archive: %w", abs, err)
		}
		t.stats.Files++
		t.stats.Bytes += data
		return true, nil
	}
	if err := t.header(hdr, abs); err != nil {
		return false, err
	}
	// The header promised st.Size bytes: a file that shrinks meanwhile is
	// padded with zeros, one that grows is cut.
	src := &ctxReader{ctx: t.ctx, r: io.NewSectionReader(f, 0, st.Size)} // Segments moved the offset
	n, err := io.Copy(t.tw, src)
	if err == nil && n < st.Size {
		_, err = io.CopyN(t.tw, zeros{}, st.Size-n)
	}
	switch {
	case err == nil:
	case t.ctx.Err() != nil:
		return false, t.ctx.Err()
	case src.err != nil:
		return false, fsError("copy", abs, src.err)
	default:
		return false, fmt.Errorf("copy %s: write the archive: %w", abs, err)
	}
	t.stats.Files++
	t.stats.Bytes += st.Size
	return true, nil
}

// ctxReader reads from r until ctx is done; it remembers r's error.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
	err error
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		c.err = err
		return 0, err
	}
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// ExtractTar unpacks the tar archive r into the directory dest.
//
// The archive is untrusted. It is first spooled to an unlinked file in
// opts.SpoolDir (at most opts.MaxBytes bytes: past it, ResourceExhausted)
// and checked whole as ValidateTar checks it, its files' apparent sizes
// (holes included) adding up to at most opts.MaxSize; a bad archive is
// refused before anything is written. Sparse entries (PAX GNU sparse 1.0,
// and the older formats archive/tar reads) are extracted with their holes,
// as is every run of whole zero blocks of a file. Only then is it extracted, entry by entry:
// each parent directory is looked up from the sandbox's root with
// RESOLVE_IN_ROOT (missing ones are made, 0755), and each file, symlink,
// hard link or fifo is created under a temporary name and renamed over its
// name, so an existing symlink there is replaced, never followed. What is
// created is owned by opts.UID and opts.GID (the archive's owners are
// ignored) and gets the archive's mode, without setuid and setgid, and
// modification time. Existing directories, dest included, are left as they
// are.
//
// An error during extraction (a full disk, a directory in the way, ctx)
// stops it: the entries extracted before stay where they are, and the
// returned TarStats count them.
func (r *Root) ExtractTar(ctx context.Context, dest string, src io.Reader, opts ExtractOptions) (TarStats, error) {
	rel, err := Clean(dest)
	if err != nil {
		return TarStats{}, err
	}
	abs := display(rel)
	switch {
	case opts.MaxBytes < 0:
		return TarStats{}, errdefs.Newf(errdefs.ErrInvalidArgument, "extract into %s: the size limit %d is negative", abs, opts.MaxBytes)
	case opts.MaxEntries < 0:
		return TarStats{}, errdefs.Newf(errdefs.ErrInvalidArgument, "extract into %s: the entry limit %d is negative", abs, opts.MaxEntries)
	case opts.MaxSize < 0:
		return TarStats{}, errdefs.Newf(errdefs.ErrInvalidArgument, "extract into %s: the size limit %d is negative", abs, opts.MaxSize)
	}
	if err := checkOwner("extract into", abs, opts.UID, opts.GID); err != nil {
		return TarStats{}, err
	}
	// Refuse a destination that cannot be used before reading the upload.
	if err := r.checkDest(rel, abs, opts.MakeParents); err != nil {
		return TarStats{}, err
	}
	spool, err := spoolTar(ctx, src, opts.SpoolDir, opts.MaxBytes)
	if err != nil {
		return TarStats{}, err
	}
	defer spool.Close()
	plan, err := checkTar(spool, dest, opts.MaxEntries, opts.MaxSize, opts.LinksAnywhere)
	if err != nil {
		return TarStats{}, fmt.Errorf("the upload into %s is refused and nothing was written: %w", abs, err)
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		return TarStats{}, fmt.Errorf("extract into %s: rewind the spooled archive: %w", abs, err)
	}
	x := &extractor{r: r, ctx: ctx, destRel: rel, opts: opts, made: map[string]bool{}, dirTimes: map[string]time.Time{}}
	err = x.run(plan, tar.NewReader(spool))
	if err == nil {
		err = x.setDirTimes()
	}
	if err != nil {
		return x.stats, fmt.Errorf("extracting into %s stopped after %d entries (they stay in place): %w", abs, x.done, err)
	}
	return x.stats, nil
}

// checkDest refuses a destination that is not a directory on an allowed
// file system, or is missing when it is not to be made.
func (r *Root) checkDest(rel, abs string, makeParents bool) error {
	fd, err := r.resolve(rel, unix.O_PATH|unix.O_DIRECTORY)
	switch {
	case err == unix.ENOENT && makeParents:
		return nil
	case err == unix.ENOENT:
		return newError(errdefs.ErrNotFound, err,
			"extract into %s in the sandbox: the directory does not exist; create it, or ask for parent directories to be made (make_parents)", abs)
	case err == unix.ENOTDIR:
		return newError(errdefs.ErrInvalidArgument, err, "extract into %s in the sandbox: it is not a directory", abs)
	case err != nil:
		return fsError("extract into", abs, err)
	}
	defer unix.Close(fd)
	return checkFS(fd, "extract", abs)
}

// spoolTar copies src to an unlinked file in dir, at most max bytes (0: no
// limit), and returns it rewound.
func spoolTar(ctx context.Context, src io.Reader, dir string, max int64) (*os.File, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, ".dsec-upload-*.tar")
	if err != nil {
		// %w: apierr cuts the host path of the temporary file.
		return nil, fmt.Errorf("spool the upload: %w: %w", errdefs.ErrUnavailable, err)
	}
	os.Remove(f.Name())
	ok := false
	defer func() {
		if !ok {
			f.Close()
		}
	}()
	in := &ctxReader{ctx: ctx, r: src}
	var lr io.Reader = in
	if max > 0 {
		lr = io.LimitReader(in, max+1)
	}
	w := &errWriter{w: f}
	n, err := io.Copy(w, lr)
	switch {
	case w.err != nil:
		return nil, fmt.Errorf("spool the upload: %w: %w", errdefs.ErrUnavailable, w.err)
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		return nil, fmt.Errorf("read the upload: %w", err)
	case max > 0 && n > max:
		return nil, errdefs.Newf(errdefs.ErrResourceExhausted,
			"the upload is larger than the limit of %d bytes and was refused; nothing was written; copy less at a time", max)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("spool the upload: %w", err)
	}
	ok = true
	return f, nil
}

// extractor carries out a checked archive.
type extractor struct {
	r        *Root
	ctx      context.Context
	destRel  string
	opts     ExtractOptions
	stats    TarStats
	done     int                  // entries carried out
	made     map[string]bool      // directories made (sandbox paths, Clean results)
	dirs     []string             // directories made for entries, in order
	dirTimes map[string]time.Time // directory in dirs → its modification time
}

func (x *extractor) run(plan *tarPlan, tr *tar.Reader) error {
	// Make dest (and its parents) if it is missing and may be made.
	fd, err := x.openDir(x.destRel, x.opts.MakeParents)
	if err != nil {
		return err
	}
	unix.Close(fd)
	for i := range plan.entries {
		e := &plan.entries[i]
		hdr, err := tr.Next()
		if err != nil || hdr.Name != e.raw {
			// The spool is ours and unchanged; this does not happen.
			return fmt.Errorf("read the spooled archive again: entry %d differs (%v)", i, err)
		}
		if err := x.ctx.Err(); err != nil {
			return err
		}
		switch e.typ {
		case 0:
			err = nil
		case tar.TypeDir:
			err = x.dir(e)
		case tar.TypeReg:
			err = x.file(e, tr)
		case tar.TypeSymlink:
			err = x.symlink(e)
		case tar.TypeLink:
			err = x.link(e)
		case tar.TypeFifo:
			err = x.fifo(e)
		}
		if err != nil {
			return err
		}
		x.done++
	}
	return nil
}

// full returns the sandbox path (a Clean result) of the entry name.
func (x *extractor) full(name string) string {
	if x.destRel == "." {
		return name
	}
	return x.destRel + "/" + name
}

// parent opens the directory that the sandbox path full is created in,
// making it and its missing parents.
func (x *extractor) parent(full string) (int, error) {
	dir, _ := splitRel(full)
	return x.openDir(dir, true)
}

// openDir opens the directory dir (a Clean result) as O_PATH, making it
// and its missing parents if makeParents, and checks its file system.
func (x *extractor) openDir(dir string, makeParents bool) (int, error) {
	var made []madeDir
	fd, err := x.r.openParent("extract into", dir, display(dir), WriteOptions{UID: x.opts.UID, GID: x.opts.GID, MakeParents: makeParents}, &made)
	for _, m := range made {
		unix.Close(m.parent)
		x.made[m.rel] = true
	}
	x.stats.Dirs += int64(len(made))
	if err != nil {
		return -1, err
	}
	if err := checkFS(fd, "extract", display(dir)); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// dir makes a directory, or leaves an existing one as it is.
func (x *extractor) dir(e *tarEntry) error {
	full := x.full(e.name)
	abs := display(full)
	pfd, err := x.parent(full)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	_, base := splitRel(full)
	fd, m, err := mkdir("extract", pfd, base, abs, WriteOptions{UID: x.opts.UID, GID: x.opts.GID})
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if m != nil {
		x.made[full] = true
		x.stats.Dirs++
	} else if !x.made[full] {
		return nil // there before: left as it is
	}
	if _, ok := x.dirTimes[full]; !ok {
		x.dirs = append(x.dirs, full)
	}
	x.dirTimes[full] = e.mtime
	if err := unix.Fchmodat(unix.AT_FDCWD, procFD(fd), e.mode, 0); err != nil {
		return fsError("extract", abs, err)
	}
	return nil
}

// setDirTimes sets the modification times of the directories made, deepest
// last made first, once nothing more is created in them.
func (x *extractor) setDirTimes() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		full := x.dirs[i]
		fd, err := x.r.resolve(full, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY)
		if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
			continue // the sandbox changed it meanwhile
		} else if err != nil {
			return fsError("extract", display(full), err)
		}
		err = unix.UtimesNanoAt(unix.AT_FDCWD, procFD(fd), times(x.dirTimes[full]), 0)
		unix.Close(fd)
		if err != nil {
			return fsError("extract", display(full), err)
		}
	}
	return nil
}

// times is the timespecs for utimensat that set mtime and leave atime.
func times(mtime time.Time) []unix.Timespec {
	return []unix.Timespec{
		{Nsec: unix.UTIME_OMIT},
		{Sec: mtime.Unix(), Nsec: int64(mtime.Nanosecond())},
	}
}

// place creates an entry under a temporary name in its parent with create,
// sets it up with finish (given the parent and the temporary name), and
// renames it over the entry's name. A directory there is refused.
func (x *extractor) place(e *tarEntry, create func(pfd int, tmp string) error, finish func(pfd int, tmp string) error) error {
	full := x.full(e.name)
	abs := display(full)
	pfd, err := x.parent(full)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	_, base := splitRel(full)
	var st unix.Stat_t
	switch err := ignoringEINTR(func() error { return unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) }); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return newError(errdefs.ErrFailedPrecondition, unix.EISDIR, "extract %s: it is a directory in the sandbox and not in the archive", abs)
	case err != nil && err != unix.ENOENT:
		return fsError("extract", abs, err)
	}
	tmp, err := withTempName(func(name string) error { return create(pfd, name) })
	if err != nil {
		return fsError("extract", abs, err)
	}
	err = finish(pfd, tmp)
	if err == nil {
		err = ignoringEINTR(func() error { return unix.Renameat(pfd, tmp, pfd, base) })
		if err != nil {
			err = fsError("extract", abs, err)
		}
	}
	// On error the temporary name goes. So does a hard link renamed over
	// another name of its own inode: rename does nothing then.
	if err != nil || e.typ == tar.TypeLink {
		unix.Unlinkat(pfd, tmp, 0)
	}
	return err
}

// file writes a regular file from the archive's data.
func (x *extractor) file(e *tarEntry, data io.Reader) error {
	abs := display(x.full(e.name))
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	err := x.place(e, func(pfd int, tmp string) error {
		fd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			f = os.NewFile(uintptr(fd), abs)
		}
		return err
	}, func(pfd int, tmp string) error {
		fd := int(f.Fd())
		// Owner first: chown clears setuid and setgid.
		if err := unix.Fchown(fd, x.opts.UID, x.opts.GID); err != nil {
			return fsError("extract", abs, err)
		}
		// Whole zero blocks (a sparse entry's holes among them) become
		// holes here too.
		src := &ctxReader{ctx: x.ctx, r: data}
		n, err := sparse.Copy(f, src)
		var fe *sparse.FileError
		switch {
		case errors.As(err, &fe):
			return fsError("extract", abs, fe.Err)
		case err != nil:
			return fmt.Errorf("extract %s: read the archive: %w", abs, err)
		case n != e.size:
			return fmt.Errorf("extract %s: the archive held %d bytes, not %d", abs, n, e.size)
		}
		if err := unix.Fchmod(fd, e.mode); err != nil {
			return fsError("extract", abs, err)
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, procFD(fd), times(e.mtime), 0); err != nil {
			return fsError("extract", abs, err)
		}
		err = f.Close()
		f = nil
		if err != nil {
			return fsError("extract", abs, err)
		}
		x.stats.Bytes += n
		return nil
	})
	if err == nil {
		x.stats.Files++
	}
	return err
}

// symlink makes a symbolic link.
func (x *extractor) symlink(e *tarEntry) error {
	abs := display(x.full(e.name))
	err := x.place(e, func(pfd int, tmp string) error {
		return unix.Symlinkat(e.linkname, pfd, tmp)
	}, func(pfd int, tmp string) error {
		if err := unix.Fchownat(pfd, tmp, x.opts.UID, x.opts.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fsError("extract", abs, err)
		}
		if err := unix.UtimesNanoAt(pfd, tmp, times(e.mtime), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fsError("extract", abs, err)
		}
		return nil
	})
	if err == nil {
		x.stats.Links++
	}
	return err
}

// link makes a hard link to an entry extracted before.
func (x *extractor) link(e *tarEntry) error {
	tfull := x.full(e.linkname)
	tabs := display(tfull)
	tdir, tbase := splitRel(tfull)
	tpfd, err := x.r.resolve(tdir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return fsError("extract", tabs, err)
	}
	defer unix.Close(tpfd)
	err = x.place(e, func(pfd int, tmp string) error {
		return unix.Linkat(tpfd, tbase, pfd, tmp, 0)
	}, func(int, string) error { return nil })
	if err == nil {
		x.stats.Links++
	}
	return err
}

// fifo makes a named pipe; it is never opened.
func (x *extractor) fifo(e *tarEntry) error {
	abs := display(x.full(e.name))
	err := x.place(e, func(pfd int, tmp string) error {
		return unix.Mknodat(pfd, tmp, unix.S_IFIFO|0o600, 0)
	}, func(pfd int, tmp string) error {
		fd, err := ignoringEINTR2(func() (int, error) {
			return unix.Openat(pfd, tmp, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		})
		if err != nil {
			return fsError("extract", abs, err)
		}
		defer unix.Close(fd)
		st, err := fstat(fd)
		if err != nil {
			return fsError("extract", abs, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return newError(errdefs.ErrUnavailable, nil, "extract %s: it changed while it was being made; try again", abs)
		}
		err = unix.Fchownat(fd, "", x.opts.UID, x.opts.GID, unix.AT_EMPTY_PATH)
		if err == nil {
			err = unix.Fchmodat(unix.AT_FDCWD, procFD(fd), e.mode, 0)
		}
		if err == nil {
			err = unix.UtimesNanoAt(unix.AT_FDCWD, procFD(fd), times(e.mtime), 0)
		}
		if err != nil {
			return fsError("extract", abs, err)
		}
		return nil
	})
	if err == nil {
		x.stats.Files++
	}
	return err
}
