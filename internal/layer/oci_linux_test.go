package layer

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/testenv"
)

// TestOCIWhiteoutsOverlay stacks two built layers under overlayfs, mounted
// as the keeper mounts a sandbox root, and checks that the converted
// whiteouts hide what the lower layer holds.
func TestOCIWhiteoutsOverlay(t *testing.T) {
	testenv.RequireRoot(t)
	lowerImg, _ := mustBuildTar(t, makeTar(t,
		reg("gone", "g", 0o644),
		reg("d/old", "o", 0o644),
		reg("d/sub/deep", "x", 0o644),
		reg("keep/a", "a", 0o644),
	), Options{})
	upperImg, _ := mustBuildTar(t, makeTar(t,
		reg(".wh.gone", "", 0o644),
		dir("d/", 0o755),
		reg("d/.wh..wh..opq", "", 0o644),
		reg("d/new", "n", 0o644),
		reg("keep/.wh.nothing", "", 0o644),
	), Options{OCIWhiteouts: true})
	lower, upper := mountImage(t, lowerImg), mountImage(t, upperImg)
	root, rw := t.TempDir(), t.TempDir()
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(rw, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=" + upper + ":" + lower + ",upperdir=" + filepath.Join(rw, "upper") + ",workdir=" + filepath.Join(rw, "work") + ",index=off,redirect_dir=off,metacopy=off"
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })

	list := func(p string) []string {
		es, err := os.ReadDir(filepath.Join(root, p))
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return names
	}
	for _, tt := range []struct {
		dir  string
		want []string
	}{
		{".", []string{"d", "keep"}},
		{"d", []string{"new"}},
		{"keep", []string{"a"}},
	} {
		if got := list(tt.dir); !slices.Equal(got, tt.want) {
			t.Errorf("ls %s in the overlay = %q, want %q", tt.dir, got, tt.want)
		}
	}
}
