package layer

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// BuildFromTar writes to out an EROFS image of the tree a tar stream
// describes, without extracting it. The stream may be gzip-compressed
// (detected by its magic number). out must be empty (positioned at 0); it
// is normally an *os.File, otherwise the image is assembled in
// Options.TempDir first.
//
// The stream is untrusted. Entries are refused with ErrInvalidArgument
// (the message names the entry) when their name is absolute, contains a
// NUL byte or leaves the root through "..", when a hard link's target is
// not an earlier entry of the stream, or when a name goes through a file
// or symbolic link. "./x", "x/" and "x" name the same entry; a later entry
// replaces an earlier one of the same name (a directory over a directory
// only updates its metadata). Parent directories the stream leaves out are
// created 0755, owned by 0:0. PAX SCHILY.xattr.* records become extended
// attributes (see keepXattr for which). Symbolic link targets are kept as
// they are: absolute targets resolve inside the sandbox at run time.
func BuildFromTar(ctx context.Context, r io.Reader, out io.WriteSeeker, opts Options) (Info, error) {
	spool, err := os.CreateTemp(opts.TempDir, ".layer-spool-*")
	if err != nil {
		return Info{}, fmt.Errorf("create spool: %w", err)
	}
	_ = os.Remove(spool.Name())
	defer spool.Close()

	t, err := readTar(ctx, r, spool, opts)
	if err != nil {
		return Info{}, err
	}
	return t.write(ctx, out, opts)
}

// readTar reads the stream into a tree; file data goes to spool.
func readTar(ctx context.Context, r io.Reader, spool *os.File, opts Options) (*tree, error) {
	src := &errReader{r: r}
	br := bufio.NewReaderSize(src, 64<<10)
	magic, _ := br.Peek(4) // a short stream is judged by the tar reader
	if len(magic) == 0 {
		if src.err != nil {
			return nil, fmt.Errorf("read tar: %w", src.err)
		}
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "tar stream is empty")
	}
	var tr *tar.Reader
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			if src.err != nil {
				return nil, fmt.Errorf("read tar: %w", src.err)
			}
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "tar stream: bad gzip header: %v", err)
		}
		defer zr.Close()
		tr = tar.NewReader(zr)
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "tar stream is zstd-compressed; only plain and gzip tar are supported: decompress it first")
	default:
		tr = tar.NewReader(br)
	}

	tb := &tarBuilder{
		t:     &tree{root: newDir(0o755)},
		spool: spool,
		opts:  opts,
	}
	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, tar.ErrInsecurePath) && hdr != nil {
			err = nil // judged by cleanName below, with a better message
		}
		if err == io.EOF {
			tb.finishOCI()
			return tb.t, nil
		}
		if err != nil {
			return nil, tb.readErr(ctx, src, fmt.Sprintf("tar entry #%d", i+1), err)
		}
		if err := tb.add(ctx, hdr, tr, src); err != nil {
			return nil, err
		}
	}
}

// errReader remembers the first error of the underlying reader, so that
// an I/O error is not mistaken for a malformed stream.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

type tarBuilder struct {
	t       *tree
	spool   *os.File
	off     int64
	opts    Options
	skipped map[string]bool // names of skipped entries
	opaque  []string        // directories with an OCI opaque marker
}

// skip leaves out the entry at name, and hard links to it later.
func (b *tarBuilder) skip(name string) {
	b.t.skipped++
	if b.skipped == nil {
		b.skipped = map[string]bool{}
	}
	b.skipped[name] = true
}

// readErr classifies an error met while reading the stream.
func (b *tarBuilder) readErr(ctx context.Context, src *errReader, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if src.err != nil {
		return fmt.Errorf("read tar: %w", src.err)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%s: tar stream is truncated", what)
	}
	return errdefs.Newf(errdefs.ErrInvalidArgument, "%s: malformed tar stream: %v", what, err)
}

func invalid(name, format string, args ...any) error {
	return errdefs.Newf(errdefs.ErrInvalidArgument, "tar entry %q: %s", short(name), fmt.Sprintf(format, args...))
}

// short cuts a name for an error message.
func short(name string) string {
	if len(name) > 120 {
		return name[:100] + "…" + name[len(name)-10:]
	}
	return name
}

