package layer

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/erofs/go-erofs"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/testenv"
)

// treeBuilder makes test trees and sets every time at the end.
type treeBuilder struct {
	t      *testing.T
	root   string
	times  map[string]time.Time
	asRoot bool
}

func newTreeBuilder(t *testing.T, asRoot bool) *treeBuilder {
	root := filepath.Join(t.TempDir(), "src")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return &treeBuilder{t: t, root: root, times: map[string]time.Time{}, asRoot: asRoot}
}

func (b *treeBuilder) p(name string) string { return filepath.Join(b.root, name) }

func (b *treeBuilder) check(err error) {
	b.t.Helper()
	if err != nil {
		b.t.Fatal(err)
	}
}

func (b *treeBuilder) dir(name string, mode os.FileMode) {
	b.t.Helper()
	b.check(os.MkdirAll(b.p(name), 0o755))
	b.check(os.Chmod(b.p(name), mode))
}

func (b *treeBuilder) file(name string, data []byte, mode os.FileMode) {
	b.t.Helper()
	b.check(os.MkdirAll(filepath.Dir(b.p(name)), 0o755))
	b.check(os.WriteFile(b.p(name), data, 0o600))
	b.check(os.Chmod(b.p(name), mode))
}

func (b *treeBuilder) chown(name string, uid, gid int) {
	b.t.Helper()
	if b.asRoot {
		b.check(os.Lchown(b.p(name), uid, gid))
	}
}

func (b *treeBuilder) xattr(name, key, value string) {
	b.t.Helper()
	if !b.asRoot && !strings.HasPrefix(key, "user.") {
		return
	}
	b.check(unix.Lsetxattr(b.p(name), key, []byte(value), 0))
}

func (b *treeBuilder) mtime(name string, mt time.Time) { b.times[name] = mt }

// finish sets every mtime, deepest first, and returns the root.
func (b *treeBuilder) finish() string {
	b.t.Helper()
	var paths []string
	b.check(filepath.WalkDir(b.root, func(p string, d fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	}))
	base := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	for i := len(paths) - 1; i >= 0; i-- {
		rel, _ := filepath.Rel(b.root, paths[i])
		mt, ok := b.times[rel]
		if !ok {
			mt = base // whole seconds: these inodes can be compact
		}
		ts := []unix.Timespec{unix.NsecToTimespec(mt.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}
		b.check(unix.UtimesNanoAt(unix.AT_FDCWD, paths[i], ts, unix.AT_SYMLINK_NOFOLLOW))
	}
	return b.root
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// capV2 is a valid security.capability value granting CAP_NET_BIND_SERVICE.
func capV2() string {
	var b [20]byte
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|1) // revision 2, effective
	binary.LittleEndian.PutUint32(b[4:], 1<<10)        // permitted
	return string(b[:])
}

// variedTree makes the tree the directory tests build layers from.
// Without root it leaves out owners and trusted/security attributes.
func variedTree(t *testing.T, asRoot bool) (root string, names int) {
	b := newTreeBuilder(t, asRoot)
	b.dir("d1/d2/d3", 0o755)
	b.dir("empty", 0o700)
	b.dir("tmp", 0o1777)
	b.dir("setgid", 0o2755)
	b.file("zero", nil, 0o644)
	b.file("one", []byte("x"), 0o600)
	b.file("inline", bytes.Repeat([]byte("i"), 3000), 0o644)
	b.file("block", bytes.Repeat([]byte("b"), 4096), 0o644)
	b.file("d1/d2/d3/big", randomBytes(t, 5<<20), 0o755)
	b.file("suid", []byte("#!/bin/sh\n"), 0o4755)
	b.file("d1/user", []byte("owned by 1000\n"), 0o640)
	b.chown("d1/user", 1000, 1000)
	b.file("d1/huge-ids", []byte("ids past 16 bits\n"), 0o644)
	b.chown("d1/huge-ids", 70000, 70001)
	b.chown("d1", 1000, 1000)
	b.file("d1/rootfile", []byte("root\n"), 0o644)
	b.chown("d1/rootfile", 0, 0)
	b.check(os.Symlink("/etc/passwd", b.p("abs")))
	b.check(os.Symlink("../one", b.p("d1/rel")))
	b.check(os.Symlink("nowhere/at/all", b.p("dangling")))
	b.check(os.Symlink(strings.Repeat("long/", 800), b.p("longtarget")))
	b.chown("abs", 1000, 1000)
	// Hard links: within a directory, across directories, of a big file
	// and of a symbolic link.
	b.file("links/a", []byte("linked\n"), 0o644)
	b.check(os.Link(b.p("links/a"), b.p("links/b")))
	b.check(os.Link(b.p("links/a"), b.p("d1/d2/c")))
	b.check(os.Link(b.p("d1/d2/d3/big"), b.p("big-link")))
	b.check(os.Link(b.p("abs"), b.p("links/abs-hard")))
	// A directory spanning several blocks, with hard links inside.
	for i := range 300 {
		b.file(fmt.Sprintf("many/file-%04d-%s", i, strings.Repeat("n", i%40)), []byte{byte(i)}, 0o644)
	}
	b.check(os.Link(b.p("many/file-0299-"+strings.Repeat("n", 299%40)), b.p("many/zz-last-link")))
	b.check(os.Link(b.p("links/a"), b.p("many/aa-first-link")))
	b.file(strings.Repeat("L", 255), []byte("long name\n"), 0o644)
	b.dir(strings.Repeat("D", 200)+"/"+strings.Repeat("E", 255), 0o755)
	b.check(unix.Mkfifo(b.p("fifo"), 0o620))
	b.xattr("one", "user.comment", "hello")
	b.xattr("one", "user.empty", "")
	b.xattr("d1", "user.dir", strings.Repeat("v", 1000))
	b.xattr("empty", "trusted.overlay.opaque", "y")
	b.xattr("abs", "trusted.link", "on a symlink")
	b.xattr("suid", "security.capability", capV2())
	b.xattr("links/a", "user.shared", "by all names")
	b.mtime("one", time.Unix(1_600_000_000, 123456789))
	b.mtime("d1", time.Unix(1_500_000_000, 1))
	b.mtime("abs", time.Unix(1_400_000_000, 5))
	b.mtime("zero", time.Unix(0, 0))
	root = b.finish()
	b.check(filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		names++
		return err
	}))
	return root, names - 1
}

