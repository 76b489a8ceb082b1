package sparse

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// sparseFile makes a file of size bytes holding data at each offset of at.
func sparseFile(t *testing.T, dir string, size int64, at map[int64]string) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, s := range at {
		if _, err := f.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// allocated returns the bytes a file takes on disk.
func allocated(t *testing.T, name string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(name, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// holesSupported skips the test where the temporary directory's file
// system keeps no holes.
func holesSupported(t *testing.T, f *os.File, size int64) []Segment {
	t.Helper()
	segs, err := Segments(f, size)
	if err != nil {
		t.Fatalf("Segments = %v", err)
	}
	if !Holey(segs, size) {
		t.Skipf("the file system of %s reports no holes", f.Name())
	}
	return segs
}

func TestSegments(t *testing.T) {
	const mib = 1 << 20
	f := sparseFile(t, t.TempDir(), 64*mib, map[int64]string{8 * mib: "first", 40 * mib: "second"})
	segs := holesSupported(t, f, 64*mib)
	if len(segs) != 2 || segs[0].Offset > 8*mib || segs[0].End() < 8*mib+5 || segs[1].Offset > 40*mib || segs[1].End() < 40*mib+6 {
		t.Errorf("Segments = %v, want two segments around 8 MiB and 40 MiB", segs)
	}
	var data int64
	for _, s := range segs {
		data += s.Length
	}
	if data > 2*mib {
		t.Errorf("Segments = %v: %d bytes of data for 11 bytes written", segs, data)
	}
}

// TestRoundTrip writes a sparse file as a sparse entry, reads it back with
// archive/tar, and copies it out with Copy: the same bytes, the same size,
// and holes where the original had them.
func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	const size = 20 << 30 // as the attack: truncate -s 20G
	f := sparseFile(t, dir, size, map[int64]string{0: "head", 1 << 30: "middle", size - 3: "end"})
	segs := holesSupported(t, f, size)

	var archive bytes.Buffer
	w := NewWriter(&archive)
	mtime := time.Unix(1700000000, 123456789)
	if err := w.WriteHeader(&tar.Header{Name: "dir/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}); err != nil {
		t.Fatal(err)
	}
	hdr := &tar.Header{Name: "dir/sparse", Mode: 0o640, Uid: 1000000000, Gid: 5, ModTime: mtime, Size: size}
	if err := w.WriteSparse(context.Background(), hdr, f, segs); err != nil {
		t.Fatalf("WriteSparse = %v", err)
	}
	if err := w.WriteHeader(&tar.Header{Name: "dir/after", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5, ModTime: mtime}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, "after")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if archive.Len() > 4<<20 {
		t.Errorf("the archive of a 20 GiB file with 13 bytes of data is %d bytes", archive.Len())
	}

	tr := tar.NewReader(&archive)
	names := []string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Next = %v", err)
		}
		names = append(names, h.Name)
		if h.Name != "dir/sparse" {
			continue
		}
		want := tar.Header{Name: "dir/sparse", Mode: 0o640, Uid: 1000000000, Gid: 5, Size: size, ModTime: mtime, Typeflag: tar.TypeReg}
		got := tar.Header{Name: h.Name, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid, Size: h.Size, ModTime: h.ModTime, Typeflag: h.Typeflag}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("header (-want +got):\n%s", diff)
		}
		out, err := os.Create(filepath.Join(dir, "out"))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		n, err := Copy(out, tr)
		took := time.Since(start)
		out.Close()
		if err != nil || n != size {
			t.Fatalf("Copy = %d, %v; want %d", n, err, int64(size))
		}
		t.Logf("Copy of a 20 GiB sparse entry took %v", took)
		if a := allocated(t, out.Name()); a > 1<<20 {
			t.Errorf("the copy takes %d bytes on disk, want next to none", a)
		}
		got2, err := os.Open(out.Name())
		if err != nil {
			t.Fatal(err)
		}
		for off, s := range map[int64]string{0: "head", 1 << 30: "middle", size - 3: "end", 1 << 20: "\x00\x00"} {
			b := make([]byte, len(s))
			if _, err := got2.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			if string(b) != s {
				t.Errorf("copy at %d = %q, want %q", off, b, s)
			}
		}
		got2.Close()
	}
	if diff := cmp.Diff([]string{"dir/", "dir/sparse", "dir/after"}, names); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

// TestGNUTar checks that GNU tar reads the entries as sparse files.
func TestGNUTar(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar")
	}
	dir := t.TempDir()
	const size = 1 << 30
	f := sparseFile(t, dir, size, map[int64]string{512 << 20: "gnu"})
	segs := holesSupported(t, f, size)
	ar, err := os.Create(filepath.Join(dir, "a.tar"))
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter(ar)
	if err := w.WriteSparse(context.Background(), &tar.Header{Name: "big", Mode: 0o600, Size: size, ModTime: time.Now()}, f, segs); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	ar.Close()
	x := filepath.Join(dir, "x")
	os.Mkdir(x, 0o700)
	if out, err := exec.Command("tar", "-xf", ar.Name(), "-C", x).CombinedOutput(); err != nil {
		t.Fatalf("tar -x = %v\n%s", err, out)
	}
	fi, err := os.Stat(filepath.Join(x, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Errorf("GNU tar extracted %d bytes, want %d", fi.Size(), size)
	}
	if a := allocated(t, filepath.Join(x, "big")); a > 1<<20 {
		t.Errorf("GNU tar's copy takes %d bytes on disk: it did not see a sparse file", a)
	}
	b, _ := os.ReadFile(filepath.Join(x, "big"))
	if string(b[512<<20:512<<20+3]) != "gnu" {
		t.Errorf("GNU tar's copy lost the data")
	}
}

// TestCopyHoles checks that Copy leaves holes for zero blocks only.
func TestCopyHoles(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 3<<20+100)
	copy(data[2<<20:], "x")
	copy(data[len(data)-1:], "y")
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	n, err := Copy(out, bytes.NewReader(data))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("Copy = %d, %v", n, err)
	}
	got, _ := os.ReadFile(out.Name())
	if !bytes.Equal(got, data) {
		t.Errorf("Copy changed the bytes")
	}
	if a := allocated(t, out.Name()); a > 64<<10 {
		t.Errorf("the copy takes %d bytes on disk for two blocks of data", a)
	}
}

