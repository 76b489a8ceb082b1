package layer

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/testenv"
)

// mountImage mounts the EROFS image at img read-only and returns the
// mount point; it is unmounted when the test ends.
func mountImage(t *testing.T, img string) string {
	t.Helper()
	fsck(t, img)
	dir := t.TempDir()
	if err := unix.Mount(img, dir, "erofs", unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("mount %s: %v", img, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fsck checks img with fsck.erofs of erofs-utils, extracting every file.
func fsck(t *testing.T, img string) {
	t.Helper()
	if _, err := exec.LookPath("fsck.erofs"); err != nil {
		testenv.Require(t, false, "needs fsck.erofs (erofs-utils)")
	}
	out, err := exec.Command("fsck.erofs", "--extract", img).CombinedOutput()
	if err != nil {
		t.Errorf("fsck.erofs %s: %v\n%s", img, err, out)
	}
}

// rec is what the comparison looks at for one name.
type rec struct {
	Type   string
	Perm   uint32 // permission bits with setuid, setgid and sticky
	UID    uint32
	GID    uint32
	Size   int64  // regular files
	SHA256 string // regular files
	Target string // symbolic links
	Rdev   uint64 // character devices
	Mtime  int64  // nanoseconds
	Nlink  uint64 // non-directories
	Links  string // first name (sorted) of the inode's names; hard links share it
	Xattrs map[string]string
}

type compareOpts struct {
	ignoreDirMtime bool
}

// scanTree records every name under root, root itself as "".
func scanTree(t *testing.T, root string, o compareOpts) map[string]rec {
	t.Helper()
	out := map[string]rec{}
	inodes := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			rel = ""
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		r := rec{
			Perm:  st.Mode & 0o7777,
			UID:   st.Uid,
			GID:   st.Gid,
			Mtime: st.Mtim.Nano(),
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			r.Type = "dir"
			if o.ignoreDirMtime {
				r.Mtime = 0
			}
		case unix.S_IFREG:
			r.Type = "file"
			r.Size = st.Size
			r.SHA256 = hashFile(t, p)
		case unix.S_IFLNK:
			r.Type = "symlink"
			if r.Target, err = os.Readlink(p); err != nil {
				return err
			}
			r.Perm = 0 // meaningless, and not kept by every tool
		case unix.S_IFIFO:
			r.Type = "fifo"
		case unix.S_IFCHR:
			r.Type = "char"
			r.Rdev = st.Rdev
		default:
			r.Type = "other"
		}
		if r.Type != "dir" {
			r.Nlink = uint64(st.Nlink)
			inodes[st.Ino] = append(inodes[st.Ino], rel)
		}
		r.Xattrs = readXattrs(t, p)
		out[rel] = r
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	for _, names := range inodes {
		slices.Sort(names)
		for _, n := range names {
			r := out[n]
			r.Links = names[0]
			out[n] = r
		}
	}
	return out
}

func readXattrs(t *testing.T, p string) map[string]string {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return nil
	}
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	var out map[string]string
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		if name == "" || !keepXattr(name) {
			continue
		}
		vb := make([]byte, 64<<10)
		vn, err := unix.Lgetxattr(p, name, vb)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, name, err)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = string(vb[:vn])
	}
	return out
}

// compareTrees fails t unless the trees at want and got have the same
// names, types, modes, owners, sizes, contents, link targets, xattrs,
// times and hard links.
func compareTrees(t *testing.T, want, got string, o compareOpts) {
	t.Helper()
	w, g := scanTree(t, want, o), scanTree(t, got, o)
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("tree %s differs from %s (-want +got):\n%s", got, want, diff)
	}
}
