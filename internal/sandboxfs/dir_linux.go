package sandboxfs

import (
	"errors"
	"io/fs"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// ReadDir lists the directory at p, following symlinks inside the sandbox
// (as Stat does): the entries sorted by name, each described as Lstat would
// (a symlink is described, not followed), at most limit of them (0 means
// DefaultReadDirLimit). truncated reports that there were more. A symlink's
// target is read relative to the directory, never followed. A path that
// is not a directory is InvalidArgument; a directory on procfs, sysfs or
// another kernel file system is PermissionDenied. An entry removed while it
// is listed is left out.
func (r *Root) ReadDir(p string, limit int) (entries []Info, truncated bool, err error) {
	rel, err := Clean(p)
	if err != nil {
		return nil, false, err
	}
	abs := display(rel)
	switch {
	case limit < 0:
		return nil, false, errdefs.Newf(errdefs.ErrInvalidArgument, "list %s: the limit %d is negative", abs, limit)
	case limit == 0:
		limit = DefaultReadDirLimit
	}
	pfd, err := r.resolve(rel, unix.O_PATH)
	if err != nil {
		return nil, false, fsError("list", abs, err)
	}
	defer unix.Close(pfd)
	st, err := fstat(pfd)
	if err != nil {
		return nil, false, fsError("list", abs, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, false, errdefs.Newf(errdefs.ErrInvalidArgument, "%s in the sandbox is not a directory; use stat for a single file", abs)
	}
	if err := checkFS(pfd, "list", abs); err != nil {
		return nil, false, err
	}
	dfd, err := reopenDir(pfd, &st)
	if err != nil {
		return nil, false, fsError("list", abs, err)
	}
	defer unix.Close(dfd)
	names, err := readNames(dfd)
	if err != nil {
		return nil, false, fsError("list", abs, err)
	}
	slices.Sort(names)
	if len(names) > limit {
		names, truncated = names[:limit], true
	}
	entries = make([]Info, 0, len(names))
	for _, name := range names {
		var st unix.Stat_t
		err := ignoringEINTR(func() error { return unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
		if err == unix.ENOENT {
			continue
		} else if err != nil {
			return nil, false, fsError("list", path.Join(abs, name), err)
		}
		info := newInfo(path.Join(abs, name), &st)
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			// name is one element: readlinkat reads the entry of dfd and
			// resolves nothing.
			info.LinkTarget, err = readlink(dfd, name)
			switch err {
			case nil:
			case unix.ENOENT:
				continue
			case unix.EINVAL:
				// Replaced by something other than a symlink meanwhile.
			default:
				return nil, false, fsError("list", path.Join(abs, name), err)
			}
		}
		entries = append(entries, info)
	}
	return entries, truncated, nil
}

// Mkdir creates the directory p with mode (its permission bits, setgid and
// sticky, applied exactly; 0 means 0755) owned by the HOST ids uid and gid.
// Symlinks in the parent path are followed inside the sandbox. With parents
// it creates missing parents too (each 0755, owned by uid and gid), and an
// existing directory at p is no error (it is left as it is and described);
// without, an existing p is AlreadyExists and a missing parent NotFound. On
// error nothing it created is left behind.
func (r *Root) Mkdir(p string, mode fs.FileMode, parents bool, uid, gid int) (Info, error) {
	rel, err := Clean(p)
	if err != nil {
		return Info{}, err
	}
	abs := display(rel)
	perm := uint32(0o755)
	if mode != 0 {
		if mode&^(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky|0o3000) != 0 {
			return Info{}, errdefs.Newf(errdefs.ErrInvalidArgument, "mkdir %s: mode %v has bits other than permissions, setgid and sticky", abs, mode)
		}
		if perm, err = unixMode(mode); err != nil {
			return Info{}, err
		}
	}
	if err := checkOwner("mkdir", abs, uid, gid); err != nil {
		return Info{}, err
	}
	if rel == "." {
		if parents {
			return r.Stat("/")
		}
		return Info{}, errdefs.Newf(errdefs.ErrAlreadyExists, "/ already exists in the sandbox")
	}
	dir, base := splitRel(rel)
	opts := WriteOptions{UID: uid, GID: gid, MakeParents: parents}

	var made []madeDir
	ok := false
	defer func() {
		if !ok {
			removeMade(made)
		}
		for _, m := range made {
			unix.Close(m.parent)
		}
	}()
	pfd, err := r.openParent("mkdir", dir, abs, opts, &made)
	if err != nil {
		return Info{}, err
	}
	fd, m, err := mkdir("mkdir", pfd, base, abs, opts)
	if m != nil {
		made = append(made, *m) // closes pfd
	} else {
		unix.Close(pfd)
	}
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		// Something other than a directory is there; mkdir -p accepts a
		// symlink to a directory.
		if info, serr := r.Stat(p); parents && serr == nil && info.Mode.IsDir() {
			ok = true
			return info, nil
		}
		return Info{}, newError(errdefs.ErrAlreadyExists, unix.EEXIST, "%s already exists in the sandbox and is not a directory", abs)
	} else if err != nil {
		return Info{}, err
	}
	defer unix.Close(fd)
	switch {
	case m == nil && !parents:
		return Info{}, newError(errdefs.ErrAlreadyExists, unix.EEXIST, "%s already exists in the sandbox", abs)
	case m != nil && perm != 0o755:
		// chmod through /proc: fchmod refuses O_PATH descriptors.
		if err := unix.Fchmodat(unix.AT_FDCWD, procFD(fd), perm, 0); err != nil {
			return Info{}, fsError("mkdir", abs, err)
		}
	}
	st, err := fstat(fd)
	if err != nil {
		return Info{}, fsError("mkdir", abs, err)
	}
	ok = true
	return newInfo(abs, &st), nil
}

// Remove removes the file, symlink (not its target) or empty directory at
// p. Symlinks in the parent path are followed inside the sandbox. With
// recursive it removes a directory and everything in it, walking with
// descriptors only: symlinks are removed, never followed, and a tree with a
// mount point anywhere in it (a sandbox's /proc, a bind-mounted file) is
// refused with FailedPrecondition before anything is removed. "/" is never
// removed (InvalidArgument); a missing p is NotFound; a directory on a
// kernel file system is PermissionDenied. If the sandbox keeps adding files
// while a tree is removed, Remove may fail after removing part of it.
func (r *Root) Remove(p string, recursive bool) error {
	rel, err := Clean(p)
	if err != nil {
		return err
	}
	abs := display(rel)
	if rel == "." {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "the sandbox's / cannot be removed; remove what is in it one by one")
	}
	dir, base := splitRel(rel)
	pfd, err := r.resolve(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return fsError("remove", abs, err)
	}
	defer unix.Close(pfd)
	if err := checkFS(pfd, "remove", abs); err != nil {
		return err
	}
	var pst, st unix.Statx_t
	if err := statx(pfd, "", &pst); err != nil {
		return fsError("remove", abs, err)
	}
	if err := statx(pfd, base, &st); err != nil {
		return fsError("remove", abs, err)
	}
	if st.Mnt_id != pst.Mnt_id {
		return newError(errdefs.ErrFailedPrecondition, unix.EBUSY, "remove %s in the sandbox: it is a mount point; unmount it first", abs)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return removeAt(pfd, base, 0, abs)
	}
	if !recursive {
		err := removeAt(pfd, base, unix.AT_REMOVEDIR, abs)
		if errors.Is(err, unix.ENOTEMPTY) {
			return newError(errdefs.ErrFailedPrecondition, unix.ENOTEMPTY, "remove %s in the sandbox: the directory is not empty; remove it recursively", abs)
		}
		return err
	}
	t := treeRemover{mnt: st.Mnt_id}
	dfd, err := t.openDir(pfd, base, &st, abs)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := t.check(dfd, abs, 1); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		if err := t.remove(dfd, abs, 1); err != nil {
			return err
		}
		err := ignoringEINTR(func() error { return unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR) })
		if err == unix.ENOTEMPTY && attempt < 3 {
			continue // something in the sandbox wrote into it meanwhile
		}
		if err != nil && err != unix.ENOENT {
			return fsError("remove", abs, err)
		}
		return nil
	}
}

