package layer

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/erofs/go-erofs"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/testenv"
)

const testHostID = 1_000_000_000

// upperTree makes what a sandbox's overlay leaves in its upper directory
// over lowerTree: a new file owned by uid 1000 inside, a deleted file
// (whiteout), a replaced directory (opaque), overlayfs' own attributes,
// and paths to scrub.
func upperTree(t *testing.T) string {
	b := newTreeBuilder(t, true)
	b.file("new", []byte("written in the sandbox\n"), 0o640)
	b.chown("new", testHostID+1000, testHostID+1001)
	b.check(unix.Mknod(b.p("gone"), unix.S_IFCHR, 0))
	b.chown("gone", testHostID, testHostID)
	b.dir("opq", 0o750)
	b.chown("opq", testHostID, testHostID)
	b.xattr("opq", "trusted.overlay.opaque", "y")
	b.file("opq/fresh", []byte("fresh\n"), 0o644)
	b.chown("opq/fresh", testHostID, testHostID)
	b.dir("keepdir", 0o755)
	b.xattr("keepdir", "trusted.overlay.impure", "y")
	b.xattr("keepdir", "trusted.overlay.origin", "\x00\xfb")
	b.file("keepdir/added", []byte("added\n"), 0o644)
	b.xattr("keepdir/added", "user.note", "kept")
	b.file("keepdir/stranger", []byte("owned outside the range\n"), 0o644)
	b.chown("keepdir/stranger", 4242, 4242)
	b.dir("scratch/deep", 0o755)
	b.file("scratch/deep/cache", []byte("cache\n"), 0o644)
	b.check(unix.Mknod(b.p("wiped"), unix.S_IFCHR, 0))
	b.check(os.Chown(b.root, testHostID, testHostID))
	return b.finish()
}

func lowerTree(t *testing.T) string {
	b := newTreeBuilder(t, true)
	b.file("gone", []byte("deleted in the sandbox\n"), 0o644)
	b.file("opq/old", []byte("replaced\n"), 0o644)
	b.file("keepdir/base", []byte("base\n"), 0o644)
	b.file("wiped", []byte("deleted, but the deletion is scrubbed\n"), 0o644)
	return b.finish()
}

func buildDiff(t *testing.T, upper string, scrub ...string) (string, Info) {
	t.Helper()
	img := filepath.Join(t.TempDir(), "diff.erofs")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info, err := BuildDiff(context.Background(), upper, f, Diff{HostID: testHostID, Size: 65536, Scrub: scrub}, Options{})
	if err != nil {
		t.Fatalf("BuildDiff(%q) = %v", upper, err)
	}
	return img, info
}