// cleanName turns a tar entry name into a path relative to the layer's
// root ("" for the root itself). It refuses empty and absolute names,
// names with a NUL byte, names whose ".." components leave the root, and
// names longer than the kernel reads back; "./x", "x/" and "x//y" are
// normalized.
func cleanName(name string) (string, error) {
	switch {
	case name == "":
		return "", errors.New("empty name")
	case strings.IndexByte(name, 0) >= 0:
		return "", errors.New("name contains a NUL byte")
	case name[0] == '/':
		return "", errors.New("absolute name; names must be relative to the layer root")
	case len(name) > maxPathLen:
		return "", fmt.Errorf("name longer than %d bytes", maxPathLen)
	}
	parts := make([]string, 0, strings.Count(name, "/")+1)
	for p := range strings.SplitSeq(name, "/") {
		switch p {
		case "", ".":
		case "..":
			if len(parts) == 0 {
				return "", errors.New(`name leaves the layer root through ".."`)
			}
			parts = parts[:len(parts)-1]
		default:
			if len(p) > maxNameLen {
				return "", fmt.Errorf("path component longer than %d bytes", maxNameLen)
			}
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "/"), nil
}

// add applies one tar entry to the tree.
func (b *tarBuilder) add(ctx context.Context, hdr *tar.Header, tr *tar.Reader, src *errReader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // PAX defaults; the tar reader applies them
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return invalid(hdr.Name, "%v", err)
	}
	if b.opts.OCIWhiteouts && hdr.Typeflag != tar.TypeLink {
		if done, err := b.ociWhiteout(hdr, name); done {
			return err
		}
	}

	if isSparse(hdr) {
		// The image cannot keep holes: a few bytes of sparse map could
		// expand to terabytes of zeros.
		return invalid(hdr.Name, "sparse files are not supported; write the tar without --sparse")
	}

	var n *node
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeCont:
		n = &node{mode: typeReg}
	case tar.TypeDir:
		n = newDir(0)
	case tar.TypeSymlink:
		switch {
		case hdr.Linkname == "":
			return invalid(hdr.Name, "symbolic link with an empty target")
		case strings.IndexByte(hdr.Linkname, 0) >= 0:
			return invalid(hdr.Name, "symbolic link target contains a NUL byte")
		case len(hdr.Linkname) > maxTargetLen:
			return invalid(hdr.Name, "symbolic link target longer than %d bytes", maxTargetLen)
		}
		n = &node{mode: typeSymlink, target: hdr.Linkname}
	case tar.TypeFifo:
		n = &node{mode: typeFifo}
	case tar.TypeChar:
		if !b.opts.KeepWhiteouts || hdr.Devmajor != 0 || hdr.Devminor != 0 {
			b.skip(name)
			return nil
		}
		n = &node{mode: typeChar}
	case tar.TypeLink:
		return b.link(hdr, name)
	default:
		// Block devices, and kinds a layer cannot hold (GNU volume
		// headers, multi-volume continuations, ...).
		b.skip(name)
		return nil
	}

	if name == "" && !n.isDir() {
		return invalid(hdr.Name, "the root must be a directory")
	}
	if hdr.Uid < 0 || int64(hdr.Uid) > 1<<32-1 || hdr.Gid < 0 || int64(hdr.Gid) > 1<<32-1 {
		return invalid(hdr.Name, "owner %d:%d out of range", hdr.Uid, hdr.Gid)
	}
	n.mode |= uint32(hdr.Mode) & 0o7777
	n.uid, n.gid = uint32(hdr.Uid), uint32(hdr.Gid)
	if mt := hdr.ModTime; mt.Unix() > 0 {
		n.mtime, n.mtimeNs = mt.Unix(), uint32(mt.Nanosecond())
	}
	for k, v := range hdr.PAXRecords {
		if x, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok && keepXattr(x) {
			if n.xattrs == nil {
				n.xattrs = map[string]string{}
			}
			n.xattrs[x] = v
		}
	}
	if err := checkXattrs(n.xattrs); err != nil {
		return invalid(hdr.Name, "%v", err)
	}

	if n.mode&typeMask == typeReg {
		if err := b.copyData(ctx, hdr, n, tr, src); err != nil {
			return err
		}
	}
	return b.put(hdr.Name, name, n)
}