// removeAt unlinks name in the directory dfd, with flags.
func removeAt(dfd int, name string, flags int, abs string) error {
	if err := ignoringEINTR(func() error { return unix.Unlinkat(dfd, name, flags) }); err != nil {
		return fsError("remove", abs, err)
	}
	return nil
}

// treeRemover removes a directory tree on one mount.
type treeRemover struct {
	mnt uint64 // the mount the tree is on
}

// openDir opens the directory name in dfd for reading, never following a
// symlink, and makes sure it is the directory st describes and on t's
// mount.
func (t treeRemover) openDir(dfd int, name string, st *unix.Statx_t, abs string) (int, error) {
	fd, err := ignoringEINTR2(func() (int, error) {
		return unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	})
	if err == unix.ENOTDIR || err == unix.ELOOP {
		return -1, newError(errdefs.ErrUnavailable, err, "remove %s in the sandbox: it changed while it was being removed; try again", abs)
	} else if err != nil {
		return -1, fsError("remove", abs, err)
	}
	var got unix.Statx_t
	if err := statx(fd, "", &got); err != nil {
		unix.Close(fd)
		return -1, fsError("remove", abs, err)
	}
	if got.Mnt_id != t.mnt {
		unix.Close(fd)
		return -1, t.mountError(abs)
	}
	if got.Ino != st.Ino || got.Dev_major != st.Dev_major || got.Dev_minor != st.Dev_minor {
		unix.Close(fd)
		return -1, newError(errdefs.ErrUnavailable, nil, "remove %s in the sandbox: it changed while it was being removed; try again", abs)
	}
	return fd, nil
}