func TestWriteSparseRefusesBadSegments(t *testing.T) {
	for _, segs := range [][]Segment{
		{{10, 5}, {12, 5}},
		{{-1, 5}},
		{{0, 200}},
		make([]Segment, MaxSegments+1),
	} {
		w := NewWriter(io.Discard)
		err := w.WriteSparse(context.Background(), &tar.Header{Name: "f", Size: 100}, bytes.NewReader(nil), segs)
		if err == nil {
			t.Errorf("WriteSparse(%v) = nil, want an error", segs[:min(len(segs), 3)])
		}
	}
}

// rawEntry is an archive with one sparse entry whose map text is mapText as
// given (untrusted), realsize the stated apparent size, and data after the
// padded map.
func rawEntry(mapText string, realsize int64, data []byte) []byte {
	m := []byte(mapText)
	m = append(m, make([]byte, padding(int64(len(m))))...)
	blocks, err := headerBlocks(&tar.Header{Name: "f", Mode: 0o644, Size: realsize}, int64(len(m)+len(data)))
	if err != nil {
		panic(err)
	}
	out := append(blocks, m...)
	out = append(out, data...)
	out = append(out, make([]byte, padding(int64(len(data))))...)
	return append(out, make([]byte, 2*blockLen)...)
}

// FuzzSparseMap feeds archive/tar and Copy sparse entries with untrusted
// maps: whatever the map says, reading either fails or yields exactly the
// stated size, and what the map describes when it is valid.
func FuzzSparseMap(f *testing.F) {
	f.Add("1\n0\n5\n", int64(10), []byte("hello"))
	f.Add("2\n0\n1\n4\n1\n", int64(8), []byte("ab"))
	f.Add("0\n", int64(1<<20), []byte(nil))
	f.Add("1\n5\n5\n", int64(8), []byte("hello"))    // past realsize
	f.Add("2\n4\n1\n0\n1\n", int64(8), []byte("ab")) // out of order
	f.Add("1\n0\n9\n", int64(10), []byte("short"))   // data missing
	f.Add("99999999999\n", int64(10), []byte(nil))   // huge count
	f.Add("1\n-1\n5\n", int64(10), []byte("hello"))  // negative
	f.Add("1\n9223372036854775807\n1\n", int64(10), []byte("x"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, mapText string, realsize int64, data []byte) {
		if realsize > 64<<20 || len(mapText) > 1<<16 || len(data) > 1<<16 {
			return // a caller bounds the size before it creates anything
		}
		tr := tar.NewReader(bytes.NewReader(rawEntry(mapText, realsize, data)))
		hdr, err := tr.Next()
		if err != nil {
			return
		}
		if hdr.Size != realsize {
			t.Fatalf("header size = %d, want the stated %d", hdr.Size, realsize)
		}
		out, err := os.CreateTemp(dir, "out")
		if err != nil {
			t.Fatal(err)
		}
		defer os.Remove(out.Name())
		defer out.Close()
		n, err := Copy(out, tr)
		if err != nil {
			return
		}
		if n != realsize {
			t.Fatalf("Copy = %d bytes without an error, want the stated %d", n, realsize)
		}
		// A map that reads cleanly must be one we can check ourselves.
		segs, ok := parseMap(mapText)
		if !ok {
			return
		}
		want := make([]byte, realsize)
		p := data
		for _, s := range segs {
			copy(want[s.Offset:s.End()], p[:s.Length])
			p = p[s.Length:]
		}
		got, err := os.ReadFile(out.Name())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("map %q over %q: the copy differs from what the map describes", mapText, data)
		}
	})
}

// parseMap parses a sparse map text strictly, for the fuzz test's oracle.
func parseMap(s string) ([]Segment, bool) {
	lines := strings.Split(s, "\n")
	n, err := strconv.Atoi(lines[0])
	if err != nil || n < 0 || len(lines) < 2*n+1 {
		return nil, false
	}
	segs := make([]Segment, n)
	for i := range segs {
		off, err1 := strconv.ParseInt(lines[1+2*i], 10, 64)
		l, err2 := strconv.ParseInt(lines[2+2*i], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, false
		}
		segs[i] = Segment{off, l}
	}
	return segs, true
}

func ExampleHoley() {
	fmt.Println(Holey([]Segment{{0, 10}}, 10), Holey([]Segment{{0, 10}}, 20), Holey(nil, 0))
	// Output: false true false
}
