// Package layer builds the read-only EROFS layers that make up a sandbox's
// root file system, from a directory tree or from a tar stream, in pure Go.
//
// Both builders first read their source into an in-memory tree of inodes
// (metadata only; file data stays in the source or in a spool file), then
// hand the tree to github.com/erofs/go-erofs to write the image.
//
// Invariants:
//   - The image is a function of the tree alone: the same input gives the
//     same bytes. The superblock's build time is derived from the tree (the
//     most common modification time) and its UUID is left zero.
//   - Hard links are one inode in the image: every name of a linked inode
//     points at the same inode number, whose link count is the number of
//     names in the layer.
//   - Nothing outside the output (and a spool file in Options.TempDir, removed
//     before return) is written, whatever the input.
//   - Character and block devices and sockets never enter a layer (a sandbox
//     gets its own /dev); only overlayfs whiteouts (character device 0:0) do,
//     and only with Options.KeepWhiteouts or, converted from OCI whiteout
//     files, Options.OCIWhiteouts.
package layer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/erofs/go-erofs"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Options tune a build. The zero value works.
type Options struct {
	// KeepWhiteouts keeps overlayfs whiteouts (character devices 0:0) in
	// the layer; pack_diff needs them. By default they are skipped like any
	// other device node.
	KeepWhiteouts bool
	// OCIWhiteouts converts the whiteouts of OCI and docker image layers
	// in a tar stream to overlayfs's forms: "dir/.wh.NAME" becomes a
	// whiteout (character device 0:0) dir/NAME and "dir/.wh..wh..opq"
	// makes dir opaque (OpaqueXattr). See oci.go.
	OCIWhiteouts bool
	// TempDir holds temporary files: the spool of file data read from a
	// tar stream, and the image itself when out is not a file. Empty means
	// os.TempDir().
	TempDir string
	// MaxSize, when positive, limits the total size of the file data in
	// the layer: a source holding more fails the build with
	// ErrResourceExhausted (a decompression bomb stops there).
	MaxSize int64
	// Progress, when set, is called from the building goroutine while file
	// data is written into the image, with the number of regular files and
	// bytes of file data written so far.
	Progress func(files int, bytes int64)
}

// Info describes a built layer.
type Info struct {
	// Digest is "sha256:<hex>" of the image bytes.
	Digest string
	// Size is the image's length in bytes.
	Size int64
	// Files is the number of names in the layer, its root excluded
	// (directories, files, symbolic links, fifos, whiteouts; each name of
	// a hard-linked inode counts).
	Files int
	// Skipped counts the entries of the source left out: device nodes,
	// sockets, and tar entries of kinds a layer cannot hold.
	Skipped int
}

// Unix file type bits, as in stat(2) and on disk in EROFS.
const (
	typeMask    = 0o170000
	typeReg     = 0o100000
	typeDir     = 0o040000
	typeSymlink = 0o120000
	typeChar    = 0o020000
	typeFifo    = 0o010000
)

// EROFS dirent file types.
const (
	ftReg     = 1
	ftDir     = 2
	ftChar    = 3
	ftFifo    = 5
	ftSymlink = 7
)

// tooBig is the error of a source past Options.MaxSize.
func tooBig(max int64) error {
	return errdefs.Newf(errdefs.ErrResourceExhausted, "layer holds more than %d bytes of file data, the limit of this build", max)
}

// Limits the kernel puts on what it will read back.
const (
	maxNameLen     = 255   // one path component
	maxPathLen     = 4096  // a whole path inside the layer
	maxTargetLen   = 4095  // a symbolic link's target
	maxXattrName   = 255   // XATTR_NAME_MAX
	maxXattrValue  = 65536 // XATTR_SIZE_MAX
	maxXattrIcount = 0xffff
)

// source yields the data of one regular file.
type source interface {
	open(ctx context.Context) (io.ReadCloser, error)
}

// node is one inode of the layer being built.
type node struct {
	mode     uint32 // type and permission bits, as st_mode
	uid, gid uint32
	mtime    int64 // seconds since the epoch, >= 0
	mtimeNs  uint32
	xattrs   map[string]string
	target   string // symbolic link target
	size     int64  // regular file size
	data     source // regular file data, when size > 0

	children map[string]*node // directories only

	// Set by tree.plan.
	primary string // the first name of the inode, in walk order
	links   uint32 // names of the inode in the tree
}

func (n *node) isDir() bool { return n.mode&typeMask == typeDir }