func (t treeRemover) mountError(abs string) error {
	return newError(errdefs.ErrFailedPrecondition, unix.EBUSY,
		"%s in the sandbox is a mount point, so the tree that holds it is not removed; unmount it first, or remove the rest one by one", abs)
}

// check walks the tree under dfd (at depth) and refuses it if anything in
// it is on another mount.
func (t treeRemover) check(dfd int, abs string, depth int) error {
	return t.walk(dfd, abs, depth, false)
}

// remove removes everything under dfd.
func (t treeRemover) remove(dfd int, abs string, depth int) error {
	return t.walk(dfd, abs, depth, true)
}

func (t treeRemover) walk(dfd int, abs string, depth int, remove bool) error {
	if depth > maxWalkDepth {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "remove: the tree at %s in the sandbox is more than %d levels deep; remove it with exec", abs, maxWalkDepth)
	}
	names, err := readNames(dfd)
	if err != nil {
		return fsError("remove", abs, err)
	}
	for _, name := range names {
		cabs := path.Join(abs, name)
		var st unix.Statx_t
		err := statx(dfd, name, &st)
		if err == unix.ENOENT {
			continue
		} else if err != nil {
			return fsError("remove", cabs, err)
		}
		if st.Mnt_id != t.mnt {
			return t.mountError(cabs)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if remove {
				if err := ignoringEINTR(func() error { return unix.Unlinkat(dfd, name, 0) }); err != nil && err != unix.ENOENT {
					return fsError("remove", cabs, err)
				}
			}
			continue
		}
		cfd, err := t.openDir(dfd, name, &st, cabs)
		if errdefs.Is(err, errdefs.ErrNotFound) {
			continue
		} else if err != nil {
			return err
		}
		err = t.walk(cfd, cabs, depth+1, remove)
		unix.Close(cfd)
		if err != nil {
			return err
		}
		if remove {
			if err := ignoringEINTR(func() error { return unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR) }); err != nil && err != unix.ENOENT {
				return fsError("remove", cabs, err)
			}
		}
	}
	return nil
}