// TestBuildDiffStacked stacks the diff layer on the lower tree in a real
// overlay and checks what a sandbox on the new environment sees.
func TestBuildDiffStacked(t *testing.T) {
	testenv.RequireRoot(t)
	upper, lower := upperTree(t), lowerTree(t)
	img, info := buildDiff(t, upper, "/scratch", "/wiped", "/not/there")
	// new, opq, opq/fresh, gone, keepdir, keepdir/added, keepdir/stranger.
	if info.Files != 7 {
		t.Errorf("BuildDiff Files = %d, want 7", info.Files)
	}
	layerDir := mountImage(t, img)
	merged := t.TempDir()
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_RDONLY, "lowerdir="+layerDir+":"+lower); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })

	names := func(dir string) []string {
		t.Helper()
		ents, err := os.ReadDir(filepath.Join(merged, dir))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	for _, c := range []struct {
		dir  string
		want []string
	}{
		{".", []string{"keepdir", "new", "opq", "wiped"}},
		{"opq", []string{"fresh"}},
		{"keepdir", []string{"added", "base", "stranger"}},
	} {
		if got := names(c.dir); !slices.Equal(got, c.want) {
			t.Errorf("ls %s on the new environment = %q, want %q", c.dir, got, c.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(merged, "wiped")); err != nil || string(b) != "deleted, but the deletion is scrubbed\n" {
		t.Errorf("scrubbed whiteout: wiped = %q, %v; want the lower file", b, err)
	}
}

// TestBuildDiffMetadata reads the layer itself: owners shifted into the
// sandbox's ids, whiteouts as character devices 0:0, overlayfs' private
// attributes gone, the opaque marker and user attributes kept.
func TestBuildDiffMetadata(t *testing.T) {
	testenv.RequireRoot(t)
	img, _ := buildDiff(t, upperTree(t), "/scratch")
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fsys, err := erofs.Open(f)
	if err != nil {
		t.Fatalf("erofs.Open: %v", err)
	}
	stat := func(name string) *erofs.Stat {
		t.Helper()
		fi, err := fs.Stat(fsys, name)
		if err != nil {
			t.Fatalf("stat %s in the layer: %v", name, err)
		}
		return fi.Sys().(*erofs.Stat)
	}
	for _, c := range []struct {
		name     string
		uid, gid uint32
		mode     fs.FileMode
	}{
		{".", 0, 0, fs.ModeDir | 0o755},
		{"new", 1000, 1001, 0o640},
		{"opq", 0, 0, fs.ModeDir | 0o750},
		{"opq/fresh", 0, 0, 0o644},
		{"keepdir/stranger", 65534, 65534, 0o644},
	} {
		st := stat(c.name)
		if st.UID != c.uid || st.GID != c.gid || st.Mode != c.mode {
			t.Errorf("%s in the layer: %d:%d %v, want %d:%d %v", c.name, st.UID, st.GID, st.Mode, c.uid, c.gid, c.mode)
		}
	}
	for _, name := range []string{"gone", "wiped"} {
		if st := stat(name); st.Mode.Type() != fs.ModeDevice|fs.ModeCharDevice || st.Rdev != 0 {
			t.Errorf("%s in the layer: mode %v rdev %d, want a whiteout (character device 0:0)", name, st.Mode, st.Rdev)
		}
	}
	if x := stat("opq").Xattrs; x["trusted.overlay.opaque"] != "y" || len(x) != 1 {
		t.Errorf("opq's attributes = %q, want only trusted.overlay.opaque=y", x)
	}
	if x := stat("keepdir").Xattrs; len(x) != 0 {
		t.Errorf("keepdir's attributes = %q, want none (overlayfs' impure and origin dropped)", x)
	}
	if x := stat("keepdir/added").Xattrs; x["user.note"] != "kept" {
		t.Errorf("keepdir/added's attributes = %q, want user.note=kept", x)
	}
	if _, err := fs.Stat(fsys, "scratch"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("scrubbed scratch in the layer: stat = %v, want not found", err)
	}
}

func TestBuildDiffUserxattrOpaque(t *testing.T) {
	// An overlay mounted with userxattr marks opaque directories in the
	// user namespace; the layer says it the trusted way.
	b := newTreeBuilder(t, false)
	b.dir("d", 0o755)
	b.xattr("d", "user.overlay.opaque", "y")
	b.xattr("d", "user.overlay.origin", "x")
	img := filepath.Join(t.TempDir(), "diff.erofs")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	uid := uint32(os.Getuid())
	if _, err := BuildDiff(context.Background(), b.finish(), f, Diff{HostID: uid, Size: 1}, Options{}); err != nil {
		t.Fatalf("BuildDiff = %v", err)
	}
	fsys, err := erofs.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := fs.Stat(fsys, "d")
	if err != nil {
		t.Fatal(err)
	}
	if x := fi.Sys().(*erofs.Stat).Xattrs; x["trusted.overlay.opaque"] != "y" || len(x) != 1 {
		t.Errorf("d's attributes = %q, want only trusted.overlay.opaque=y", x)
	}
}

func TestCleanScrub(t *testing.T) {
	got, err := CleanScrub([]string{"/tmp/x/", "/a/../b", "/tmp/x"})
	if err != nil || !slices.Equal(got, []string{"tmp/x", "b"}) {
		t.Errorf("CleanScrub = %q, %v; want [tmp/x b]", got, err)
	}
	for _, bad := range []string{"relative", "/", "/..", "", "/a\x00b"} {
		if _, err := CleanScrub([]string{bad}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CleanScrub(%q) = %v, want InvalidArgument", bad, err)
		}
	}
}
