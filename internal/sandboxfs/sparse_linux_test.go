package sandboxfs

import (
	"bytes"
	"context"
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// allocated returns the bytes the file at p takes on disk.
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestTarSparse: a 20 GiB file made with truncate in a sandbox is carried
// by WriteTar as a sparse entry of a few KiB, and ExtractTar makes it a
// sparse file again, with its data where it was.
func TestTarSparse(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	const size = 20 << 30
	mustMkdir(t, s.path("src"), s.path("dst"))
	f, err := os.Create(s.path("src/sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("middle"), 7<<30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if a := allocated(t, s.path("src/sparse")); a > 1<<20 {
		t.Skipf("the test's file system allocated %d bytes for a sparse file", a)
	}

	var archive bytes.Buffer
	st, err := r.WriteTar(context.Background(), "/src", &archive, TarOptions{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatalf("WriteTar(20 GiB sparse file, MaxBytes 1 MiB) = %v; holes must not count", err)
	}
	if archive.Len() > 64<<10 || st.Bytes > 64<<10 {
		t.Errorf("WriteTar of a 20 GiB sparse file: %d bytes of archive, %d of data; want a few KiB", archive.Len(), st.Bytes)
	}
	hdrs := readTar(t, archive.Bytes())
	if h := hdrs["src/sparse"]; h == nil || h.Size != size || h.PAXRecords["GNU.sparse.major"] != "1" || h.PAXRecords["GNU.sparse.minor"] != "0" {
		t.Fatalf("WriteTar entry src/sparse = %+v, want a GNU sparse 1.0 entry of %d bytes", h, int64(size))
	}

	start := time.Now()
	xs, err := r.ExtractTar(context.Background(), "/dst", bytes.NewReader(archive.Bytes()), ownerOpts())
	if err != nil {
		t.Fatalf("ExtractTar(sparse) = %v", err)
	}
	t.Logf("ExtractTar of a 20 GiB sparse file took %v", time.Since(start))
	if xs.Bytes != size {
		t.Errorf("ExtractTar stats = %+v, want %d bytes", xs, int64(size))
	}
	out := s.path("dst/src/sparse")
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Errorf("extracted size = %d, want %d", fi.Size(), int64(size))
	}
	if a := allocated(t, out); a > 1<<20 {
		t.Errorf("the extracted file takes %d bytes on disk, want it sparse", a)
	}
	g, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	b := make([]byte, 6)
	if _, err := g.ReadAt(b, 7<<30); err != nil || string(b) != "middle" {
		t.Errorf("extracted data at 7 GiB = %q, %v; want %q", b, err, "middle")
	}
	assertNoTemp(t, s.root)
}

// TestExtractTarSparseBounded: a small archive stating a huge sparse file
// is refused before anything is written.
func TestExtractTarSparseBounded(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	mustMkdir(t, s.path("dst"))
	for _, tt := range []struct {
		archive []byte
		opts    ExtractOptions
	}{
		{sparseTar(t, "huge", 1<<62, "x"), ownerOpts()},
		{sparseTar(t, "big", 2<<20, "x"), ExtractOptions{MaxSize: 1 << 20}},
	} {
		_, err := r.ExtractTar(context.Background(), "/dst", bytes.NewReader(tt.archive), tt.opts)
		if errdefs.Kind(err) != errdefs.ErrResourceExhausted {
			t.Errorf("ExtractTar(sparse entry over the limit) = %v, want ResourceExhausted", err)
		}
	}
	if entries, _ := os.ReadDir(s.path("dst")); len(entries) != 0 {
		t.Errorf("refused sparse archives left %d entries", len(entries))
	}
	// Within the limit it is fine.
	if _, err := r.ExtractTar(context.Background(), "/dst", bytes.NewReader(sparseTar(t, "ok", 1<<20, "x")), ExtractOptions{MaxSize: 1 << 20}); err != nil {
		t.Errorf("ExtractTar(1 MiB sparse, MaxSize 1 MiB) = %v", err)
	}
	if b, err := os.ReadFile(s.path("dst/ok")); err != nil || len(b) != 1<<20 || b[0] != 'x' {
		t.Errorf("extracted ok: %d bytes, %v", len(b), err)
	}
	_, err := ValidateTar(io.MultiReader(bytes.NewReader(sparseTar(t, "a", 1<<62, ""))), "/dst", 0)
	if errdefs.Kind(err) != errdefs.ErrResourceExhausted {
		t.Errorf("ValidateTar(2^62-byte sparse entry) = %v, want ResourceExhausted", err)
	}
}
