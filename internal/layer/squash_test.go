package layer

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"testing"

	"github.com/erofs/go-erofs"
	"github.com/google/go-cmp/cmp"
)

// overlayView is what overlayfs shows of layers (lowest first), computed
// top-down as the kernel looks paths up, independently of Squash's
// bottom-up merge: path → "type perm uid:gid content".
func overlayView(t *testing.T, layers []fs.FS) map[string]string {
	t.Helper()
	top := make([]fs.FS, len(layers))
	for i, l := range layers {
		top[len(layers)-1-i] = l
	}
	out := map[string]string{}
	var walk func(p string, stack []fs.FS)
	walk = func(p string, stack []fs.FS) {
		// The layers that contribute to directory p, top first.
		names := map[string]bool{}
		for _, l := range stack {
			fi, err := fs.Lstat(l, p)
			if err != nil {
				continue
			}
			if !fi.IsDir() {
				break
			}
			ents, err := fs.ReadDir(l, p)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				names[e.Name()] = true
			}
			if fi.Sys().(*erofs.Stat).Xattrs[OpaqueXattr] == "y" {
				break
			}
		}
		for n := range names {
			c := path.Join(p, n)
			for i, l := range stack {
				fi, err := fs.Lstat(l, c)
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				st := fi.Sys().(*erofs.Stat)
				if fi.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0 {
					break // whited out
				}
				desc := fi.Mode().Type().String() + " " + fi.Mode().Perm().String()
				switch {
				case fi.Mode().IsRegular():
					b, err := fs.ReadFile(l, c)
					if err != nil {
						t.Fatal(err)
					}
					desc += " " + string(b)
				case fi.Mode()&fs.ModeSymlink != 0:
					target, _ := fs.ReadLink(l, c)
					desc += " -> " + target
				}
				out[c] = desc
				if fi.IsDir() {
					walk(c, stack[i:])
				}
				break
			}
		}
	}
	walk(".", top)
	return out
}

func openSquashImage(t *testing.T, img string) (fs.FS, *os.File) {
	t.Helper()
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fsys, err := erofs.Open(f)
	if err != nil {
		t.Fatalf("erofs.Open(%s): %v", img, err)
	}
	return fsys, f
}

func squashFiles(t *testing.T, files ...*os.File) fs.FS {
	t.Helper()
	rs := make([]io.ReaderAt, len(files))
	for i, f := range files {
		rs[i] = f
	}
	img := filepath.Join(t.TempDir(), "squashed.erofs")
	out, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := Squash(context.Background(), rs, out, Options{TempDir: t.TempDir()}); err != nil {
		t.Fatalf("Squash() = %v", err)
	}
	fsys, _ := openSquashImage(t, img)
	return fsys
}

func TestSquash(t *testing.T) {
	t.Parallel()
	layer := func(entries ...tarEntry) (fs.FS, *os.File) {
		img, _ := mustBuildTar(t, makeTar(t, entries...), Options{OCIWhiteouts: true})
		return openSquashImage(t, img)
	}
	fa, a := layer(dir("a/", 0o755), reg("a/x", "x1", 0o644), reg("a/y", "y1", 0o644),
		dir("b/", 0o755), reg("b/z", "z1", 0o644), reg("c", "c1", 0o644),
		dir("e/", 0o755), reg("e/f", "f1", 0o644), symlink("l", "a/x"))
	fb, b := layer(reg("a/.wh.y", "", 0o644), // a whiteout
		reg("b/.wh..wh..opq", "", 0o644), reg("b/new", "n", 0o600), // an opaque dir
		dir("c/", 0o700), reg("c/inner", "i", 0o644), // a directory over a file
		reg(".wh.e", "", 0o644), reg("g", "g1", 0o644))
	fc, c := layer(reg("a/x", "x2", 0o644),
		dir("e/", 0o750), reg("e/h", "h1", 0o644), // a directory over a whiteout
		reg(".wh.g", "", 0o644), reg("l", "now a file", 0o644))

	want := overlayView(t, []fs.FS{fa, fb, fc})
	if len(want) < 8 {
		t.Fatalf("the reference view is too small to mean anything: %v", want)
	}
	// The upper two squashed, over the lowest: the same view, so the
	// whiteouts and opaque directories that hide a's entries were kept.
	sbc := squashFiles(t, b, c)
	if got := overlayView(t, []fs.FS{fa, sbc}); !cmp.Equal(got, want) {
		t.Errorf("a + Squash(b, c) differs from a + b + c (-want +got):\n%s", cmp.Diff(want, got))
	}
	fi, err := fs.Lstat(sbc, "a/y")
	if err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		t.Errorf("Squash(b, c): a/y = %v, %v, want b's whiteout kept", fi, err)
	}
	if fi, err := fs.Lstat(sbc, "e"); err != nil || fi.Sys().(*erofs.Stat).Xattrs[OpaqueXattr] != "y" {
		t.Errorf("Squash(b, c): e is not opaque (%v): a's e/f would show through", err)
	}
	// All three in one: the same view again.
	if got := overlayView(t, []fs.FS{squashFiles(t, a, b, c)}); !cmp.Equal(got, want) {
		t.Errorf("Squash(a, b, c) differs from a + b + c (-want +got):\n%s", cmp.Diff(want, got))
	}
	// Stacking order matters: squashing c under b is not the same.
	if got := overlayView(t, []fs.FS{fa, squashFiles(t, c, b)}); cmp.Equal(got, want) {
		t.Error("Squash(c, b) gives the view of b then c: the order of layers is ignored")
	}
}

func TestSquashRejectsGarbage(t *testing.T) {
	t.Parallel()
	f, err := os.CreateTemp(t.TempDir(), "junk")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("not an erofs image, not at all; some padding to make it long enough........"); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := Squash(context.Background(), []io.ReaderAt{f}, out, Options{}); err == nil {
		t.Error("Squash(junk) = nil error, want an invalid layer")
	}
}
