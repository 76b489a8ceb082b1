package sandboxfs

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/api/sparse"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// ent is an archive entry for tests.
type ent struct {
	name string
	typ  byte // 0 means tar.TypeReg
	data string
	link string
	mode int64
}

func tFile(name, data string) ent       { return ent{name: name, data: data} }
func tDir(name string) ent              { return ent{name: name, typ: tar.TypeDir} }
func tSymlink(name, target string) ent  { return ent{name: name, typ: tar.TypeSymlink, link: target} }
func tHardlink(name, target string) ent { return ent{name: name, typ: tar.TypeLink, link: target} }

// makeTar writes entries as a PAX archive.
func makeTar(t testing.TB, entries ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode,
			Size: int64(len(e.data)), ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX,
		}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if hdr.Typeflag != tar.TypeReg {
			hdr.Size = 0
		}
		if hdr.Typeflag == tar.TypeChar || hdr.Typeflag == tar.TypeBlock {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("WriteHeader(%q): %v", e.name, err)
		}
		if hdr.Size > 0 {
			if _, err := tw.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// rawBlock is a ustar header block, for archives tar.Writer will not write.
func rawBlock(name string, typ byte, size int) []byte {
	b := make([]byte, 512)
	copy(b[0:], name)
	copy(b[100:], "0000644\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], fmt.Sprintf("%011o\x00", size))
	copy(b[136:], "00000000000\x00")
	b[156] = typ
	copy(b[257:], "ustar\x0000")
	copy(b[148:], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// paxNameTar is an archive of one empty file whose PAX path record is name,
// which may hold bytes tar.Writer refuses (a NUL).
func paxNameTar(name string) []byte {
	rec := " path=" + name + "\n"
	n := len(rec) + 1
	for len(strconv.Itoa(n))+len(rec) != n {
		n++
	}
	rec = strconv.Itoa(n) + rec
	var b bytes.Buffer
	b.Write(rawBlock("PaxHeaders/x", tar.TypeXHeader, len(rec)))
	b.WriteString(rec)
	b.Write(make([]byte, (512-len(rec)%512)%512))
	b.Write(rawBlock("placeholder", tar.TypeReg, 0))
	b.Write(make([]byte, 1024))
	return b.Bytes()
}

func TestValidateTar(t *testing.T) {
	deep := strings.Repeat("d/", 2100) + "f"
	var chain []ent // 2000 links, each to the one before
	chain = append(chain, tDir("c0"))
	for i := 1; i <= 2000; i++ {
		chain = append(chain, tSymlink("c"+strconv.Itoa(i), "c"+strconv.Itoa(i-1)))
	}
	tests := []struct {
		name     string
		dest     string
		tar      []byte
		max      int
		want     TarStats
		wantKind error
	}{
		{name: "empty archive", tar: makeTar(t)},
		{name: "no bytes at all", tar: nil},
		{name: "files and dirs", tar: makeTar(t, tDir("./"), tDir("a/"), tFile("a/f", "12345"), tFile("./b", ""), ent{name: "p", typ: tar.TypeFifo}),
			want: TarStats{Files: 3, Dirs: 1, Bytes: 5}},
		{name: "duplicates, later wins", tar: makeTar(t, tFile("a", "1"), tSymlink("a", "b"), tFile("a", "22")),
			want: TarStats{Files: 2, Links: 1, Bytes: 3}},
		{name: "links that stay in", tar: makeTar(t, tDir("lib"), tSymlink("lib64", "lib"), tSymlink("x", "lib64/foo"), tSymlink("d/b", ".."), tSymlink("d/e", "../lib/../d/./b"), tSymlink("y", "d/b/lib")),
			want: TarStats{Dirs: 1, Links: 5}},
		{name: "absolute link under dest", dest: "/dest", tar: makeTar(t, tSymlink("l", "/dest/x"), tSymlink("m", "//dest/./"), tSymlink("n", "/dest")),
			want: TarStats{Links: 3}},
		{name: "absolute link, dest is the root", dest: "/", tar: makeTar(t, tSymlink("usr/lib64", "/usr/lib"), tSymlink("lib", "usr/lib")),
			want: TarStats{Links: 2}},
		{name: "link through unknown names", tar: makeTar(t, tSymlink("a/l", "x/y/../../z")), want: TarStats{Links: 1}},
		{name: "hard links", tar: makeTar(t, tFile("f", "x"), tHardlink("g", "./f"), tHardlink("h", "g"), tSymlink("s", "f"), tHardlink("t", "s")),
			want: TarStats{Files: 1, Bytes: 1, Links: 4}},
		{name: "long chain of links", tar: makeTar(t, chain...), want: TarStats{Dirs: 1, Links: 2000}},

		{name: "absolute name", tar: makeTar(t, tFile("/etc/x", "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "dotdot", tar: makeTar(t, tFile("../x", "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "dotdot inside", tar: makeTar(t, tFile("a/../../x", "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "any dotdot", tar: makeTar(t, tFile("a/../b", "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "NUL in name", tar: paxNameTar("a\x00b"), wantKind: errdefs.ErrInvalidArgument},
		{name: "long element", tar: makeTar(t, tFile(strings.Repeat("n", 256), "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "long path", tar: makeTar(t, tFile(deep, "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "file as dest", tar: append(rawBlock("./", tar.TypeReg, 0), make([]byte, 1024)...), wantKind: errdefs.ErrInvalidArgument},
		{name: "char device", tar: makeTar(t, ent{name: "null", typ: tar.TypeChar}), wantKind: errdefs.ErrInvalidArgument},
		{name: "block device", tar: makeTar(t, ent{name: "sda", typ: tar.TypeBlock}), wantKind: errdefs.ErrInvalidArgument},
		{name: "unknown type", tar: makeTar(t, ent{name: "c", typ: tar.TypeCont}), wantKind: errdefs.ErrInvalidArgument},
		{name: "write through own link", tar: makeTar(t, tSymlink("a", "/"), tFile("a/etc/x", "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "write through own link in dest", tar: makeTar(t, tDir("b"), tSymlink("a", "b"), tFile("a/x", "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "link made after the write", tar: makeTar(t, tFile("a/x", ""), tSymlink("a", "b")), wantKind: errdefs.ErrInvalidArgument},
		{name: "under a file", tar: makeTar(t, tFile("f", ""), tFile("f/x", "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "dir and file", tar: makeTar(t, tFile("a", ""), tDir("a")), wantKind: errdefs.ErrInvalidArgument},
		{name: "link climbs out", tar: makeTar(t, tSymlink("l", "../x")), wantKind: errdefs.ErrInvalidArgument},
		{name: "link climbs out and back", dest: "/dest", tar: makeTar(t, tSymlink("l", "../dest/x")), wantKind: errdefs.ErrInvalidArgument},
		{name: "absolute link out", dest: "/dest", tar: makeTar(t, tSymlink("l", "/etc")), wantKind: errdefs.ErrInvalidArgument},
		{name: "absolute link to dest's parent", dest: "/dest/sub", tar: makeTar(t, tSymlink("l", "/dest")), wantKind: errdefs.ErrInvalidArgument},
		{name: "absolute link out through dotdot", dest: "/dest", tar: makeTar(t, tSymlink("l", "/dest/../etc")), wantKind: errdefs.ErrInvalidArgument},
		{name: "link out through a link", tar: makeTar(t, tSymlink("d/b", ".."), tSymlink("d/c", "b/../..")), wantKind: errdefs.ErrInvalidArgument},
		{name: "link out through a later link", tar: makeTar(t, tSymlink("d/c", "b/.."), tSymlink("d/b", "..")), wantKind: errdefs.ErrInvalidArgument},
		{name: "link loop", tar: makeTar(t, tSymlink("l1", "l2"), tSymlink("l2", "l1")), wantKind: errdefs.ErrInvalidArgument},
		{name: "empty link", tar: makeTar(t, tSymlink("l", "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "hard link to a later entry", tar: makeTar(t, tHardlink("h", "f"), tFile("f", "")), wantKind: errdefs.ErrInvalidArgument},
		{name: "hard link to nothing", tar: makeTar(t, tHardlink("h", "f")), wantKind: errdefs.ErrInvalidArgument},
		{name: "hard link to a dir", tar: makeTar(t, tDir("d"), tHardlink("h", "d")), wantKind: errdefs.ErrInvalidArgument},
		{name: "hard link to an absolute path", tar: makeTar(t, tHardlink("h", "/etc/shadow")), wantKind: errdefs.ErrInvalidArgument},
		{name: "hard link out", tar: makeTar(t, tHardlink("h", "../x")), wantKind: errdefs.ErrInvalidArgument},
		{name: "too many entries", max: 3, tar: makeTar(t, tFile("a", ""), tFile("b", ""), tFile("c", ""), tFile("d", "")), wantKind: errdefs.ErrResourceExhausted},
		{name: "cut short", tar: makeTar(t, tFile("a", strings.Repeat("x", 2000)))[:1500], wantKind: errdefs.ErrInvalidArgument},
		{name: "garbage", tar: bytes.Repeat([]byte("not a tar "), 100), wantKind: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dest := tt.dest
			if dest == "" {
				dest = "/dest"
			}
			start := time.Now()
			got, err := ValidateTar(bytes.NewReader(tt.tar), dest, tt.max)
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("ValidateTar took %v", d)
			}
			if tt.wantKind != nil {
				if errdefs.Kind(err) != tt.wantKind {
					t.Errorf("ValidateTar(%s) = %+v, %v, want kind %v", tt.name, got, err, tt.wantKind)
				}
				return
			}
			if err != nil {
				t.Fatalf("ValidateTar(%s) = %v", tt.name, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ValidateTar(%s) stats differ (-want +got):\n%s", tt.name, diff)
			}
		})
	}
}

func TestValidateTarMessages(t *testing.T) {
	tests := []struct {
		tar  []byte
		want string
	}{
		{makeTar(t, tSymlink("a", "/"), tFile("a/etc/x", "")), `archive entry "a/etc/x": it lies under "a", which the archive makes a symbolic link; an archive may not write through its own links`},
		{makeTar(t, tSymlink("a", "/")), `archive entry "a": it is a symbolic link to "/", which is outside /dest (links out)`},
		{makeTar(t, tSymlink("a/b", "../../etc")), `archive entry "a/b": it is a symbolic link to "../../etc", which climbs above /dest (links out)`},
		{makeTar(t, tSymlink("a", "."), tFile("a/etc/x", "")), `archive entry "a/etc/x": it lies under "a", which the archive makes a symbolic link; an archive may not write through its own links`},
		{makeTar(t, tFile("../x", "")), `archive entry "../x": its name has a ".." element; archive paths must stay inside the destination`},
		{makeTar(t, tHardlink("h", "f")), `archive entry "h": it is a hard link to "f", which is not an earlier entry of the archive`},
	}
	for _, tt := range tests {
		_, err := ValidateTar(bytes.NewReader(tt.tar), "/dest", 0)
		if errString(err) != tt.want {
			t.Errorf("ValidateTar() = %v, want %q", err, tt.want)
		}
	}
}

// FuzzValidateTar: whatever the bytes, ValidateTar does not panic, and
// what it accepts has only clean relative names, hard links to earlier
// entries, and no devices.
func FuzzValidateTar(f *testing.F) {
	for _, seed := range [][]byte{
		makeTar(f),
		makeTar(f, tDir("./"), tDir("a"), tFile("a/f", "data"), tSymlink("a/l", "f"), tHardlink("h", "a/f"), ent{name: "p", typ: tar.TypeFifo}),
		makeTar(f, tSymlink("a", "/"), tFile("a/etc/x", "x")),
		makeTar(f, tSymlink("d/b", ".."), tSymlink("d/c", "b/../..")),
		makeTar(f, tSymlink("l", "/dest/x"), tSymlink("m", "l/../y")),
		makeTar(f, tFile("../x", "x"), tHardlink("h", "../x")),
		makeTar(f, tSymlink("l1", "l2"), tSymlink("l2", "l1")),
		makeTar(f, ent{name: "null", typ: tar.TypeChar}),
		paxNameTar("a\x00b"),
		sparseTar(f, "sparse", 1<<20, "data"),
	} {
		f.Add(seed, "/dest")
	}
	f.Add(makeTar(f, tSymlink("usr/lib64", "/usr/lib")), "/")
	f.Fuzz(func(t *testing.T, data []byte, dest string) {
		plan, err := checkTar(bytes.NewReader(data), dest, 100, 1<<30, false)
		if err != nil {
			if k := errdefs.Kind(err); k != errdefs.ErrInvalidArgument && k != errdefs.ErrResourceExhausted {
				t.Fatalf("ValidateTar() = %v, want InvalidArgument or ResourceExhausted", err)
			}
			return
		}
		seen := map[string]byte{}
		for _, e := range plan.entries {
			if e.typ == 0 {
				continue
			}
			for _, n := range []string{e.name, e.linkname} {
				if n == "" || (n == e.linkname && e.typ != tar.TypeLink) {
					continue
				}
				if strings.HasPrefix(n, "/") {
					t.Fatalf("accepted entry %q: absolute %q", e.raw, n)
				}
				for elem := range strings.SplitSeq(n, "/") {
					if elem == "" || elem == "." || elem == ".." {
						t.Fatalf("accepted entry %q: %q has the element %q", e.raw, n, elem)
					}
				}
			}
			switch e.typ {
			case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeFifo:
			case tar.TypeLink:
				if typ, ok := seen[e.linkname]; !ok || typ == tar.TypeDir {
					t.Fatalf("accepted entry %q: a hard link to %q, not an earlier file", e.raw, e.linkname)
				}
			default:
				t.Fatalf("accepted entry %q of type %q", e.raw, e.typ)
			}
			if e.typ != tar.TypeDir && e.mode&0o6000 != 0 {
				t.Fatalf("accepted entry %q keeps setuid or setgid: %o", e.raw, e.mode)
			}
			seen[e.name] = e.typ
		}
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// sparseTar is an archive of one sparse entry stating size bytes.
func sparseTar(t testing.TB, name string, size int64, data string) []byte {
	var buf bytes.Buffer
	w := sparse.NewWriter(&buf)
	segs := []sparse.Segment{{Offset: 0, Length: int64(len(data))}}
	if err := w.WriteSparse(context.Background(), &tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: time.Unix(1700000000, 0)},
		strings.NewReader(data), segs); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