// isSparse reports whether hdr is a GNU sparse file, old or PAX style.
func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// copyData spools a regular file's data.
func (b *tarBuilder) copyData(ctx context.Context, hdr *tar.Header, n *node, tr *tar.Reader, src *errReader) error {
	w := &ctxWriter{ctx: ctx, w: io.NewOffsetWriter(b.spool, b.off), limit: -1}
	if b.opts.MaxSize > 0 {
		w.limit = b.opts.MaxSize - b.off
	}
	size, err := io.Copy(w, tr)
	if err != nil {
		if errors.Is(w.err, errLimit) {
			return tooBig(b.opts.MaxSize)
		}
		if w.err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return ctxErr
			}
			return fmt.Errorf("spool tar entry %q: %w", hdr.Name, w.err)
		}
		return b.readErr(ctx, src, fmt.Sprintf("tar entry %q", hdr.Name), err)
	}
	n.size = size
	if size > 0 {
		n.data = &spoolSource{f: b.spool, off: b.off, size: size}
	}
	b.off += size
	return nil
}

// ctxWriter stops a copy when ctx is done or past a limit, and tells
// write errors from read errors. It lives for one io.Copy.
type ctxWriter struct {
	ctx   context.Context
	w     io.Writer
	limit int64 // bytes it may still write; negative: no limit
	err   error
}

var errLimit = errors.New("size limit reached")

func (c *ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		c.err = err
		return 0, err
	}
	if c.limit >= 0 {
		if int64(len(p)) > c.limit {
			c.err = errLimit
			return 0, errLimit
		}
		c.limit -= int64(len(p))
	}
	n, err := c.w.Write(p)
	if err != nil {
		c.err = err
	}
	return n, err
}

// link makes name a further name of an earlier entry's inode.
func (b *tarBuilder) link(hdr *tar.Header, name string) error {
	if strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return invalid(hdr.Name, "hard link target contains a NUL byte")
	}
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return invalid(hdr.Name, "hard link target %q: %v", short(hdr.Linkname), err)
	}
	n := b.t.root
	if target != "" {
		parent, base := splitPath(target)
		d, err := b.lookupDir(parent)
		if err == nil {
			n = d.children[base]
		}
		if (err != nil || n == nil) && b.skipped[target] {
			b.skip(name)
			return nil
		}
		if err != nil || n == nil {
			return invalid(hdr.Name, "hard link target %q is not an earlier entry of the stream", short(hdr.Linkname))
		}
	}
	if n.isDir() {
		return invalid(hdr.Name, "hard link target %q is a directory", short(hdr.Linkname))
	}
	if name == "" {
		return invalid(hdr.Name, "the root must be a directory")
	}
	return b.put(hdr.Name, name, n)
}

// lookupDir returns the directory at p without creating anything.
func (b *tarBuilder) lookupDir(p string) (*node, error) {
	d := b.t.root
	if p == "" {
		return d, nil
	}
	for part := range strings.SplitSeq(p, "/") {
		c := d.children[part]
		if c == nil || !c.isDir() {
			return nil, errdefs.ErrNotFound
		}
		d = c
	}
	return d, nil
}

// put places n at name, creating missing parents and replacing what was
// there, as tar -x does.
func (b *tarBuilder) put(raw, name string, n *node) error {
	if name == "" {
		setDirMeta(b.t.root, n)
		return nil
	}
	parent, base := splitPath(name)
	d := b.t.root
	if parent != "" {
		seen := 0
		for part := range strings.SplitSeq(parent, "/") {
			seen += len(part) + 1
			c := d.children[part]
			switch {
			case c == nil:
				c = newDir(0o755)
				d.children[part] = c
			case !c.isDir():
				return invalid(raw, "parent %q is not a directory", short(parent[:seen-1]))
			}
			d = c
		}
	}
	if old := d.children[base]; old != nil && old.isDir() && n.isDir() {
		setDirMeta(old, n)
		return nil
	}
	d.children[base] = n
	return nil
}

// setDirMeta gives dir the metadata of a later entry for it, keeping its
// contents.
func setDirMeta(dir, n *node) {
	dir.mode, dir.uid, dir.gid = n.mode, n.uid, n.gid
	dir.mtime, dir.mtimeNs, dir.xattrs = n.mtime, n.mtimeNs, n.xattrs
}

// spoolSource is a regular file's data in the spool.
type spoolSource struct {
	f         *os.File
	off, size int64
}

func (s *spoolSource) open(context.Context) (io.ReadCloser, error) {
	return &sectionCloser{io.NewSectionReader(s.f, s.off, s.size)}, nil
}

type sectionCloser struct{ *io.SectionReader }

func (*sectionCloser) Close() error { return nil }
