package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/erofs/go-erofs"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"x", "./x/", "a//b/../c", "..", "/etc", "a/../..", "a\x00b", ".", "...", strings.Repeat("n", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := cleanName(name)
		if err != nil {
			if got != "" {
				t.Errorf("cleanName(%q) = %q, %v; want no name with an error", name, got, err)
			}
			return
		}
		if strings.HasPrefix(name, "/") || strings.IndexByte(name, 0) >= 0 {
			t.Errorf("cleanName(%q) = %q, want an error", name, got)
		}
		if want := strings.TrimPrefix(path.Clean("/"+name), "/"); got != want {
			t.Errorf("cleanName(%q) = %q, want %q (path.Clean)", name, got, want)
		}
		if got == "" {
			return
		}
		for part := range strings.SplitSeq(got, "/") {
			if part == "" || part == "." || part == ".." || len(part) > maxNameLen {
				t.Errorf("cleanName(%q) = %q, with component %q", name, got, part)
			}
		}
		if again, err := cleanName(got); again != got || err != nil {
			t.Errorf("cleanName(%q) = %q, %v; want it unchanged", got, again, err)
		}
	})
}

func FuzzBuildFromTar(f *testing.F) {
	seeds := [][]byte{
		makeTar(f, reg("a", "hello", 0o644), dir("d", 0o755), hardlink("d/l", "a"), symlink("s", "/x")),
		makeTar(f, reg("./x", "1", 0o4755), reg("x", "2", 0o600), reg("y/z/w", "", 0o644)),
		makeTar(f, tarEntry{tar.Header{Typeflag: tar.TypeChar, Name: "wh"}, ""}, tarEntry{tar.Header{Typeflag: tar.TypeFifo, Name: "p"}, ""}),
		gzipped(f, makeTar(f, reg("g", strings.Repeat("z", 10000), 0o644))),
		makeTar(f, reg("../x", "", 0o644)),
		{},
	}
	for _, s := range seeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, keep bool) {
		tmp, outDir := t.TempDir(), t.TempDir()
		img := filepath.Join(outDir, "img")
		out, err := os.Create(img)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		info, err := BuildFromTar(context.Background(), bytes.NewReader(data), out, Options{TempDir: tmp, KeepWhiteouts: keep})
		for _, d := range []string{tmp, outDir} {
			entries, _ := os.ReadDir(d)
			if want := map[string]int{tmp: 0, outDir: 1}[d]; len(entries) != want {
				t.Errorf("BuildFromTar left %d files in %s, want %d", len(entries), d, want)
			}
		}
		if err != nil {
			if !errdefs.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("BuildFromTar(%q) = %v, want InvalidArgument or success", data, err)
			}
			return
		}
		st, err := out.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != info.Size {
			t.Errorf("BuildFromTar() wrote %d bytes, Info.Size = %d", st.Size(), info.Size)
		}
		// The image must read back: every name, every byte.
		fsys, err := erofs.Open(out)
		if err != nil {
			t.Fatalf("erofs.Open(built image) = %v", err)
		}
		files := 0
		err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p == "." {
				return nil
			}
			files++
			if d.Type().IsRegular() {
				r, err := fsys.Open(p)
				if err != nil {
					return err
				}
				defer r.Close()
				_, err = io.Copy(io.Discard, r)
				return err
			}
			return nil
		})
		if err != nil {
			t.Errorf("walk built image: %v", err)
		}
		if files != info.Files {
			t.Errorf("built image has %d names, Info.Files = %d", files, info.Files)
		}
	})
}

// FuzzCleanScrub checks that every scrub path CleanScrub accepts is a
// clean path inside the root: not empty, not absolute, no "..".
func FuzzCleanScrub(f *testing.F) {
	for _, s := range []string{"/tmp/x", "/", "relative", "/a/../..", "//a//b/", "/a\x00b", "/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		out, err := CleanScrub([]string{p})
		if err != nil {
			return
		}
		for _, c := range out {
			if c == "" || c == "." || strings.HasPrefix(c, "/") || path.Clean(c) != c ||
				c == ".." || strings.HasPrefix(c, "../") || strings.Contains(c, "/../") {
				t.Errorf("CleanScrub(%q) = %q: not a clean path inside the root", p, c)
			}
		}
	})
}
