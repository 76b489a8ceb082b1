package layer

import (
	"archive/tar"
	"strings"
)

// OCI whiteouts (Options.OCIWhiteouts).
//
// An OCI or docker image layer marks what it removes from the layers below
// with empty files: "dir/.wh.NAME" hides dir/NAME, and "dir/.wh..wh..opq"
// hides everything the lower layers hold in dir (entries of the same layer
// stay). A sandbox's root is an overlayfs mount, which reads its own forms
// of the same: a character device 0:0 named NAME, and a directory with the
// extended attribute OpaqueXattr = "y". The keeper mounts the overlay as
// root in the initial user namespace without the userxattr option, so
// overlayfs reads the trusted.* form.
const (
	// OpaqueXattr marks a directory whose lower layers' contents overlayfs
	// hides.
	OpaqueXattr = "trusted.overlay.opaque"

	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// ociWhiteout applies a tar entry named with the whiteout prefix: it
// reports whether the entry was one (and so is done with). A whiteout
// never hides an entry of its own layer: when NAME is already in the tree
// the whiteout is dropped, and a later entry NAME replaces it.
func (b *tarBuilder) ociWhiteout(hdr *tar.Header, name string) (bool, error) {
	parent, base := splitPath(name)
	if strings.Contains("/"+parent+"/", "/"+whiteoutPrefix+whiteoutPrefix) {
		// Inside aufs metadata (.wh..wh.plnk/...): not content.
		b.skip(name)
		return true, nil
	}
	if !strings.HasPrefix(base, whiteoutPrefix) {
		return false, nil
	}
	if hdr.Typeflag == tar.TypeDir {
		return true, invalid(hdr.Name, "a whiteout must be a file, not a directory")
	}
	switch {
	case base == opaqueMarker:
		if parent != "" {
			if _, err := b.lookupDir(parent); err != nil {
				// Missing parents are made as put makes them; a file in
				// the way is an error.
				pp, pb := splitPath(parent)
				if d, err := b.lookupDir(pp); err == nil && d.children[pb] != nil {
					return true, invalid(hdr.Name, "opaque marker in %q, which is not a directory", short(parent))
				}
				if err := b.put(hdr.Name, parent, newDir(0o755)); err != nil {
					return true, err
				}
			}
		}
		b.opaque = append(b.opaque, parent)
		return true, nil
	case strings.HasPrefix(base, whiteoutPrefix+whiteoutPrefix):
		// Other aufs metadata (.wh..wh.plnk, .wh..wh.aufs): not content.
		b.skip(name)
		return true, nil
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "." || target == ".." || target == "" {
		return true, invalid(hdr.Name, "whiteout of %q: not a name", target)
	}
	full := target
	if parent != "" {
		full = parent + "/" + target
	}
	if d, err := b.lookupDir(parent); err == nil && d.children[target] != nil {
		return true, nil
	}
	n := &node{mode: typeChar}
	if mt := hdr.ModTime; mt.Unix() > 0 {
		n.mtime, n.mtimeNs = mt.Unix(), uint32(mt.Nanosecond())
	}
	return true, b.put(hdr.Name, full, n)
}

// finishOCI marks the directories that held an opaque marker, once the
// whole stream is read: a directory entry after its marker replaces the
// directory's metadata, xattrs included.
func (b *tarBuilder) finishOCI() {
	for _, p := range b.opaque {
		d, err := b.lookupDir(p)
		if err != nil {
			continue // replaced by a non-directory later in the stream
		}
		if d.xattrs == nil {
			d.xattrs = map[string]string{}
		}
		d.xattrs[OpaqueXattr] = "y"
	}
}
