//go:build linux

package dsec

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestSparseRoundTrip: UploadDir sends a sparse file as its data only and
// DownloadDir writes it back sparse; WithMaxSize refuses it by its
// apparent size on either way.
func TestSparseRoundTrip(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	sb := c.Sandbox("sb-a")

	src := t.TempDir()
	const size = 8 << 30
	p := filepath.Join(src, "sparse")
	fl, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := fl.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := fl.WriteAt([]byte("data"), 3<<30); err != nil {
		t.Fatal(err)
	}
	fl.Close()
	if allocated(t, p) > 1<<20 {
		t.Skip("the temporary directory's file system keeps no holes")
	}

	if _, err := sb.UploadDir(ctx, src, "/dst", WithMaxSize(size-1)); !errors.As(err, new(*SizeLimitError)) || !errors.Is(err, ErrResourceExhausted) {
		t.Errorf("UploadDir(%d-byte sparse file, WithMaxSize %d) = %v, want a SizeLimitError", int64(size), int64(size-1), err)
	}
	if _, err := sb.UploadDir(ctx, src, "/dst", WithMaxSize(size)); err != nil {
		t.Fatalf("UploadDir = %v", err)
	}
	f.mu.Lock()
	stored := f.tars["sb-a/dst"]
	f.mu.Unlock()
	if len(stored) > 64<<10 {
		t.Errorf("UploadDir sent %d bytes for an 8 GiB file with 4 bytes of data", len(stored))
	}

	dst := filepath.Join(t.TempDir(), "copy")
	if err := sb.DownloadDir(ctx, "/dst", dst, WithMaxSize(size-1)); !errors.As(err, new(*SizeLimitError)) {
		t.Errorf("DownloadDir(WithMaxSize %d) = %v, want a SizeLimitError", int64(size-1), err)
	}
	if _, err := os.Stat(filepath.Join(dst, "sparse")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("DownloadDir refused the file but left %v", err)
	}
	if err := sb.DownloadDir(ctx, "/dst", dst, WithMaxSize(size)); err != nil {
		t.Fatalf("DownloadDir = %v", err)
	}
	out := filepath.Join(dst, "sparse")
	fi, err := os.Stat(out)
	if err != nil || fi.Size() != size {
		t.Fatalf("downloaded %v, %v; want %d bytes", fi, err, int64(size))
	}
	if a := allocated(t, out); a > 1<<20 {
		t.Errorf("the downloaded file takes %d bytes on disk, want it sparse", a)
	}
	g, _ := os.Open(out)
	defer g.Close()
	b := make([]byte, 4)
	if _, err := g.ReadAt(b, 3<<30); err != nil || string(b) != "data" {
		t.Errorf("data at 3 GiB = %q, %v", b, err)
	}
}