// Rename renames from to to, as renameat2 does: both parent paths are
// resolved inside the sandbox (following symlinks there), the last element
// of neither is followed (a symlink is renamed, not its target). Without
// overwrite an existing to is AlreadyExists (RENAME_NOREPLACE); with it, to
// is replaced as rename(2) replaces (a directory only by a directory, and
// only when empty). Renaming "/" or onto it is InvalidArgument; across
// mounts, FailedPrecondition.
func (r *Root) Rename(from, to string, overwrite bool) error {
	frel, err := Clean(from)
	if err != nil {
		return err
	}
	trel, err := Clean(to)
	if err != nil {
		return err
	}
	fabs, tabs := display(frel), display(trel)
	if frel == "." || trel == "." {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "rename %s to %s: the sandbox's / cannot be renamed or replaced", fabs, tabs)
	}
	fdir, fbase := splitRel(frel)
	tdir, tbase := splitRel(trel)
	fpfd, err := r.resolve(fdir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return fsError("rename", fabs, err)
	}
	defer unix.Close(fpfd)
	tpfd, err := r.resolve(tdir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return fsError("rename", tabs, err)
	}
	defer unix.Close(tpfd)
	if err := checkFS(fpfd, "rename", fabs); err != nil {
		return err
	}
	if err := checkFS(tpfd, "rename", tabs); err != nil {
		return err
	}
	var flags uint
	if !overwrite {
		flags = unix.RENAME_NOREPLACE
	}
	err = ignoringEINTR(func() error { return unix.Renameat2(fpfd, fbase, tpfd, tbase, flags) })
	switch err {
	case nil:
		return nil
	case unix.ENOENT:
		return fsError("rename", fabs, err)
	case unix.EEXIST:
		return newError(errdefs.ErrAlreadyExists, err, "rename %s: %s already exists in the sandbox; ask to overwrite it", fabs, tabs)
	case unix.ENOTEMPTY:
		return newError(errdefs.ErrFailedPrecondition, err, "rename %s: %s in the sandbox is a directory that is not empty; remove it first", fabs, tabs)
	case unix.EXDEV:
		return newError(errdefs.ErrFailedPrecondition, err, "rename %s to %s: they are on different mounts in the sandbox; copy and remove instead", fabs, tabs)
	case unix.EISDIR:
		return newError(errdefs.ErrInvalidArgument, err, "rename %s: %s in the sandbox is a directory and %s is not", fabs, tabs, fabs)
	case unix.ENOTDIR:
		return newError(errdefs.ErrInvalidArgument, err, "rename %s: it is a directory and %s in the sandbox is not", fabs, tabs)
	case unix.EBUSY:
		return newError(errdefs.ErrFailedPrecondition, err, "rename %s to %s: one of them is a mount point in the sandbox", fabs, tabs)
	case unix.EINVAL:
		if strings.HasPrefix(trel, frel+"/") {
			return newError(errdefs.ErrInvalidArgument, err, "rename %s: %s is inside it; a directory cannot be moved into itself", fabs, tabs)
		}
		if !overwrite {
			return newError(errdefs.ErrFailedPrecondition, err, "rename %s: the file system does not support renaming without replacing; ask to overwrite", fabs)
		}
	}
	return fsError("rename", fabs, err)
}

// readNames returns the names in the directory dfd (opened for reading),
// without "." and "..", from its start.
func readNames(dfd int) ([]string, error) {
	if _, err := unix.Seek(dfd, 0, 0); err != nil {
		return nil, err
	}
	var names []string
	buf := make([]byte, 32<<10)
	for {
		n, err := ignoringEINTR2(func() (int, error) { return unix.Getdents(dfd, buf) })
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// reopenDir opens the directory an O_PATH descriptor refers to for reading
// and makes sure it is still the one st describes.
func reopenDir(pfd int, st *unix.Stat_t) (int, error) {
	fd, err := reopen(pfd, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1, err
	}
	st2, err := fstat(fd)
	if err == nil && (st2.Dev != st.Dev || st2.Ino != st.Ino) {
		err = unix.EAGAIN
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// statx describes name in dfd ("" for dfd itself) with its mount id, never
// following a symlink or triggering an automount.
func statx(dfd int, name string, st *unix.Statx_t) error {
	flags := unix.AT_SYMLINK_NOFOLLOW | unix.AT_NO_AUTOMOUNT
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	return ignoringEINTR(func() error {
		return unix.Statx(dfd, name, flags, unix.STATX_TYPE|unix.STATX_MODE|unix.STATX_INO|unix.STATX_MNT_ID, st)
	})
}
