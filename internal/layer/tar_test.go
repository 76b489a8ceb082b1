package layer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/erofs/go-erofs"
	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// tarEntry is one entry of a test tar stream.
type tarEntry struct {
	tar.Header
	data string
}

func reg(name, data string, mode int64) tarEntry {
	return tarEntry{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}, data}
}

func dir(name string, mode int64) tarEntry {
	return tarEntry{tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}, ""}
}

func symlink(name, target string) tarEntry {
	return tarEntry{tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}, ""}
}

func hardlink(name, target string) tarEntry {
	return tarEntry{tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644}, ""}
}

func makeTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		if h.Format == tar.FormatUnknown && h.Typeflag != tar.TypeXGlobalHeader {
			h.Format = tar.FormatPAX
		}
		if h.ModTime.IsZero() && h.Typeflag != tar.TypeXGlobalHeader {
			h.ModTime = time.Unix(1_700_000_000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("write tar header %q: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.data); err != nil {
			t.Fatalf("write tar data %q: %v", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func buildTar(t testing.TB, data []byte, opts Options) (string, Info, error) {
	t.Helper()
	img := filepath.Join(tempDir(t), "layer.erofs")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if opts.TempDir == "" {
		opts.TempDir = tempDir(t)
	}
	info, err := BuildFromTar(context.Background(), bytes.NewReader(data), f, opts)
	return img, info, err
}

func tempDir(t testing.TB) string {
	switch t := t.(type) {
	case *testing.T:
		return t.TempDir()
	case *testing.F:
		return t.TempDir()
	case *testing.B:
		return t.TempDir()
	}
	panic("unknown testing.TB")
}

func mustBuildTar(t *testing.T, data []byte, opts Options) (string, Info) {
	t.Helper()
	img, info, err := buildTar(t, data, opts)
	if err != nil {
		t.Fatalf("BuildFromTar = %v", err)
	}
	return img, info
}

// openImage opens a built image with go-erofs's reader.
func readImage(t *testing.T, img string) fs.FS {
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
	return fsys
}

// imgRec is what the semantic tests check of a name in an image.
type imgRec struct {
	Type  fs.FileMode
	Perm  uint32 // with setuid, setgid and sticky bits
	UID   uint32
	GID   uint32
	Data  string
	Nlink int
}

func statImage(t *testing.T, fsys fs.FS, name string) (imgRec, int64) {
	t.Helper()
	fi, err := fs.Stat(fsys, name)
	if err != nil {
		t.Fatalf("stat %s in image: %v", name, err)
	}
	st := fi.Sys().(*erofs.Stat)
	// go-erofs's reader leaves raw st_mode bits in fs.FileMode.
	m := fi.Mode()
	perm := uint32(m & 0o7777)
	for bit, raw := range map[fs.FileMode]uint32{fs.ModeSetuid: 0o4000, fs.ModeSetgid: 0o2000, fs.ModeSticky: 0o1000} {
		if m&bit != 0 {
			perm |= raw
		}
	}
	r := imgRec{Type: m.Type(), Perm: perm, UID: st.UID, GID: st.GID, Nlink: st.Nlink}
	if fi.Mode().IsRegular() {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			t.Fatalf("read %s in image: %v", name, err)
		}
		r.Data = string(b)
	}
	return r, st.Ino
}

func TestBuildFromTarSemantics(t *testing.T) {
	owned := reg("owned", "o", 0o4750)
	owned.Uid, owned.Gid = 1000, 1001
	xattrDir := dir("xd", 0o755)
	xattrDir.PAXRecords = map[string]string{
		"SCHILY.xattr.trusted.overlay.opaque": "y",
		"SCHILY.xattr.user.k":                 "v",
		"SCHILY.xattr.security.selinux":       "dropped",
	}
	whiteout := tarEntry{tar.Header{Typeflag: tar.TypeChar, Name: "wh"}, ""}
	null := tarEntry{tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}, ""}
	block := tarEntry{tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8}, ""}
	global := tarEntry{tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"comment": "x"}}, ""}

	data := makeTar(t,
		global,
		reg("dup", "old", 0o644),
		reg("./dup", "new", 0o600),
		dir("d/", 0o700),
		reg("d/kept", "k", 0o644),
		dir("./d", 0o750), // a directory over a directory keeps its contents
		reg("f2d", "file", 0o644),
		dir("f2d", 0o755), // a file replaced by a directory
		dir("d2f", 0o755),
		reg("d2f/gone", "g", 0o644),
		reg("d2f", "now a file", 0o644), // a directory replaced by a file
		reg("implicit/a/b/file", "deep", 0o644),
		reg("a/../dotdot", "lexical", 0o644),
		reg("t1", "first", 0o644),
		hardlink("t1-link", "./t1"),
		hardlink("t1-link2", "t1-link"),
		reg("t1", "replaced", 0o644), // the links keep the old inode
		owned,
		xattrDir,
		whiteout, null, block,
		hardlink("null-link", "null"), // a link to a skipped entry is skipped
	)
	for _, tt := range []struct {
		name        string
		opts        Options
		wantSkipped int
		wantWh      bool
	}{
		{"default", Options{}, 4, false},
		{"KeepWhiteouts", Options{KeepWhiteouts: true}, 3, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			img, info := mustBuildTar(t, data, tt.opts)
			fsys := readImage(t, img)
			if info.Skipped != tt.wantSkipped {
				t.Errorf("BuildFromTar().Skipped = %d, want %d", info.Skipped, tt.wantSkipped)
			}
			want := map[string]imgRec{
				"dup":               {Perm: 0o600, Data: "new", Nlink: 1},
				"d":                 {Type: fs.ModeDir, Perm: 0o750, Nlink: 2},
				"d/kept":            {Perm: 0o644, Data: "k", Nlink: 1},
				"f2d":               {Type: fs.ModeDir, Perm: 0o755, Nlink: 2},
				"d2f":               {Perm: 0o644, Data: "now a file", Nlink: 1},
				"implicit":          {Type: fs.ModeDir, Perm: 0o755, Nlink: 3},
				"implicit/a":        {Type: fs.ModeDir, Perm: 0o755, Nlink: 3},
				"implicit/a/b":      {Type: fs.ModeDir, Perm: 0o755, Nlink: 2},
				"implicit/a/b/file": {Perm: 0o644, Data: "deep", Nlink: 1},
				"dotdot":            {Perm: 0o644, Data: "lexical", Nlink: 1},
				"t1":                {Perm: 0o644, Data: "replaced", Nlink: 1},
				"t1-link":           {Perm: 0o644, Data: "first", Nlink: 2},
				"t1-link2":          {Perm: 0o644, Data: "first", Nlink: 2},
				"owned":             {Perm: 0o4750, UID: 1000, GID: 1001, Data: "o", Nlink: 1},
				"xd":                {Type: fs.ModeDir, Perm: 0o755, Nlink: 2},
			}
			if tt.wantWh {
				want["wh"] = imgRec{Type: fs.ModeDevice | fs.ModeCharDevice, Perm: 0, Nlink: 1}
			}
			got := map[string]imgRec{}
			err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
				if err != nil || p == "." {
					return err
				}
				got[p], _ = statImage(t, fsys, p)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("image contents (-want +got):\n%s", diff)
			}
			if _, a := statImage(t, fsys, "t1-link"); true {
				if _, b := statImage(t, fsys, "t1-link2"); a != b {
					t.Errorf("t1-link and t1-link2 are inodes %d and %d, want one", a, b)
				}
			}
			fi, err := fs.Stat(fsys, "xd")
			if err != nil {
				t.Fatal(err)
			}
			wantX := map[string]string{"trusted.overlay.opaque": "y", "user.k": "v"}
			if diff := cmp.Diff(wantX, fi.Sys().(*erofs.Stat).Xattrs); diff != "" {
				t.Errorf("xattrs of xd (-want +got):\n%s", diff)
			}
			if info.Files != len(want) {
				t.Errorf("BuildFromTar().Files = %d, want %d", info.Files, len(want))
			}
		})
	}
}

