package dsec

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// onlyReader hides every method but Read.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func TestFileRoundTrip5MiB(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	sb := c.Sandbox("sb-a")

	data := make([]byte, 5<<20+123)
	rand.NewChaCha8([32]byte{1}).Read(data)

	info, err := sb.Upload(ctx, "/data/blob", onlyReader{bytes.NewReader(data)},
		WithMode(0o640|fs.ModeSetgid), WithMakeParents(), WithOwner("1000:1000"))
	if err != nil {
		t.Fatalf("Upload: %v", err)
	}
	if info.Size != int64(len(data)) || info.Path != "/data/blob" || info.Mode != 0o640|fs.ModeSetgid {
		t.Errorf("Upload = %+v, want size %d, mode %v", info, len(data), 0o640|fs.ModeSetgid)
	}
	wantHeader := &sandboxv1.WriteFileHeader{SandboxId: "sb-a", Path: "/data/blob", Mode: 0o2640, MakeParents: true, User: "1000:1000"}
	if diff := cmp.Diff(wantHeader, f.writeHeader(0), protocmp.Transform()); diff != "" {
		t.Errorf("WriteFile header (-want +got):\n%s", diff)
	}
	wantChunks := []int{chunkSize, chunkSize, chunkSize, chunkSize, chunkSize, 123}
	if diff := cmp.Diff(wantChunks, f.chunks()); diff != "" {
		t.Errorf("upload chunk sizes (-want +got):\n%s", diff)
	}

	var out bytes.Buffer
	got, err := sb.Download(ctx, "/data/blob", &out)
	if err != nil {
		t.Fatalf("Download: %v", err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Errorf("Download returned %d bytes that differ from the %d uploaded", out.Len(), len(data))
	}
	wantInfo := FileInfo{Path: "/data/blob", Size: int64(len(data)), Mode: 0o755 | fs.ModeSetuid, UID: 1000, GID: 100,
		ModTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if diff := cmp.Diff(wantInfo, got); diff != "" {
		t.Errorf("Download info (-want +got):\n%s", diff)
	}

	read, err := sb.ReadFile(ctx, "/data/blob")
	if err != nil || !bytes.Equal(read, data) {
		t.Errorf("ReadFile = %d bytes, %v; want the %d uploaded", len(read), err, len(data))
	}

	// Small and empty files: one chunk, or none.
	for _, small := range [][]byte{[]byte("hello"), {}} {
		if err := sb.WriteFile(ctx, "/small", small); err != nil {
			t.Fatalf("WriteFile(%q): %v", small, err)
		}
		want := []int{len(small)}
		if len(small) == 0 {
			want = nil
		}
		if diff := cmp.Diff(want, f.chunks()); diff != "" {
			t.Errorf("WriteFile(%q) chunks (-want +got):\n%s", small, diff)
		}
		back, err := sb.ReadFile(ctx, "/small")
		if err != nil || !bytes.Equal(back, small) {
			t.Errorf("ReadFile after WriteFile(%q) = %q, %v", small, back, err)
		}
	}

	if _, err := sb.ReadFile(ctx, "/missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadFile(/missing) = %v, want ErrNotFound", err)
	}
}

func TestUploadReadErrorAbandons(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	boom := errors.New("disk on fire")
	_, err := c.Sandbox("sb-a").Upload(t.Context(), "/partial", &errReader{n: 2*chunkSize + 10, err: boom})
	if !errors.Is(err, boom) {
		t.Fatalf("Upload with a failing reader = %v, want it to wrap %v", err, boom)
	}
	select {
	case serr := <-f.writeDone:
		if serr == nil {
			t.Errorf("server finished the abandoned upload without error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server's WriteFile did not end after the client abandoned it")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.files["sb-a/partial"]; ok {
		t.Errorf("server kept a partial file after the upload was abandoned")
	}
}

func TestModeConversion(t *testing.T) {
	for _, m := range []fs.FileMode{0, 0o644, 0o755 | fs.ModeSetuid, 0o777 | fs.ModeSticky, 0o750 | fs.ModeSetgid} {
		if got := goMode(unixMode(m), false); got != m {
			t.Errorf("goMode(unixMode(%v)) = %v, want %v", m, got, m)
		}
	}
	if got := goMode(0o40755, true); got != fs.ModeDir|0o755 {
		t.Errorf("goMode(0o40755, dir) = %v, want %v", got, fs.ModeDir|0o755)
	}
}