// fileMode converts the node's mode to an fs.FileMode.
func (n *node) fileMode() fs.FileMode {
	m := fs.FileMode(n.mode & 0o777)
	if n.mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if n.mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if n.mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch n.mode & typeMask {
	case typeDir:
		m |= fs.ModeDir
	case typeSymlink:
		m |= fs.ModeSymlink
	case typeChar:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case typeFifo:
		m |= fs.ModeNamedPipe
	}
	return m
}

func (n *node) direntType() byte {
	switch n.mode & typeMask {
	case typeDir:
		return ftDir
	case typeSymlink:
		return ftSymlink
	case typeChar:
		return ftChar
	case typeFifo:
		return ftFifo
	}
	return ftReg
}

// keepXattr reports whether an extended attribute belongs in a layer:
// user and trusted attributes (overlayfs keeps its own there) and file
// capabilities. Security labels of the build host and POSIX ACLs (which
// the image writer cannot encode) are dropped.
func keepXattr(name string) bool {
	return strings.HasPrefix(name, "user.") && len(name) > len("user.") ||
		strings.HasPrefix(name, "trusted.") && len(name) > len("trusted.") ||
		name == "security.capability"
}

// checkXattrs reports xattrs the image cannot hold.
func checkXattrs(x map[string]string) error {
	size := 12
	for k, v := range x {
		if len(k) > maxXattrName {
			return fmt.Errorf("extended attribute name %.40q… longer than %d bytes", k, maxXattrName)
		}
		if len(v) > maxXattrValue {
			return fmt.Errorf("extended attribute %q: value longer than %d bytes", k, maxXattrValue)
		}
		size += (4 + len(k) + len(v) + 3) &^ 3
	}
	if (size-12)/4+1 > maxXattrIcount {
		return fmt.Errorf("extended attributes take %d bytes, more than an inode holds", size)
	}
	return nil
}

// tree is the layer being built.
type tree struct {
	root    *node
	skipped int
}

func newDir(mode uint32) *node {
	return &node{mode: typeDir | mode&0o7777, children: map[string]*node{}}
}

// entry is one name of the planned tree.
type entry struct {
	path string // relative to the root, "" for the root
	n    *node
}

// plan walks the tree depth first, names sorted, counts each inode's names
// and picks its primary name (the first met). It returns every name but
// the root's. It runs once per tree.
func (t *tree) plan() []entry {
	var out []entry
	var walk func(dir string, d *node)
	walk = func(dir string, d *node) {
		for _, name := range sortedNames(d) {
			c := d.children[name]
			p := name
			if dir != "" {
				p = dir + "/" + name
			}
			if c.links == 0 {
				c.primary = p
			}
			c.links++
			out = append(out, entry{p, c})
			if c.isDir() {
				walk(p, c)
			}
		}
	}
	t.root.links = 1
	walk("", t.root)
	return out
}

