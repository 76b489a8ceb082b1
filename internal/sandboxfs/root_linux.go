package sandboxfs

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// maxResolveRetries bounds the retries of openat2 when it reports EAGAIN,
// which RESOLVE_IN_ROOT does when a rename or mount races with a ".." in
// the path. A sandbox that keeps renaming only delays its own request.
const maxResolveRetries = 128

// resolveFlags are the resolve flags of every lookup: the root is the
// sandbox's "/", and procfs magic links are never followed.
const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// Root is a sandbox's root directory, opened from outside the sandbox. It
// holds one O_PATH descriptor. Its methods may be called concurrently with
// each other, but not with Close.
type Root struct {
	fd   int // O_PATH directory; -1 once closed
	name string
}

// OpenRoot opens name, the sandbox's root as seen from the host (normally
// /proc/<init pid>/root), as an O_PATH directory. Open a Root per operation
// and close it: it pins the sandbox's mount namespace while open.
func OpenRoot(name string) (*Root, error) {
	fd, err := ignoringEINTR2(func() (int, error) {
		return unix.Open(name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	switch err {
	case nil:
		return &Root{fd: fd, name: name}, nil
	case unix.ENOENT, unix.ESRCH:
		// name is a host path (/proc/PID/root): users see none.
		return nil, newError(errdefs.ErrNotFound, err, "the sandbox's root does not exist; has the sandbox exited?")
	case unix.ENOTDIR:
		return nil, newError(errdefs.ErrInvalidArgument, err, "the sandbox's root is not a directory")
	}
	return nil, fmt.Errorf("open sandbox root %s: %w", name, err)
}

// Close releases the root's descriptor. It is idempotent.
func (r *Root) Close() error {
	if r.fd < 0 {
		return nil
	}
	fd := r.fd
	r.fd = -1
	return unix.Close(fd)
}

// Stat describes the file at p, following symlinks inside the sandbox.
// Owners are host ids. Stat works on every file system, procfs included: it
// never opens the file.
func (r *Root) Stat(p string) (Info, error) { return r.stat(p, 0) }

// Lstat is Stat that describes a symlink at p itself.
func (r *Root) Lstat(p string) (Info, error) { return r.stat(p, unix.O_NOFOLLOW) }

func (r *Root) stat(p string, flags uint64) (Info, error) {
	rel, err := Clean(p)
	if err != nil {
		return Info{}, err
	}
	abs := display(rel)
	fd, err := r.resolve(rel, unix.O_PATH|flags)
	if err != nil {
		return Info{}, fsError("stat", abs, err)
	}
	defer unix.Close(fd)
	st, err := fstat(fd)
	if err != nil {
		return Info{}, fsError("stat", abs, err)
	}
	info := newInfo(abs, &st)
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		// fd is the symlink itself (O_PATH|O_NOFOLLOW).
		if info.LinkTarget, err = readlink(fd, ""); err != nil {
			return Info{}, fsError("stat", abs, err)
		}
	}
	return info, nil
}

// OpenRead opens the regular file at p for reading, following symlinks
// inside the sandbox. Directories, fifos, sockets and devices are
// InvalidArgument and are never opened; files on procfs, sysfs and the other
// kernel file systems are PermissionDenied. The caller closes the file.
func (r *Root) OpenRead(p string) (*os.File, Info, error) {
	rel, err := Clean(p)
	if err != nil {
		return nil, Info{}, err
	}
	abs := display(rel)
	pfd, err := r.resolve(rel, unix.O_PATH)
	if err != nil {
		return nil, Info{}, fsError("read", abs, err)
	}
	defer unix.Close(pfd)
	if err := checkFS(pfd, "read", abs); err != nil {
		return nil, Info{}, err
	}
	st, err := fstat(pfd)
	if err != nil {
		return nil, Info{}, fsError("read", abs, err)
	}
	if err := requireRegular(abs, st.Mode); err != nil {
		return nil, Info{}, err
	}
	// O_NONBLOCK makes the open fail with EWOULDBLOCK instead of waiting for
	// a sandbox process to give up a write lease on the file; it is cleared
	// below, and means nothing for reads of a regular file anyway.
	fd, err := reopen(pfd, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK)
	if err != nil {
		return nil, Info{}, fsError("read", abs, err)
	}
	st2, err := fstat(fd)
	if err == nil {
		err = unix.SetNonblock(fd, false)
	}
	if err != nil {
		unix.Close(fd)
		return nil, Info{}, fsError("read", abs, err)
	}
	if st2.Dev != st.Dev || st2.Ino != st.Ino || st2.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, Info{}, newError(errdefs.ErrUnavailable, nil, "read %s in the sandbox: the file changed while it was being opened; try again", abs)
	}
	return os.NewFile(uintptr(fd), abs), newInfo(abs, &st2), nil
}

// WriteFile writes the data of src to the regular file at p, replacing
// whatever is there except a directory: it writes a new file beside the
// target and renames it over the target, so a symlink at p is replaced, not
// followed, and readers see the old or the new file, never a part. Symlinks
// in the parent path are followed inside the sandbox. On error nothing is
// left behind: not the temporary file, nor directories MakeParents made.
func (r *Root) WriteFile(p string, opts WriteOptions, src io.Reader) (Info, error) {
	rel, err := Clean(p)
	if err != nil {
		return Info{}, err
	}
	abs := display(rel)
	mode, err := unixMode(opts.Mode)
	if err != nil {
		return Info{}, err
	}
	if err := checkOwner("write", abs, opts.UID, opts.GID); err != nil {
		return Info{}, err
	}
	if opts.MaxBytes < 0 {
		return Info{}, errdefs.Newf(errdefs.ErrInvalidArgument, "write %s: the size limit %d is negative", abs, opts.MaxBytes)
	}
	if rel == "." {
		return Info{}, errdefs.Newf(errdefs.ErrInvalidArgument, "/ in the sandbox is a directory; give the path of a file")
	}
	dir, base := splitRel(rel)

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
	dfd, err := r.openParent("write", dir, abs, opts, &made)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(dfd)
	if err := checkFS(dfd, "write", abs); err != nil {
		return Info{}, err
	}
	// Refuse a directory at the target before any data is copied; the
	// rename below refuses one that appears meanwhile.
	var st unix.Stat_t
	switch err := ignoringEINTR(func() error { return unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) }); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return Info{}, fsError("write", abs, unix.EISDIR)
	case err != nil && err != unix.ENOENT:
		return Info{}, fsError("write", abs, err)
	}

	tmp, fd, err := createTemp(dfd)
	if err != nil {
		return Info{}, fsError("write", abs, err)
	}
	f := os.NewFile(uintptr(fd), abs)
	defer func() {
		if !ok {
			f.Close()
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	// Owner first: chown clears setuid and setgid, which the chmod sets
	// after the data is written.
	if err := unix.Fchown(fd, opts.UID, opts.GID); err != nil {
		return Info{}, fsError("write", abs, err)
	}
	in := src
	if opts.MaxBytes > 0 {
		in = io.LimitReader(src, opts.MaxBytes+1)
	}
	w := &errWriter{w: f}
	n, err := io.Copy(w, in)
	switch {
	case w.err != nil:
		return Info{}, fsError("write", abs, w.err)
	case err != nil:
		return Info{}, fmt.Errorf("write %s in the sandbox: read the data: %w", abs, err)
	case opts.MaxBytes > 0 && n > opts.MaxBytes:
		return Info{}, errdefs.Newf(errdefs.ErrInvalidArgument,
			"write %s in the sandbox: the data is larger than the limit of %d bytes; nothing was written", abs, opts.MaxBytes)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return Info{}, fsError("write", abs, err)
	}
	if st, err = fstat(fd); err != nil {
		return Info{}, fsError("write", abs, err)
	}
	if err := f.Close(); err != nil {
		return Info{}, fsError("write", abs, err)
	}
	if err := ignoringEINTR(func() error { return unix.Renameat(dfd, tmp, dfd, base) }); err != nil {
		if err == unix.EBUSY {
			return Info{}, newError(errdefs.ErrFailedPrecondition, err,
				"write %s in the sandbox: it is a mount point (as /etc/hosts often is) and cannot be replaced; write it with exec instead", abs)
		}
		return Info{}, fsError("write", abs, err)
	}
	ok = true
	return newInfo(abs, &st), nil
}

// madeDir is a directory WriteFile created, to be removed if the write fails.
type madeDir struct {
	parent   int // O_PATH descriptor of the directory it is in; owned
	name     string
	rel      string // its sandbox path, a Clean result
	dev, ino uint64
}

// removeMade removes the directories in made, newest first, if they are
// still the empty directories that were made.
func removeMade(made []madeDir) {
	for i := len(made) - 1; i >= 0; i-- {
		m := made[i]
		var st unix.Stat_t
		if unix.Fstatat(m.parent, m.name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil ||
			uint64(st.Dev) != m.dev || uint64(st.Ino) != m.ino {
			continue
		}
		unix.Unlinkat(m.parent, m.name, unix.AT_REMOVEDIR)
	}
}

// openParent opens the directory dir (a Clean result) that the target abs
// is created in, as O_PATH. With opts.MakeParents it creates the missing
// directories, appending them to *made. op ("write", "mkdir") is for
// messages.
func (r *Root) openParent(op, dir, abs string, opts WriteOptions, made *[]madeDir) (int, error) {
	fd, err := r.resolve(dir, unix.O_PATH|unix.O_DIRECTORY)
	switch {
	case err == nil:
		return fd, nil
	case err == unix.ENOENT && opts.MakeParents:
		return r.makeParents(op, dir, opts, made)
	case err == unix.ENOENT:
		return -1, newError(errdefs.ErrNotFound, err,
			"%s %s in the sandbox: the directory %s does not exist; create it, or ask for parent directories to be made (make_parents)", op, abs, display(dir))
	case err == unix.ENOTDIR:
		return -1, newError(errdefs.ErrInvalidArgument, err, "%s %s in the sandbox: %s is not a directory", op, abs, display(dir))
	}
	return -1, fsError(op, abs, err)
}

// makeParents opens dir, creating each missing directory in it one at a
// time. Each component is looked up from the root, so symlinks in dir are
// followed inside the sandbox as the kernel would follow them.
func (r *Root) makeParents(op, dir string, opts WriteOptions, made *[]madeDir) (int, error) {
	cur, err := r.resolve(".", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, fsError(op, "/", err)
	}
	comps := strings.Split(dir, "/")
	for i, name := range comps {
		prefix := strings.Join(comps[:i+1], "/")
		next, err := r.resolve(prefix, unix.O_PATH|unix.O_DIRECTORY)
		keep := false // whether *made took cur over
		if err == unix.ENOENT {
			var m *madeDir
			next, m, err = mkdir(op, cur, name, display(prefix), opts)
			if m != nil {
				*made = append(*made, *m)
				keep = true
			}
		} else if err != nil {
			err = fsError(op, display(prefix), err)
		}
		if !keep {
			unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// mkdir creates the directory name in the O_PATH directory parent, owned by
// opts.UID and opts.GID with mode 0755 exactly, and opens it. A directory
// that appeared meanwhile is used as it is. When it made the directory, it
// returns a record of it, even with an error, so that it can be removed;
// the record takes parent over.
func mkdir(op string, parent int, name, abs string, opts WriteOptions) (int, *madeDir, error) {
	if err := checkFS(parent, op, abs); err != nil {
		return -1, nil, err
	}
	created := true
	if err := ignoringEINTR(func() error { return unix.Mkdirat(parent, name, 0o700) }); err == unix.EEXIST {
		created = false
	} else if err != nil {
		return -1, nil, fsError(op, abs, err)
	}
	fd, err := ignoringEINTR2(func() (int, error) {
		return unix.Openat(parent, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	})
	if err == unix.ENOTDIR || err == unix.ELOOP {
		return -1, nil, newError(errdefs.ErrInvalidArgument, err, "%s: %s in the sandbox is in the way: it exists and is not a directory", op, abs)
	} else if err != nil {
		return -1, nil, fsError(op, abs, err)
	}
	if !created {
		return fd, nil, nil
	}
	st, err := fstat(fd)
	if err != nil {
		unix.Close(fd)
		return -1, nil, fsError(op, abs, err)
	}
	m := &madeDir{parent: parent, name: name, rel: abs[1:], dev: uint64(st.Dev), ino: uint64(st.Ino)}
	err = unix.Fchownat(fd, "", opts.UID, opts.GID, unix.AT_EMPTY_PATH)
	if err == nil {
		// chmod through /proc: fchmod refuses O_PATH descriptors.
		err = unix.Fchmodat(unix.AT_FDCWD, procFD(fd), 0o755, 0)
	}
	if err != nil {
		unix.Close(fd)
		return -1, m, fsError(op, abs, err)
	}
	return fd, m, nil
}

// createTemp creates an empty file with a random name in the O_PATH
// directory dir, opened for writing, never following a symlink.
func createTemp(dir int) (string, int, error) {
	fd := -1
	name, err := withTempName(func(name string) (err error) {
		fd, err = ignoringEINTR2(func() (int, error) {
			return unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		})
		return err
	})
	return name, fd, err
}

// withTempName calls create with random names (".dsec-<hex>.tmp") until it
// returns something other than EEXIST, and returns the name it was last
// called with. create must fail with EEXIST when the name is taken.
func withTempName(create func(name string) error) (string, error) {
	for range 16 {
		var b [8]byte
		rand.Read(b[:])
		name := ".dsec-" + hex.EncodeToString(b[:]) + ".tmp"
		if err := ignoringEINTR(func() error { return create(name) }); err != unix.EEXIST {
			return name, err
		}
	}
	return "", unix.EEXIST
}

// resolve opens rel (a Clean result) inside the root with openat2, with
// flags (O_PATH and friends) and O_CLOEXEC.
func (r *Root) resolve(rel string, flags uint64) (int, error) {
	if r.fd < 0 {
		return -1, unix.EBADF
	}
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: resolveFlags}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(r.fd, rel, &how)
		if err == unix.EINTR || (err == unix.EAGAIN && i < maxResolveRetries) {
			continue
		}
		return fd, err
	}
}

// checkFS refuses a descriptor that is not on an allowed file system. op is
// the operation ("read", "write", "list", "mkdir", "remove", "rename",
// "copy"); abs is the sandbox path, for the message.
func checkFS(fd int, op, abs string) error {
	m, err := fsMagic(fd)
	if err != nil {
		return fsError(op, abs, err)
	}
	name, ok := fsAllowed(m)
	if ok {
		return nil
	}
	switch op {
	case "read":
		return newError(errdefs.ErrPermissionDenied, nil,
			"reading %s through the file API is not allowed (it is on %s); run `cat` with exec instead", abs, name)
	case "list":
		return newError(errdefs.ErrPermissionDenied, nil,
			"listing %s through the file API is not allowed (it is on %s); run `ls` with exec instead", abs, name)
	case "copy":
		return newError(errdefs.ErrPermissionDenied, nil,
			"copying %s through the file API is not allowed (it is on %s); run a command with exec instead", abs, name)
	}
	return newError(errdefs.ErrPermissionDenied, nil,
		"%s %s through the file API is not allowed (its directory is on %s); run a command with exec instead", gerund(op), abs, name)
}

// gerund names an operation for checkFS's message.
func gerund(op string) string {
	switch op {
	case "mkdir":
		return "creating"
	case "remove":
		return "removing"
	case "rename":
		return "renaming"
	case "extract":
		return "extracting into"
	}
	return "writing"
}

// checkOwner refuses owners that are not valid host ids.
func checkOwner(op, abs string, uid, gid int) error {
	if uid < 0 || gid < 0 || uint64(uid) >= math.MaxUint32 || uint64(gid) >= math.MaxUint32 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%s %s: owner %d:%d is not a valid user and group id", op, abs, uid, gid)
	}
	return nil
}

// splitRel splits a Clean result other than "." into its directory (a
// Clean result) and its last element.
func splitRel(rel string) (dir, base string) {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i], rel[i+1:]
	}
	return ".", rel
}

// requireRegular refuses anything but a regular file, by its st_mode.
func requireRegular(abs string, mode uint32) error {
	var what string
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFDIR:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%s in the sandbox is a directory; use `dsec cp` for directories", abs)
	case unix.S_IFIFO:
		what = "a named pipe (fifo)"
	case unix.S_IFSOCK:
		what = "a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		what = "a device"
	default:
		what = "not a regular file"
	}
	return errdefs.Newf(errdefs.ErrInvalidArgument, "%s in the sandbox is %s; only regular files can be read through the file API, use exec for the rest", abs, what)
}

