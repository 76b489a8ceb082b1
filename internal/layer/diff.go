package layer

import (
	"path"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Diff says how BuildDiff turns the upper directory of a sandbox's overlay
// root into a layer.
type Diff struct {
	// HostID and Size are the host id range the sandbox's ids 0..Size-1
	// map to (its user namespace): owners in the upper directory are host
	// ids and become HostID-based ids in the layer; ids outside the range
	// become 65534, as the sandbox sees them.
	HostID, Size uint32
	// Scrub lists absolute paths (as seen in the sandbox) left out of the
	// layer, with everything below them: files, directories and whiteouts
	// alike, so that a sandbox on the new layer sees them as the layers
	// below have them.
	Scrub []string
}

// overlayOpaque is the extended attribute that marks a directory of a
// layer opaque (it hides what the layers below hold at its path). The
// sandboxes' overlay is mounted by the keeper in the initial user
// namespace, without userxattr, so overlayfs writes and reads the trusted.
// namespace; an upper directory of an overlay mounted with userxattr would
// say user.overlay.opaque, which BuildDiff also takes.
const overlayOpaque = "trusted.overlay.opaque"

// CleanScrub checks and cleans scrub paths: each must be absolute, must not
// be the root and must not hold a NUL byte; the result is relative to the
// root ("/tmp/x" → "tmp/x"), sorted as given, duplicates dropped.
func CleanScrub(paths []string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, p := range paths {
		if !path.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "scrub path %q: give an absolute path inside the sandbox, like /root/.cache", p)
		}
		c := strings.TrimPrefix(path.Clean(p), "/")
		if c == "" {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "scrub path %q is the root: that would leave nothing to pack", p)
		}
		if len(c) > maxPathLen {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "scrub path %.40q… is longer than %d bytes", p, maxPathLen)
		}
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out, nil
}

// applyDiff rewrites a tree read from an upper directory into a layer:
// owners shifted into the sandbox's ids, overlayfs' private attributes
// dropped (opaque markers kept, as trusted.overlay.opaque), scrub paths
// cut out. Each inode is rewritten once, whatever its number of names.
func (t *tree) applyDiff(d Diff, scrub []string) {
	for _, p := range scrub {
		dir := t.root
		parts := strings.Split(p, "/")
		for i, name := range parts {
			c, ok := dir.children[name]
			if !ok {
				break
			}
			if i == len(parts)-1 {
				delete(dir.children, name)
				break
			}
			if !c.isDir() {
				break
			}
			dir = c
		}
	}
	seen := map[*node]bool{}
	var walk func(n *node)
	walk = func(n *node) {
		if seen[n] {
			return
		}
		seen[n] = true
		n.uid, n.gid = shiftID(n.uid, d), shiftID(n.gid, d)
		n.xattrs = diffXattrs(n.xattrs, n.isDir())
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(t.root)
}

func shiftID(id uint32, d Diff) uint32 {
	if id >= d.HostID && id-d.HostID < d.Size {
		return id - d.HostID
	}
	return 65534
}

// diffXattrs drops overlayfs' private attributes (origin, impure, nlink,
// upper, redirect, metacopy, ...) of both namespaces and keeps an opaque
// marker of a directory as trusted.overlay.opaque.
func diffXattrs(x map[string]string, dir bool) map[string]string {
	opaque := false
	for k, v := range x {
		for _, prefix := range []string{"trusted.overlay.", "user.overlay."} {
			if rest, ok := strings.CutPrefix(k, prefix); ok {
				if rest == "opaque" && v == "y" && dir {
					opaque = true
				}
				delete(x, k)
			}
		}
	}
	if opaque {
		if x == nil {
			x = map[string]string{}
		}
		x[overlayOpaque] = "y"
	}
	if len(x) == 0 {
		return nil
	}
	return x
}
