package sandboxfs

import (
	"archive/tar"
	"io"
	"strings"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// maxNameLen is the longest file name (one path element) in bytes.
const maxNameLen = 255

// ValidateTar reads the tar archive r to its end and reports whether
// ExtractTar would accept it for extraction into dest (a sandbox path), and
// what it holds. It touches no file system. An archive is refused
// (InvalidArgument, or ResourceExhausted past maxEntries; 0 means
// DefaultMaxEntries) when:
//   - it is not a well-formed tar stream, or is cut short;
//   - a name is empty, absolute, has a NUL byte or a ".." element, has an
//     element longer than 255 bytes, or makes a path longer than MaxPathLen
//     under dest;
//   - an entry is a device node or of an unknown type;
//   - the files' apparent sizes (a sparse entry's holes included) add up to
//     more than DefaultMaxSize (ResourceExhausted);
//   - a hard link does not name an earlier entry, or names a directory;
//   - a name is both a directory and something else, or an entry lies
//     under a name the archive makes a symbolic link or a file, so that it
//     would be written through the archive's own link;
//   - a symbolic link's target, resolved lexically from the link's
//     directory within dest (following the archive's own links, as the
//     kernel would), leaves dest at any step ("links out") or goes round a
//     loop. An absolute target is a sandbox path and must lie under dest as
//     written. Names the archive does not have count as directories.
//
// Duplicate names are allowed; the later entry wins. A directory entry for
// dest itself ("." or "./") is skipped. Owners in the archive are ignored.
func ValidateTar(r io.Reader, dest string, maxEntries int) (TarStats, error) {
	p, err := checkTar(r, dest, maxEntries, 0, false)
	if err != nil {
		return TarStats{}, err
	}
	return p.stats, nil
}

// tarEntry is one checked entry of an archive, in archive order.
type tarEntry struct {
	raw      string // the name as the archive gives it
	name     string // relative to the destination, cleaned
	typ      byte   // tar.TypeReg, TypeDir, TypeSymlink, TypeLink or TypeFifo; 0 when skipped
	mode     uint32 // permission bits to apply
	mtime    time.Time
	size     int64
	linkname string // a symlink's target as it is; a hard link's target, cleaned
}

// tarPlan is a checked archive: one entry per header tar.Reader returns.
type tarPlan struct {
	entries []tarEntry
	stats   TarStats
}

// Kinds of names, as bits: a name can be several across duplicate entries.
const (
	kindDir     = 1 << iota // a directory
	kindNonDir              // anything else
	kindSymlink             // a symbolic link (also kindNonDir)
)

type tarChecker struct {
	destRel   string
	maxSize   int64             // bound of the files' apparent sizes added up
	destComps []string          // destRel's elements; none for the root
	kinds     map[string]uint8  // name → kinds it has been
	current   map[string]byte   // name → type of its latest entry
	links     map[string]string // name → target, when its latest entry is a symlink
	root      *trieNode         // the names, once all entries are read
	plan      tarPlan
}

// checkTar checks an archive as ValidateTar says, with at most maxSize
// bytes of files (0: DefaultMaxSize); with linksAnywhere a symbolic link's
// target is not checked (ExtractOptions.LinksAnywhere).
func checkTar(r io.Reader, dest string, maxEntries int, maxSize int64, linksAnywhere bool) (*tarPlan, error) {
	destRel, err := Clean(dest)
	if err != nil {
		return nil, err
	}
	switch {
	case maxEntries < 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "the entry limit %d is negative", maxEntries)
	case maxEntries == 0:
		maxEntries = DefaultMaxEntries
	}
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	c := &tarChecker{
		destRel: destRel,
		maxSize: maxSize,
		kinds:   map[string]uint8{},
		current: map[string]byte{},
		links:   map[string]string{},
	}
	if destRel != "." {
		c.destComps = strings.Split(destRel, "/")
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument,
				"the archive is not a valid tar stream after %d entries (%v)", len(c.plan.entries), err)
		}
		if len(c.plan.entries) >= maxEntries {
			return nil, errdefs.Newf(errdefs.ErrResourceExhausted,
				"the archive has more than %d entries, the most one upload may have; upload it in parts", maxEntries)
		}
		e, err := c.entry(hdr)
		if err != nil {
			return nil, err
		}
		c.plan.entries = append(c.plan.entries, e)
	}
	if err := c.finish(linksAnywhere); err != nil {
		return nil, err
	}
	return &c.plan, nil
}

func refuse(raw, format string, args ...any) error {
	return errdefs.Newf(errdefs.ErrInvalidArgument, "archive entry %.200q: "+format, append([]any{raw}, args...)...)
}