func sortedNames(d *node) []string {
	names := make([]string, 0, len(d.children))
	for name := range d.children {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// buildTime picks the superblock's build time: the most common whole-second
// modification time, so that most inodes can use the compact format, which
// has no time of its own; without any, the newest modification time.
func buildTime(root *node, entries []entry) uint64 {
	count := map[int64]int{}
	var newest int64
	consider := func(n *node) {
		newest = max(newest, n.mtime)
		if n.mtimeNs == 0 {
			count[n.mtime]++
		}
	}
	consider(root)
	for _, e := range entries {
		if e.n.primary == e.path {
			consider(e.n)
		}
	}
	best, bestN := newest, 0
	for t, c := range count {
		if c > bestN || c == bestN && t < best {
			best, bestN = t, c
		}
	}
	return uint64(best)
}

// readWriterAt is what the builder needs of its output to patch and hash
// the image in place; an *os.File has it.
type readWriterAt interface {
	io.WriteSeeker
	io.ReaderAt
	io.WriterAt
}

// write turns the tree into an EROFS image on out.
func (t *tree) write(ctx context.Context, out io.WriteSeeker, opts Options) (Info, error) {
	if pos, err := out.Seek(0, io.SeekCurrent); err != nil {
		return Info{}, fmt.Errorf("seek output: %w", err)
	} else if pos != 0 {
		return Info{}, errdefs.Newf(errdefs.ErrInvalidArgument, "layer output must start at offset 0, not %d", pos)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, err
	}

	img, direct := out.(readWriterAt)
	if !direct {
		f, err := os.CreateTemp(opts.TempDir, ".layer-*.erofs")
		if err != nil {
			return Info{}, fmt.Errorf("create temporary image: %w", err)
		}
		_ = os.Remove(f.Name())
		defer f.Close()
		img = f
	}

	entries := t.plan()
	bt := buildTime(t.root, entries)
	b := &writeState{ctx: ctx, progress: opts.Progress}
	defer b.closeAll()
	cw := &countingWriter{w: img}
	w := erofs.Create(cw, erofs.WithBuildTime(bt, 0), erofs.WithTempDir(opts.TempDir))
	if err := w.CopyFrom(&treeFS{t: t, state: b}); err != nil {
		return Info{}, fmt.Errorf("lay out image: %w", err)
	}

	// Metadata the writer does not take from fs.FileInfo.
	setMeta := func(p string, n *node) error {
		wp := "/" + p
		if err := w.Chown(wp, int(n.uid), int(n.gid)); err != nil {
			return err
		}
		mt := time.Unix(n.mtime, int64(n.mtimeNs))
		if err := w.Chtimes(wp, mt, mt); err != nil {
			return err
		}
		for _, k := range slices.Sorted(maps.Keys(n.xattrs)) {
			if err := w.Setxattr(wp, k, n.xattrs[k]); err != nil {
				return err
			}
		}
		links := n.links
		if n.isDir() {
			links = 2
			for _, c := range n.children {
				if c.isDir() {
					links++
				}
			}
		}
		return w.SetNlink(wp, links)
	}
	if err := setMeta("", t.root); err != nil {
		return Info{}, fmt.Errorf("set metadata of /: %w", err)
	}
	var links []entry
	for _, e := range entries {
		if e.n.primary != e.path {
			// A further name of a hard-linked inode: an empty placeholder
			// whose dirent is pointed at the primary inode below.
			links = append(links, e)
			if err := w.Chtimes("/"+e.path, time.Unix(int64(bt), 0), time.Unix(int64(bt), 0)); err != nil {
				return Info{}, fmt.Errorf("set metadata of %q: %w", e.path, err)
			}
			continue
		}
		if err := setMeta(e.path, e.n); err != nil {
			return Info{}, fmt.Errorf("set metadata of %q: %w", e.path, err)
		}
	}
	if err := w.Close(); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return Info{}, ctxErr
		}
		return Info{}, fmt.Errorf("write image: %w", err)
	}
	b.report()
	size := cw.max

	if len(links) > 0 {
		if err := linkNames(img, links); err != nil {
			return Info{}, fmt.Errorf("link hard-linked names: %w", err)
		}
	}

	h := sha256.New()
	var r io.Reader = io.NewSectionReader(img, 0, size)
	if !direct {
		r = io.TeeReader(r, h)
		if _, err := io.Copy(out, r); err != nil {
			return Info{}, fmt.Errorf("copy image to output: %w", err)
		}
	} else if _, err := io.Copy(h, r); err != nil {
		return Info{}, fmt.Errorf("hash image: %w", err)
	}
	if tr, ok := out.(interface{ Truncate(int64) error }); ok && direct {
		if err := tr.Truncate(size); err != nil {
			return Info{}, fmt.Errorf("truncate output: %w", err)
		}
	}
	return Info{
		Digest:  "sha256:" + hex.EncodeToString(h.Sum(nil)),
		Size:    size,
		Files:   len(entries),
		Skipped: t.skipped,
	}, nil
}

// countingWriter tracks the end of what was written through it.
type countingWriter struct {
	w   io.WriteSeeker
	pos int64
	max int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.pos += int64(n)
	c.max = max(c.max, c.pos)
	return n, err
}

func (c *countingWriter) Seek(off int64, whence int) (int64, error) {
	pos, err := c.w.Seek(off, whence)
	if err == nil {
		c.pos = pos
	}
	return pos, err
}

// writeState is shared by the file readers of one build. It carries the
// build's ctx because the image writer drives the readers through
// io.Reader, which has no place for one.
type writeState struct {
	ctx      context.Context
	progress func(files int, bytes int64)
	open     []io.Closer // closed at the end whatever happens

	files    int
	bytes    int64
	reported int64
}

func (s *writeState) report() {
	if s.progress != nil && s.bytes != s.reported {
		s.reported = s.bytes
		s.progress(s.files, s.bytes)
	}
}

func (s *writeState) closeAll() {
	for _, c := range s.open {
		_ = c.Close()
	}
	s.open = nil
}