func buildDir(t *testing.T, dir string, opts Options) (string, Info) {
	t.Helper()
	img := filepath.Join(t.TempDir(), "layer.erofs")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info, err := BuildFromDir(context.Background(), dir, f, opts)
	if err != nil {
		t.Fatalf("BuildFromDir(%q) = %v", dir, err)
	}
	return img, info
}

func TestBuildFromDirMounted(t *testing.T) {
	testenv.RequireRoot(t)
	src, names := variedTree(t, true)
	img, info := buildDir(t, src, Options{})

	digest, size := fileDigest(t, img)
	want := Info{Digest: digest, Size: size, Files: names}
	if info != want {
		t.Errorf("BuildFromDir(%q) = %+v, want %+v", src, info, want)
	}
	compareTrees(t, src, mountImage(t, img), compareOpts{})
}

func TestBuildFromDirReadable(t *testing.T) {
	// Without root: the image must at least parse, with the right names,
	// contents and hard links.
	src, names := variedTree(t, false)
	img, info := buildDir(t, src, Options{})
	if info.Files != names {
		t.Errorf("BuildFromDir(%q).Files = %d, want %d", src, info.Files, names)
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fsys, err := erofs.Open(f)
	if err != nil {
		t.Fatalf("erofs.Open: %v", err)
	}
	got, err := fs.ReadFile(fsys, "d1/d2/d3/big")
	if err != nil {
		t.Fatal(err)
	}
	wantData, err := os.ReadFile(filepath.Join(src, "d1/d2/d3/big"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, wantData) {
		t.Errorf("d1/d2/d3/big in the image differs from the source")
	}
	ino := func(name string) int64 {
		t.Helper()
		fi, err := fs.Stat(fsys, name)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*erofs.Stat).Ino
	}
	for _, name := range []string{"links/b", "d1/d2/c", "many/aa-first-link"} {
		if ino(name) != ino("links/a") {
			t.Errorf("inode of %s = %d, want %d (that of links/a)", name, ino(name), ino("links/a"))
		}
	}
	if ino("big-link") != ino("d1/d2/d3/big") {
		t.Errorf("big-link is not the same inode as d1/d2/d3/big")
	}
}

func TestBuildFromDirDeterministic(t *testing.T) {
	src, _ := variedTree(t, os.Geteuid() == 0)
	img1, info1 := buildDir(t, src, Options{})
	img2, info2 := buildDir(t, src, Options{TempDir: t.TempDir(), Progress: func(int, int64) {}})
	if info1 != info2 {
		t.Errorf("second BuildFromDir(%q) = %+v, want %+v", src, info2, info1)
	}
	b1, err := os.ReadFile(img1)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := os.ReadFile(img2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b1, b2) {
		t.Errorf("two builds of %s differ", src)
	}

	// Into something that is not a file: the same bytes.
	var mem memFile
	info3, err := BuildFromDir(context.Background(), src, &mem, Options{TempDir: t.TempDir()})
	if err != nil {
		t.Fatalf("BuildFromDir(%q, memory) = %v", src, err)
	}
	if info3 != info1 || !bytes.Equal(mem.b, b1) {
		t.Errorf("BuildFromDir(%q, memory) = %+v (%d bytes), want %+v and the same bytes", src, info3, len(mem.b), info1)
	}
}

func TestBuildFromDirSkipsDevices(t *testing.T) {
	testenv.RequireRoot(t)
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("KeepWhiteouts=%v", keep), func(t *testing.T) {
			b := newTreeBuilder(t, true)
			b.file("file", []byte("data"), 0o644)
			b.dir("dir", 0o755)
			b.check(unix.Mknod(b.p("dir/whiteout"), unix.S_IFCHR, 0))
			b.check(unix.Mknod(b.p("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
			b.check(unix.Mknod(b.p("loop"), unix.S_IFBLK|0o660, int(unix.Mkdev(7, 0))))
			b.check(unix.Mkfifo(b.p("fifo"), 0o644))
			l, err := net.Listen("unix", b.p("sock"))
			b.check(err)
			defer l.Close()
			src := b.finish()

			img, info := buildDir(t, src, Options{KeepWhiteouts: keep})
			wantSkipped, wantFiles := 4, 3 // null, loop, sock, whiteout; file, dir, fifo
			if keep {
				wantSkipped, wantFiles = 3, 4
			}
			if info.Skipped != wantSkipped || info.Files != wantFiles {
				t.Errorf("BuildFromDir(%q, KeepWhiteouts=%v) = %d files, %d skipped, want %d, %d",
					src, keep, info.Files, info.Skipped, wantFiles, wantSkipped)
			}
			mnt := mountImage(t, img)
			entries, err := os.ReadDir(mnt)
			b.check(err)
			var got []string
			for _, e := range entries {
				got = append(got, e.Name())
			}
			if want := []string{"dir", "fifo", "file"}; !slices.Equal(got, want) {
				t.Errorf("root of the layer = %q, want %q", got, want)
			}
			var st unix.Stat_t
			err = unix.Lstat(filepath.Join(mnt, "dir/whiteout"), &st)
			switch {
			case keep && err != nil:
				t.Errorf("whiteout missing with KeepWhiteouts: %v", err)
			case keep && (st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0):
				t.Errorf("whiteout has mode %o rdev %d, want a character device 0:0", st.Mode, st.Rdev)
			case !keep && !errors.Is(err, unix.ENOENT):
				t.Errorf("whiteout without KeepWhiteouts: lstat = %v, want ENOENT", err)
			}
		})
	}
}

func TestBuildFromDirChangedSource(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, bytes.Repeat([]byte("s"), 100_000), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		change func(victim string) error
	}{
		{"replaced by a symlink", func(v string) error {
			if err := os.Remove(v); err != nil {
				return err
			}
			return os.Symlink(outside, v)
		}},
		{"replaced by another file", func(v string) error {
			if err := os.Remove(v); err != nil {
				return err
			}
			return os.WriteFile(v, bytes.Repeat([]byte("o"), 100_000), 0o644)
		}},
		{"truncated", func(v string) error { return os.Truncate(v, 10) }},
		{"removed", func(v string) error { return os.Remove(v) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newTreeBuilder(t, false)
			b.file("a", bytes.Repeat([]byte("a"), 100_000), 0o644)
			b.file("b", bytes.Repeat([]byte("b"), 100_000), 0o644)
			src := b.finish()
			var changeErr error
			changed := false
			opts := Options{Progress: func(files int, _ int64) {
				if files == 1 && !changed {
					changed = true
					changeErr = tt.change(filepath.Join(src, "b"))
				}
			}}
			f, err := os.Create(filepath.Join(t.TempDir(), "img"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			_, err = BuildFromDir(context.Background(), src, f, opts)
			if changeErr != nil {
				t.Fatal(changeErr)
			}
			if !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("BuildFromDir(%q) with b %s = %v, want FailedPrecondition", src, tt.name, err)
			}
		})
	}
}

func TestBuildFromDirErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		dir  string
		out  func() io.WriteSeeker
		want error
	}{
		{"missing", filepath.Join(dir, "missing"), nil, errdefs.ErrNotFound},
		{"not a directory", file, nil, errdefs.ErrInvalidArgument},
		{"output not at 0", dir, func() io.WriteSeeker { return &memFile{b: []byte("x"), pos: 1} }, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := io.WriteSeeker(&memFile{})
			if tt.out != nil {
				out = tt.out()
			}
			_, err := BuildFromDir(context.Background(), tt.dir, out, Options{TempDir: t.TempDir()})
			if !errdefs.Is(err, tt.want) {
				t.Errorf("BuildFromDir(%q) = %v, want %v", tt.dir, err, tt.want)
			}
		})
	}
}