// entry checks one header on its own and against the entries before it.
func (c *tarChecker) entry(hdr *tar.Header) (tarEntry, error) {
	e := tarEntry{raw: hdr.Name, mtime: hdr.ModTime, size: hdr.Size, mode: uint32(hdr.Mode & 0o7777)}
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		return e, nil // PAX defaults for what follows; tar.Reader applies them
	case tar.TypeReg, tar.TypeGNUSparse:
		// tar.Reader turns the old TypeRegA into TypeReg or TypeDir. It
		// reads sparse entries (PAX GNU.sparse.*, old GNU 'S'), checking
		// their maps against the size they state, and yields their data
		// with the holes as zeros; hdr.Size is that apparent size.
		if hdr.Size < 0 {
			return e, refuse(hdr.Name, "its size %d is negative", hdr.Size)
		}
		e.typ = tar.TypeReg
	case tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
		e.typ = hdr.Typeflag
	case tar.TypeChar, tar.TypeBlock:
		return e, refuse(hdr.Name, "device nodes cannot be uploaded")
	default:
		return e, refuse(hdr.Name, "entries of type %q are not supported", hdr.Typeflag)
	}
	name, err := entryName(hdr.Name, hdr.Name, "its name")
	if err != nil {
		return e, err
	}
	if name == "." {
		if e.typ == tar.TypeDir {
			e.typ = 0 // the destination itself: left as it is
			return e, nil
		}
		return e, refuse(hdr.Name, "it names the destination directory itself")
	}
	if n := len(c.destRel) + 1 + len(name); n >= MaxPathLen {
		return e, refuse(hdr.Name, "the path in the sandbox would be %d bytes long; paths are at most %d bytes", n+1, MaxPathLen-1)
	}
	e.name = name
	if e.typ == tar.TypeDir {
		e.mode &^= 0o4000
	} else {
		e.mode &^= 0o6000 // no setuid or setgid files from an upload
	}
	kind := uint8(kindNonDir)
	switch e.typ {
	case tar.TypeReg:
		if hdr.Size > c.maxSize-c.plan.stats.Bytes {
			return e, errdefs.Newf(errdefs.ErrResourceExhausted,
				"archive entry %.200q: the archive's files add up to more than %d bytes (holes of sparse files included), the most one upload may create; upload less at a time",
				hdr.Name, c.maxSize)
		}
		c.plan.stats.Files++
		c.plan.stats.Bytes += hdr.Size
	case tar.TypeFifo:
		c.plan.stats.Files++
	case tar.TypeDir:
		kind = kindDir
		c.plan.stats.Dirs++
	case tar.TypeSymlink:
		switch t := hdr.Linkname; {
		case t == "":
			return e, refuse(hdr.Name, "the symbolic link has an empty target")
		case strings.IndexByte(t, 0) >= 0:
			return e, refuse(hdr.Name, "the symbolic link's target contains a NUL byte")
		case len(t) >= MaxPathLen:
			return e, refuse(hdr.Name, "the symbolic link's target is %d bytes long; at most %d are allowed", len(t), MaxPathLen-1)
		}
		e.linkname = hdr.Linkname
		kind |= kindSymlink
		c.plan.stats.Links++
	case tar.TypeLink:
		target, err := entryName(hdr.Name, hdr.Linkname, "its hard link target")
		if err != nil {
			return e, err
		}
		switch typ, ok := c.current[target]; {
		case !ok:
			return e, refuse(hdr.Name, "it is a hard link to %.200q, which is not an earlier entry of the archive", hdr.Linkname)
		case typ == tar.TypeDir:
			return e, refuse(hdr.Name, "it is a hard link to %.200q, a directory", hdr.Linkname)
		}
		e.linkname = target
		c.plan.stats.Links++
	}
	c.kinds[name] |= kind
	c.current[name] = e.typ
	if e.typ == tar.TypeSymlink {
		c.links[name] = e.linkname
	} else {
		delete(c.links, name)
	}
	return e, nil
}

// entryName checks the name s of the entry raw and returns it cleaned and
// relative to the destination ("." for the destination itself). what says
// which name it is, for messages.
func entryName(raw, s, what string) (string, error) {
	switch {
	case s == "":
		return "", refuse(raw, "%s is empty", what)
	case strings.IndexByte(s, 0) >= 0:
		return "", refuse(raw, "%s contains a NUL byte", what)
	case s[0] == '/':
		return "", refuse(raw, "%s is an absolute path; archive paths must be relative", what)
	case len(s) >= 4*MaxPathLen:
		return "", refuse(raw, "%s is %d bytes long", what, len(s))
	}
	var b strings.Builder
	for elem := range strings.SplitSeq(s, "/") {
		switch {
		case elem == "" || elem == ".":
			continue
		case elem == "..":
			return "", refuse(raw, "%s has a \"..\" element; archive paths must stay inside the destination", what)
		case len(elem) > maxNameLen:
			return "", refuse(raw, "%s has an element of %d bytes; names are at most %d bytes", what, len(elem), maxNameLen)
		}
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		b.WriteString(elem)
	}
	if b.Len() == 0 {
		return ".", nil
	}
	return b.String(), nil
}