func TestBuildFromTarRoot(t *testing.T) {
	root := dir("./", 0o700)
	root.Uid, root.Gid = 5, 6
	img, _ := mustBuildTar(t, makeTar(t, root, reg("f", "x", 0o644)), Options{})
	got, _ := statImage(t, readImage(t, img), ".")
	want := imgRec{Type: fs.ModeDir, Perm: 0o700, UID: 5, GID: 6, Nlink: 2}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("root of the layer (-want +got):\n%s", diff)
	}

	// Without a root entry: 0755, owned by 0:0.
	img, _ = mustBuildTar(t, makeTar(t, reg("f", "x", 0o644)), Options{})
	got, _ = statImage(t, readImage(t, img), ".")
	want = imgRec{Type: fs.ModeDir, Perm: 0o755, Nlink: 2}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("default root of the layer (-want +got):\n%s", diff)
	}
}

func TestBuildFromTarDeterministic(t *testing.T) {
	entries := []tarEntry{
		dir("a", 0o755), dir("a/b", 0o700), reg("a/b/c", "c", 0o644),
		reg("big", strings.Repeat("0123456789", 100_000), 0o755),
		symlink("s", "/abs"), reg("z", "", 0o600),
		{tar.Header{Typeflag: tar.TypeReg, Name: "nano", ModTime: time.Unix(1_600_000_000, 42), Size: 1}, "n"},
	}
	plain := makeTar(t, entries...)
	img1, info1 := mustBuildTar(t, plain, Options{})
	_, info2 := mustBuildTar(t, plain, Options{})
	_, infoGz := mustBuildTar(t, gzipped(t, plain), Options{})
	shuffled := append([]tarEntry(nil), entries...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	_, infoShuffled := mustBuildTar(t, makeTar(t, shuffled...), Options{})
	var mem memFile
	infoMem, err := BuildFromTar(context.Background(), bytes.NewReader(plain), &mem, Options{TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]Info{"again": info2, "gzip": infoGz, "shuffled": infoShuffled, "memory": infoMem} {
		if got != info1 {
			t.Errorf("BuildFromTar(%s) = %+v, want %+v", name, got, info1)
		}
	}
	b1, err := os.ReadFile(img1)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b1, mem.b) {
		t.Errorf("BuildFromTar into memory gave other bytes than into a file")
	}
	if digest, size := fileDigest(t, img1); digest != info1.Digest || size != info1.Size {
		t.Errorf("image file has digest %s and size %d, Info says %s and %d", digest, size, info1.Digest, info1.Size)
	}
}

// rawPAXPath returns a tar whose only entry has a PAX path record with a
// NUL byte, which tar.Writer refuses to write.
func rawPAXPath(t *testing.T) []byte {
	e := reg("aXXb-long-name-for-pax-"+strings.Repeat("p", 100), "x", 0o644)
	b := makeTar(t, e)
	i := bytes.Index(b, []byte("aXXb"))
	if i < 0 {
		t.Fatal("no PAX path record")
	}
	b[i+1] = 0
	return b
}

// oldGNUSparse returns a tar whose only entry is an old-style GNU sparse
// file of 1 GiB holding one byte of data.
func oldGNUSparse(t *testing.T) []byte {
	e := reg("holes", "x", 0o644)
	e.Format = tar.FormatGNU
	b := makeTar(t, e)
	h := b[:512]
	h[156] = tar.TypeGNUSparse
	copy(h[386:], "00000000000\x00") // sparse[0].offset
	copy(h[398:], "00000000001\x00") // sparse[0].numbytes
	copy(h[483:], "10000000000\x00") // realsize
	copy(h[148:], "        ")
	sum := 0
	for _, c := range h {
		sum += int(c)
	}
	copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func TestBuildFromTarRefuses(t *testing.T) {
	bigX := reg("x", "", 0o644)
	bigX.PAXRecords = map[string]string{"SCHILY.xattr.user.big": strings.Repeat("v", 70_000)}
	uid := reg("bigid", "", 0o644)
	uid.Uid = 1 << 33
	valid := makeTar(t, reg("file", strings.Repeat("d", 10_000), 0o644))
	tests := []struct {
		name string
		data []byte
		msg  string // the message must contain it
	}{
		{"absolute", makeTar(t, reg("/etc/passwd", "x", 0o644)), `"/etc/passwd"`},
		{"dotdot", makeTar(t, reg("../evil", "x", 0o644)), `"../evil"`},
		{"dotdot inside", makeTar(t, reg("a/../../evil", "x", 0o644)), `"a/../../evil"`},
		{"NUL in PAX path", rawPAXPath(t), "entry #1"},
		{"long component", makeTar(t, reg(strings.Repeat("n", 256), "x", 0o644)), "255"},
		{"link to missing", makeTar(t, hardlink("l", "nope")), `"l"`},
		{"link to later", makeTar(t, hardlink("l", "f"), reg("f", "x", 0o644)), `"l"`},
		{"link to directory", makeTar(t, dir("d", 0o755), hardlink("l", "d")), `"l"`},
		{"link to root", makeTar(t, hardlink("l", ".")), `"l"`},
		{"link absolute", makeTar(t, reg("etc/passwd", "x", 0o644), hardlink("l", "/etc/passwd")), `"l"`},
		{"link escaping", makeTar(t, reg("f", "x", 0o644), hardlink("l", "../f")), `"l"`},
		{"link to removed", makeTar(t, dir("d", 0o755), reg("d/f", "x", 0o644), reg("d", "", 0o644), hardlink("l", "d/f")), `"l"`},
		{"parent is a file", makeTar(t, reg("f", "x", 0o644), reg("f/x", "y", 0o644)), `"f/x"`},
		{"parent is a symlink", makeTar(t, dir("real", 0o755), symlink("l", "real"), reg("l/x", "y", 0o644)), `"l/x"`},
		{"parent is an outside symlink", makeTar(t, symlink("l", "/etc"), reg("l/passwd", "y", 0o644)), `"l/passwd"`},
		{"root is a file", makeTar(t, reg(".", "x", 0o644)), `"."`},
		{"empty symlink target", makeTar(t, symlink("s", "")), `"s"`},
		{"xattr too big", makeTar(t, bigX), `"x"`},
		{"uid out of range", makeTar(t, uid), `"bigid"`},
		{"empty stream", nil, "empty"},
		{"not a tar", bytes.Repeat([]byte("not a tar "), 100), "malformed"},
		{"truncated", valid[:2048], "truncated"},
		{"bad gzip", []byte{0x1f, 0x8b, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, "gzip"},
		{"truncated gzip", gzipped(t, valid)[:40], "truncated"},
		{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0}, "zstd"},
		{"sparse", oldGNUSparse(t), "sparse files are not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmp := t.TempDir()
			_, _, err := buildTar(t, tt.data, Options{TempDir: tmp})
			if !errdefs.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(errText(err), tt.msg) {
				t.Errorf("BuildFromTar(%s) = %v, want InvalidArgument mentioning %s", tt.name, err, tt.msg)
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Errorf("BuildFromTar(%s) left %d files in TempDir", tt.name, len(left))
			}
		})
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// failingReader returns its data, then err.
type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

func TestBuildFromTarMaxSize(t *testing.T) {
	bomb := gzipped(t, makeTar(t, reg("a", "small", 0o644), reg("zeros", strings.Repeat("\x00", 8<<20), 0o644)))
	_, _, err := buildTar(t, bomb, Options{MaxSize: 1 << 20})
	if !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("BuildFromTar(8 MiB of data, MaxSize 1 MiB) = %v, want ResourceExhausted", err)
	}
	if _, info, err := buildTar(t, bomb, Options{MaxSize: 8<<20 + 5}); err != nil || info.Files != 2 {
		t.Errorf("BuildFromTar(8 MiB + 5 B of data, MaxSize the same) = %+v, %v; want 2 files", info, err)
	}
}

func TestBuildFromTarReadError(t *testing.T) {
	errBroken := errors.New("connection reset")
	data := makeTar(t, reg("file", strings.Repeat("d", 10_000), 0o644))
	for _, n := range []int{0, 100, 600, 5000} {
		r := &failingReader{data: data[:n], err: errBroken}
		_, err := BuildFromTar(context.Background(), r, &memFile{}, Options{TempDir: t.TempDir()})
		if !errors.Is(err, errBroken) || errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("BuildFromTar(reader failing after %d bytes) = %v, want the reader's error", n, err)
		}
	}
}

func TestBuildFromTarCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	data := makeTar(t, reg("file", "x", 0o644))
	_, err := BuildFromTar(ctx, bytes.NewReader(data), &memFile{}, Options{TempDir: t.TempDir()})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("BuildFromTar(canceled) = %v, want context.Canceled", err)
	}
}

func TestCleanName(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"x", "x", true},
		{"./x", "x", true},
		{"x/", "x", true},
		{"./x/", "x", true},
		{"a//b/./c/", "a/b/c", true},
		{".", "", true},
		{"./", "", true},
		{"a/..", "", true},
		{"a/../b", "b", true},
		{"...", "...", true},
		{"..a/b..", "..a/b..", true},
		{`a\..\..\b`, `a\..\..\b`, true},
		{"", "", false},
		{"/", "", false},
		{"/x", "", false},
		{"..", "", false},
		{"../x", "", false},
		{"a/../..", "", false},
		{"./../x", "", false},
		{"a\x00b", "", false},
		{strings.Repeat("c", 256), "", false},
		{strings.Repeat("c/", 2049), "", false},
	}
	for _, tt := range tests {
		got, err := cleanName(tt.in)
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("cleanName(%q) = %q, %v; want %q, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
