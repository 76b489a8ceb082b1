package layer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// BuildFromDir writes to out an EROFS image whose root is the directory
// dir. Owners, modes (setuid, setgid and sticky bits included),
// modification times, extended attributes (see keepXattr for which),
// symbolic links, fifos and hard links are kept; device nodes and sockets
// are skipped and counted, except whiteouts with Options.KeepWhiteouts.
// out must be empty (positioned at 0); it is normally an *os.File,
// otherwise the image is assembled in Options.TempDir first.
//
// The tree is read without following symbolic links, through file
// descriptors, so that a tree that changes while it is read (the upper
// directory of a running sandbox) cannot make the build read files outside
// it; a file that changed between the scan and the copy of its data fails
// the build with ErrFailedPrecondition.
func BuildFromDir(ctx context.Context, dir string, out io.WriteSeeker, opts Options) (Info, error) {
	rootFd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return Info{}, fmt.Errorf("layer source %s: %w", dir, errdefs.ErrNotFound)
	case errors.Is(err, unix.ENOTDIR):
		return Info{}, errdefs.Newf(errdefs.ErrInvalidArgument, "layer source %s is not a directory", dir)
	case err != nil:
		return Info{}, fmt.Errorf("open layer source %s: %w", dir, &os.PathError{Op: "open", Path: dir, Err: err})
	}
	defer unix.Close(rootFd)

	s := &scanner{
		dir:    dir,
		rootFd: rootFd,
		opts:   opts,
		inodes: map[devIno]*node{},
		t:      &tree{},
	}
	var st unix.Stat_t
	if err := unix.Fstat(rootFd, &st); err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", dir, err)
	}
	s.t.root = s.newNode(&st)
	if s.t.root.xattrs, err = s.xattrs(xattrSource{fd: rootFd}, ""); err != nil {
		return Info{}, err
	}
	if err := s.scanDir(ctx, rootFd, "", s.t.root); err != nil {
		return Info{}, err
	}
	return s.t.write(ctx, out, opts)
}

type devIno struct{ dev, ino uint64 }

type scanner struct {
	dir string
	// inSandbox: dir is a sandbox's upper directory, a host path; messages
	// users see name its files by their paths in the sandbox.
	inSandbox bool
	rootFd    int
	opts      Options
	inodes    map[devIno]*node // hard-linked inodes seen so far
	total     int64            // bytes of file data so far
	t         *tree
}

func procFd(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// xattrSource names what extended attributes are read from: an open
// file descriptor, or a path whose final component is not followed.
type xattrSource struct {
	fd   int
	path string
}

func (x xattrSource) list(buf []byte) (int, error) {
	if x.path == "" {
		return unix.Flistxattr(x.fd, buf)
	}
	return unix.Llistxattr(x.path, buf)
}

func (x xattrSource) get(name string, buf []byte) (int, error) {
	if x.path == "" {
		return unix.Fgetxattr(x.fd, name, buf)
	}
	return unix.Lgetxattr(x.path, name, buf)
}

func (s *scanner) newNode(st *unix.Stat_t) *node {
	n := &node{
		mode:    st.Mode & (typeMask | 0o7777),
		uid:     st.Uid,
		gid:     st.Gid,
		mtime:   max(int64(st.Mtim.Sec), 0),
		mtimeNs: uint32(st.Mtim.Nsec),
	}
	if n.mtime == 0 {
		n.mtimeNs = 0
	}
	if n.isDir() {
		n.children = map[string]*node{}
	}
	return n
}

// scanDir adds the entries of the open directory fd, at rel, to d.
func (s *scanner) scanDir(ctx context.Context, fd int, rel string, d *node) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	names, err := readDirNames(fd)
	if err != nil {
		return fmt.Errorf("read directory %s: %w", s.path(rel), err)
	}
	dirPath := procFd(fd)
	for _, name := range names {
		crel := name
		if rel != "" {
			crel = rel + "/" + name
		}
		var st unix.Stat_t
		err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			continue // removed since the directory was read
		}
		if err != nil {
			return fmt.Errorf("stat %s: %w", s.path(crel), err)
		}

		key := devIno{uint64(st.Dev), st.Ino}
		if st.Mode&typeMask != typeDir && st.Nlink > 1 {
			if n, ok := s.inodes[key]; ok {
				d.children[name] = n
				continue
			}
		}

		n := s.newNode(&st)
		switch st.Mode & typeMask {
		case typeDir:
			cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if err != nil {
				return fmt.Errorf("open %s: %w", s.path(crel), err)
			}
			err = s.scanSubdir(ctx, cfd, crel, n, &st)
			unix.Close(cfd)
			if err != nil {
				return err
			}
			d.children[name] = n
			continue
		case typeReg:
			n.size = st.Size
			s.total += st.Size
			if s.opts.MaxSize > 0 && s.total > s.opts.MaxSize {
				return tooBig(s.opts.MaxSize)
			}
			if st.Size > 0 {
				n.data = &dirSource{s: s, rel: crel, key: key, size: st.Size, ctime: st.Ctim}
			}
		case typeSymlink:
			if n.target, err = readlinkat(fd, name); err != nil {
				return fmt.Errorf("read link %s: %w", s.path(crel), err)
			}
		case typeFifo:
		case typeChar:
			if !s.opts.KeepWhiteouts || st.Rdev != 0 {
				s.t.skipped++
				continue
			}
		default: // block devices, sockets
			s.t.skipped++
			continue
		}
		// The parent is pinned by its descriptor; the name is not followed.
		if n.xattrs, err = s.xattrs(xattrSource{path: dirPath + "/" + name}, crel); err != nil {
			return err
		}
		if st.Nlink > 1 {
			s.inodes[key] = n
		}
		d.children[name] = n
	}
	return nil
}