func TestBuildFromDirCanceled(t *testing.T) {
	b := newTreeBuilder(t, false)
	b.file("a", bytes.Repeat([]byte("a"), 1<<20), 0o644)
	b.file("b", bytes.Repeat([]byte("b"), 1<<20), 0o644)
	src := b.finish()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := Options{Progress: func(int, int64) { cancel() }}
	_, err := BuildFromDir(ctx, src, &memFile{}, Options{TempDir: t.TempDir(), Progress: opts.Progress})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("BuildFromDir(%q) canceled midway = %v, want context.Canceled", src, err)
	}
}

func TestBuildFromDirMaxSize(t *testing.T) {
	b := newTreeBuilder(t, false)
	b.file("a", bytes.Repeat([]byte("a"), 1000), 0o644)
	b.file("b", bytes.Repeat([]byte("b"), 1000), 0o644)
	b.check(os.Link(b.p("b"), b.p("c"))) // counted once
	src := b.finish()
	for _, tt := range []struct {
		max  int64
		want error
	}{{1999, errdefs.ErrResourceExhausted}, {2000, nil}, {0, nil}} {
		_, err := BuildFromDir(context.Background(), src, &memFile{}, Options{TempDir: t.TempDir(), MaxSize: tt.max})
		if errdefs.Kind(err) != tt.want {
			t.Errorf("BuildFromDir(2000 bytes of data, MaxSize %d) = %v, want %v", tt.max, err, tt.want)
		}
	}
}

func TestBuildFromDirProgress(t *testing.T) {
	b := newTreeBuilder(t, false)
	b.file("a", bytes.Repeat([]byte("a"), 20<<20), 0o644)
	b.file("b", []byte("b"), 0o644)
	b.file("c", nil, 0o644)
	src := b.finish()
	var files []int
	var last int64
	_, err := BuildFromDir(context.Background(), src, &memFile{}, Options{
		TempDir: t.TempDir(),
		Progress: func(f int, n int64) {
			if n < last {
				t.Errorf("progress went back from %d to %d bytes", last, n)
			}
			files, last = append(files, f), n
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 || files[len(files)-1] != 2 || last != 20<<20+1 {
		t.Errorf("progress calls = files %v, last %d bytes; want at least 3 calls ending at 2 files, %d bytes", files, last, 20<<20+1)
	}
}