// treeFS presents the tree to erofs.Writer.CopyFrom. Further names of a
// hard-linked inode appear as empty regular files.
type treeFS struct {
	t     *tree
	state *writeState
}

func (f *treeFS) lookup(name string) (*node, string, error) {
	if !fs.ValidPath(name) && name != "." {
		return nil, "", &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	n := f.t.root
	if name == "." {
		return n, "", nil
	}
	for part := range strings.SplitSeq(name, "/") {
		c, ok := n.children[part]
		if !ok {
			return nil, "", &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		n = c
	}
	return n, name, nil
}

func (f *treeFS) info(p string, n *node) *fileInfo {
	return &fileInfo{name: path.Base(p), n: n, placeholder: p != "" && n.primary != p}
}

func (f *treeFS) Stat(name string) (fs.FileInfo, error) {
	n, p, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	return f.info(p, n), nil
}

func (f *treeFS) ReadDir(name string) ([]fs.DirEntry, error) {
	d, p, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	if !d.isDir() {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: errors.New("not a directory")}
	}
	var out []fs.DirEntry
	for _, cn := range sortedNames(d) {
		cp := cn
		if p != "" {
			cp = p + "/" + cn
		}
		out = append(out, f.info(cp, d.children[cn]))
	}
	return out, nil
}

func (f *treeFS) ReadLink(name string) (string, error) {
	n, _, err := f.lookup(name)
	if err != nil {
		return "", err
	}
	return n.target, nil
}

func (f *treeFS) Open(name string) (fs.File, error) {
	n, p, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	fi := f.info(p, n)
	if fi.placeholder || n.mode&typeMask != typeReg || n.size == 0 {
		return &dataFile{fi: fi, state: f.state}, nil
	}
	return &dataFile{fi: fi, state: f.state, src: n.data, size: n.size}, nil
}

// fileInfo is both the fs.FileInfo and the fs.DirEntry of a name.
type fileInfo struct {
	name        string
	n           *node
	placeholder bool
}

func (i *fileInfo) Name() string { return i.name }
func (i *fileInfo) Size() int64 {
	if i.placeholder || i.n.mode&typeMask != typeReg {
		return 0
	}
	return i.n.size
}

func (i *fileInfo) Mode() fs.FileMode {
	if i.placeholder {
		return 0
	}
	return i.n.fileMode()
}
func (i *fileInfo) ModTime() time.Time         { return time.Unix(i.n.mtime, int64(i.n.mtimeNs)) }
func (i *fileInfo) IsDir() bool                { return !i.placeholder && i.n.isDir() }
func (i *fileInfo) Sys() any                   { return nil }
func (i *fileInfo) Type() fs.FileMode          { return i.Mode().Type() }
func (i *fileInfo) Info() (fs.FileInfo, error) { return i, nil }

// dataFile reads a regular file's data for the image writer. It opens its
// source on the first Read, so that only one file is open at a time, and
// fails when the source ends before the size the tree recorded.
type dataFile struct {
	fi    *fileInfo
	state *writeState
	src   source
	size  int64

	r      io.ReadCloser
	read   int64
	closed bool
}

func (d *dataFile) Stat() (fs.FileInfo, error) { return d.fi, nil }

func (d *dataFile) Read(p []byte) (int, error) {
	if d.closed {
		return 0, fs.ErrClosed
	}
	if err := d.state.ctx.Err(); err != nil {
		return 0, err
	}
	if d.read >= d.size {
		return 0, io.EOF
	}
	if d.r == nil {
		if d.src == nil {
			return 0, io.EOF
		}
		r, err := d.src.open(d.state.ctx)
		if err != nil {
			return 0, err
		}
		d.r = r
		d.state.open = append(d.state.open, r)
	}
	if rest := d.size - d.read; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := d.r.Read(p)
	d.read += int64(n)
	d.state.bytes += int64(n)
	if d.read == d.size {
		d.state.files++
		d.state.report()
		return n, io.EOF
	}
	if d.state.bytes-d.state.reported >= 16<<20 {
		d.state.report()
	}
	if err == io.EOF {
		return n, fmt.Errorf("%s: %w: source ended at %d of %d bytes", d.fi.name, io.ErrUnexpectedEOF, d.read, d.size)
	}
	return n, err
}

func (d *dataFile) Close() error {
	if d.closed {
		return nil
	}
	d.closed = true
	if d.r != nil {
		err := d.r.Close()
		d.state.open = slices.DeleteFunc(d.state.open, func(c io.Closer) bool { return c == d.r })
		return err
	}
	return nil
}
