package diskquota

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// TestReach detaches a directory's mount while another mount (a sandbox's,
// here a bind mount) keeps its file system, then reaches it again: the
// same file system, through the same loop device, until released.
func TestReach(t *testing.T) {
	requireMode(t, ModeImage)
	dir := testDir(t)
	f := open(t, config(dir, ModeImage))
	d := create(t, f, "box", 64<<20, 0)
	if err := os.WriteFile(filepath.Join(d.Upper, "file"), []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(d.Path, other, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(other, unix.MNT_DETACH)
	if err := unmount(d.Path); err != nil {
		t.Fatal(err)
	}
	loops := loopsUnder(t, dir)

	release, err := f.Reach("box")
	if err != nil {
		t.Fatalf("Reach(box) = %v", err)
	}
	// A write through the other mount shows at once: one super block.
	if err := os.WriteFile(filepath.Join(other, "upper", "file"), []byte("after"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(d.Upper, "file")); err != nil || string(b) != "after" {
		t.Errorf("file through the reached mount = %q, %v; want %q", b, err, "after")
	}
	if got := loopsUnder(t, dir); len(got) != len(loops) {
		t.Errorf("loop devices after Reach = %q, want %q (no second device)", got, loops)
	}
	if err := release(); err != nil {
		t.Fatalf("release() = %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.Upper, "file")); !os.IsNotExist(err) {
		t.Errorf("after release, stat of the file = %v, want not found (unmounted)", err)
	}
	if err := unix.Unmount(other, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	// Nothing holds the image now: Reach refuses rather than bind a device.
	f.waitImageReleased("box", 5e9)
	if _, err := f.Reach("box"); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Reach of an image nothing holds = %v, want FailedPrecondition", err)
	}
	// Let Close find the directory mounted, as it left it.
	if err := f.mountDir("box", nil); err != nil {
		t.Fatal(err)
	}
}