// reopen opens the file an O_PATH descriptor refers to, with flags, through
// /proc/self/fd: the same inode, with no path lookup in the sandbox.
func reopen(fd, flags int) (int, error) {
	return ignoringEINTR2(func() (int, error) {
		return unix.Open(procFD(fd), flags|unix.O_CLOEXEC, 0)
	})
}

// maxLinkTarget bounds what readlink reads; Linux keeps targets of at most
// PATH_MAX (4096) bytes.
const maxLinkTarget = 64 << 10

// readlink returns the target of the symlink name in the directory dfd, or
// with name "" of the symlink dfd itself (an O_PATH descriptor). It never
// follows the symlink; name must be one path element.
func readlink(dfd int, name string) (string, error) {
	for size := 256; size <= maxLinkTarget; size *= 2 {
		buf := make([]byte, size)
		n, err := ignoringEINTR2(func() (int, error) { return unix.Readlinkat(dfd, name, buf) })
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
	return "", unix.ENAMETOOLONG
}

func procFD(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

func fstat(fd int) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := ignoringEINTR(func() error { return unix.Fstatat(fd, "", &st, unix.AT_EMPTY_PATH) })
	return st, err
}

// errWriter remembers the error of its writer, to tell it from the reader's.
type errWriter struct {
	w   io.Writer
	err error
}

func (w *errWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	if err != nil {
		w.err = err
	}
	return n, err
}

// unixMode returns the mode bits for fchmod of a WriteOptions.Mode.
func unixMode(m fs.FileMode) (uint32, error) {
	if m == 0 {
		return 0o644, nil
	}
	const allowed = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky | 0o7000
	if m&^allowed != 0 {
		return 0, errdefs.Newf(errdefs.ErrInvalidArgument, "file mode %v has bits other than permissions, setuid, setgid and sticky", m)
	}
	u := uint32(m & 0o7777)
	if m&fs.ModeSetuid != 0 {
		u |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		u |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		u |= unix.S_ISVTX
	}
	return u, nil
}

// fileMode converts an st_mode to an fs.FileMode.
func fileMode(mode uint32) fs.FileMode {
	m := fs.FileMode(mode & 0o777)
	switch mode & unix.S_IFMT {
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	}
	if mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func newInfo(abs string, st *unix.Stat_t) Info {
	return Info{
		Path:    abs,
		Name:    path.Base(abs),
		Size:    st.Size,
		Mode:    fileMode(st.Mode),
		ModTime: time.Unix(st.Mtim.Unix()),
		UID:     st.Uid,
		GID:     st.Gid,
		Ino:     uint64(st.Ino),
		Dev:     uint64(st.Dev),
	}
}