// finish checks what needs the whole archive: names that are both
// directories and not, entries under the archive's own links or files, and
// where the archive's links lead.
func (c *tarChecker) finish(linksAnywhere bool) error {
	c.buildTrie()
	for _, e := range c.plan.entries {
		if e.typ == 0 {
			continue
		}
		if k := c.kinds[e.name]; k&kindDir != 0 && k&kindNonDir != 0 {
			return refuse(e.raw, "%.200q is both a directory and something else in the archive", e.name)
		}
		n, end := c.root, 0 // the node of e.name[:end]
		for elem := range strings.SplitSeq(e.name, "/") {
			switch {
			case n.kind&kindSymlink != 0:
				return refuse(e.raw, "it lies under %.200q, which the archive makes a symbolic link; an archive may not write through its own links", e.name[:end])
			case n.kind&kindNonDir != 0:
				return refuse(e.raw, "it lies under %.200q, which the archive makes something other than a directory", e.name[:end])
			}
			if end > 0 {
				end++
			}
			end += len(elem)
			n = n.children[elem]
		}
	}
	if linksAnywhere {
		return nil
	}
	for _, e := range c.plan.entries {
		if e.typ != tar.TypeSymlink {
			continue
		}
		if _, err := c.walk(place{node: c.node(e.name).parent}, e.linkname); err != nil {
			return refuse(e.raw, "it is a symbolic link to %.200q, which %v", e.linkname, err)
		}
	}
	return nil
}

// linkError says why a link target leaves the destination.
type linkError string

func (e linkError) Error() string { return string(e) }

// trieNode is a name of the archive (the root node is the destination).
type trieNode struct {
	parent   *trieNode
	children map[string]*trieNode
	link     string // the target, when the latest entry of the name is a symlink
	isLink   bool
	kind     uint8 // the kinds the name has been (kindDir...)
	state    uint8 // of the link's resolution: 0 not yet, 1 under way, 2 done
	to       place // where the link leads, once resolved
	err      error // why it leads out, once resolved
}

// place is where a lexical lookup is: a name of the archive, or unknown
// directories below one (names the archive does not have count as
// directories).
type place struct {
	node    *trieNode
	unknown int
}

// buildTrie makes the tree of the archive's names, with the targets of the
// names that end up symbolic links.
func (c *tarChecker) buildTrie() {
	c.root = &trieNode{}
	for name := range c.current {
		c.node(name).kind = c.kinds[name]
	}
	for name, target := range c.links {
		n := c.node(name)
		n.link, n.isLink = target, true
	}
}

// node returns the trie node of name, adding it and its parents if needed.
func (c *tarChecker) node(name string) *trieNode {
	n := c.root
	for elem := range strings.SplitSeq(name, "/") {
		child := n.children[elem]
		if child == nil {
			if n.children == nil {
				n.children = map[string]*trieNode{}
			}
			child = &trieNode{parent: n}
			n.children[elem] = child
		}
		n = child
	}
	return n
}

// walk looks target up lexically from the directory at from, following
// the archive's own links as the kernel would, and returns where it leads,
// or an error if a step leaves the destination. Each link is resolved once,
// so checking an archive takes time in proportion to its size.
func (c *tarChecker) walk(from place, target string) (place, error) {
	elems, err := c.linkElems(target)
	if err != nil {
		return place{}, err
	}
	p := from
	if strings.HasPrefix(target, "/") {
		p = place{node: c.root}
	}
	for _, elem := range elems {
		switch {
		case elem == "" || elem == ".":
		case elem == "..":
			switch {
			case p.unknown > 0:
				p.unknown--
			case p.node == c.root:
				return place{}, linkError("climbs above " + display(c.destRel) + " (links out)")
			default:
				p.node = p.node.parent
			}
		case p.unknown > 0:
			p.unknown++
		default:
			child := p.node.children[elem]
			switch {
			case child == nil:
				p.unknown = 1
			case !child.isLink:
				p.node = child
			default:
				if p, err = c.resolveLink(child); err != nil {
					return place{}, err
				}
			}
		}
	}
	return p, nil
}

// resolveLink returns where the link n leads.
func (c *tarChecker) resolveLink(n *trieNode) (place, error) {
	switch n.state {
	case 1:
		return place{}, linkError("goes round a loop of symbolic links")
	case 2:
		return n.to, n.err
	}
	n.state = 1
	n.to, n.err = c.walk(place{node: n.parent}, n.link)
	n.state = 2
	return n.to, n.err
}

// linkElems splits a link target into the elements to walk from where the
// link is. An absolute target must begin with the destination's elements,
// which are dropped: the walk then starts at the destination.
func (c *tarChecker) linkElems(target string) ([]string, error) {
	elems := strings.Split(target, "/")
	if !strings.HasPrefix(target, "/") {
		return elems, nil
	}
	n := 0 // elements of the destination matched
	for i, elem := range elems {
		if n == len(c.destComps) {
			return elems[i:], nil
		}
		switch {
		case elem == "" || elem == ".":
		case elem == c.destComps[n]:
			n++
		default:
			return nil, linkError("is outside " + display(c.destRel) + " (links out)")
		}
	}
	if n == len(c.destComps) {
		return nil, nil
	}
	return nil, linkError("is outside " + display(c.destRel) + " (links out)")
}