func (s *scanner) scanSubdir(ctx context.Context, fd int, rel string, n *node, st *unix.Stat_t) error {
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return fmt.Errorf("stat %s: %w", s.path(rel), err)
	}
	if fst.Dev != st.Dev || fst.Ino != st.Ino {
		return s.changed(rel)
	}
	var err error
	if n.xattrs, err = s.xattrs(xattrSource{fd: fd}, rel); err != nil {
		return err
	}
	return s.scanDir(ctx, fd, rel, n)
}

func (s *scanner) path(rel string) string {
	if rel == "" {
		return s.dir
	}
	return s.dir + "/" + rel
}

// shown is how a message users see names the file at rel.
func (s *scanner) shown(rel string) string {
	if s.inSandbox {
		return "/" + rel + " in the sandbox"
	}
	return s.path(rel)
}

func (s *scanner) changed(rel string) error {
	return errdefs.Newf(errdefs.ErrFailedPrecondition,
		"%s changed while the layer was built; stop what writes to it and build again", s.shown(rel))
}

// xattrs reads the extended attributes of p without following a final
// symbolic link, keeping those keepXattr wants.
func (s *scanner) xattrs(p xattrSource, rel string) (map[string]string, error) {
	names, err := listXattrs(p)
	if err != nil {
		return nil, fmt.Errorf("list extended attributes of %s: %w", s.path(rel), err)
	}
	var out map[string]string
	for _, name := range names {
		if !keepXattr(name) {
			continue
		}
		v, err := getXattr(p, name)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read extended attribute %s of %s: %w", name, s.path(rel), err)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = v
	}
	if err := checkXattrs(out); err != nil {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: %v", s.shown(rel), err)
	}
	return out, nil
}

func listXattrs(p xattrSource) ([]string, error) {
	for {
		sz, err := p.list(nil)
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if sz == 0 {
			return nil, nil
		}
		buf := make([]byte, sz)
		sz, err = p.list(buf)
		if errors.Is(err, unix.ERANGE) {
			continue // grew in between
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for n := range strings.SplitSeq(string(buf[:sz]), "\x00") {
			if n != "" {
				names = append(names, n)
			}
		}
		return names, nil
	}
}

func getXattr(p xattrSource, name string) (string, error) {
	for {
		sz, err := p.get(name, nil)
		if err != nil {
			return "", err
		}
		buf := make([]byte, sz)
		sz, err = p.get(name, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:sz]), nil
	}
}

func readDirNames(fd int) ([]string, error) {
	// A duplicate descriptor, so that closing the os.File leaves fd open.
	dfd, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dfd), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

func readlinkat(fd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(fd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// dirSource is a regular file of the source tree. It is opened beneath
// the root without following any symbolic link, and must still be the
// inode the scan saw, unchanged (same size and change time).
type dirSource struct {
	s     *scanner
	rel   string
	key   devIno
	size  int64
	ctime unix.Timespec
}

func (d *dirSource) open(context.Context) (io.ReadCloser, error) {
	fd, err := unix.Openat2(d.s.rootFd, d.rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return nil, d.s.changed(d.rel)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", d.s.path(d.rel), err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat %s: %w", d.s.path(d.rel), err)
	}
	if st.Mode&typeMask != typeReg || (devIno{uint64(st.Dev), st.Ino}) != d.key ||
		st.Size != d.size || st.Ctim != d.ctime {
		unix.Close(fd)
		return nil, d.s.changed(d.rel)
	}
	return os.NewFile(uintptr(fd), d.s.path(d.rel)), nil
}
