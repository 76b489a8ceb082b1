package blobstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func digestOf(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

func newStore(t *testing.T) (*Dir, string) {
	t.Helper()
	root := t.TempDir()
	d, err := New(root)
	if err != nil {
		t.Fatalf("New(%q) = %v", root, err)
	}
	return d, root
}

// files lists the names in the store's directory, temporary ones too.
func files(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestRoundTrip(t *testing.T) {
	d, root := newStore(t)
	ctx := context.Background()
	blobs := [][]byte{nil, []byte("x"), bytes.Repeat([]byte("layer"), 1<<20)}
	var want []Desc
	for i, b := range blobs {
		wantDigest := ""
		if i%2 == 1 {
			wantDigest = digestOf(b)
		}
		desc, err := d.Put(ctx, bytes.NewReader(b), wantDigest)
		if err != nil {
			t.Fatalf("Put(blob %d) = %v", i, err)
		}
		if w := (Desc{Digest: digestOf(b), Size: int64(len(b))}); desc != w {
			t.Errorf("Put(blob %d) = %+v, want %+v", i, desc, w)
		}
		want = append(want, desc)

		if got, err := d.Stat(desc.Digest); err != nil || got != desc {
			t.Errorf("Stat(%q) = %+v, %v; want %+v", desc.Digest, got, err, desc)
		}
		f, err := d.Open(desc.Digest)
		if err != nil {
			t.Fatalf("Open(%q) = %v", desc.Digest, err)
		}
		got, err := io.ReadAll(f)
		f.Close()
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("Open(%q) read %d bytes, %v; want the %d bytes put", desc.Digest, len(got), err, len(b))
		}
		p, err := d.Path(desc.Digest)
		if err != nil {
			t.Fatalf("Path(%q) = %v", desc.Digest, err)
		}
		if wantPath := filepath.Join(root, "sha256", desc.Digest[len("sha256:"):]); p != wantPath {
			t.Errorf("Path(%q) = %q, want %q", desc.Digest, p, wantPath)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != 0o400 {
			t.Errorf("blob %s has mode %v, want -r-------- (the owner's only)", desc.Digest, fi.Mode())
		}
	}

	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	sortDescs(want)
	if diff := cmp.Diff(want, list); diff != "" {
		t.Errorf("List() (-want +got):\n%s", diff)
	}

	// A new Dir on the same root sees the same blobs.
	d2, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	if list2, err := d2.List(); err != nil || !cmp.Equal(list, list2) {
		t.Errorf("List() of a reopened store = %v, %v; want %v", list2, err, list)
	}

	for _, desc := range want {
		if err := d.Delete(desc.Digest); err != nil {
			t.Errorf("Delete(%q) = %v", desc.Digest, err)
		}
		if _, err := d.Stat(desc.Digest); !errdefs.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Stat(%q) after Delete = %v, want NotFound", desc.Digest, err)
		}
		if err := d.Delete(desc.Digest); err != nil {
			t.Errorf("second Delete(%q) = %v, want nil", desc.Digest, err)
		}
	}
	if names := files(t, root); len(names) != 0 {
		t.Errorf("store holds %q after deleting every blob, want nothing", names)
	}
}

func sortDescs(ds []Desc) {
	slices.SortFunc(ds, func(a, b Desc) int { return strings.Compare(a.Digest, b.Digest) })
}

func TestMissing(t *testing.T) {
	d, _ := newStore(t)
	missing := digestOf([]byte("never put"))
	if _, err := d.Stat(missing); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat(%q) = %v, want NotFound", missing, err)
	}
	if f, err := d.Open(missing); !errdefs.Is(err, errdefs.ErrNotFound) {
		f.Close()
		t.Errorf("Open(%q) = %v, want NotFound", missing, err)
	}
	if _, err := d.Path(missing); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Path(%q) = %v, want NotFound", missing, err)
	}
}

func TestPutMismatch(t *testing.T) {
	d, root := newStore(t)
	data := []byte("what was sent")
	wrong := digestOf([]byte("what was announced"))
	_, err := d.Put(context.Background(), bytes.NewReader(data), wrong)
	if !errdefs.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), wrong) || !strings.Contains(err.Error(), digestOf(data)) {
		t.Errorf("Put(data, %q) = %v, want InvalidArgument naming both digests", wrong, err)
	}
	if names := files(t, root); len(names) != 0 {
		t.Errorf("store holds %q after a failed Put, want nothing", names)
	}
	if _, err := d.Stat(digestOf(data)); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat(actual digest) after a failed Put = %v, want NotFound", err)
	}
}

// failReader fails every read.
type failReader struct{ err error }

func (f failReader) Read([]byte) (int, error) { return 0, f.err }

func TestPutExisting(t *testing.T) {
	d, root := newStore(t)
	data := []byte("once")
	desc, err := d.Put(context.Background(), bytes.NewReader(data), "")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := d.Path(desc.Digest)
	before, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)

	// With the digest: r is not even read.
	got, err := d.Put(context.Background(), failReader{errors.New("must not be read")}, desc.Digest)
	if err != nil || got != desc {
		t.Errorf("Put(existing, %q) = %+v, %v; want %+v", desc.Digest, got, err, desc)
	}
	// Without: the bytes are read and checked, the file stays.
	got, err = d.Put(context.Background(), bytes.NewReader(data), "")
	if err != nil || got != desc {
		t.Errorf("Put(existing) = %+v, %v; want %+v", got, err, desc)
	}
	after, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("Put of an existing blob rewrote its file")
	}
	if names := files(t, root); len(names) != 1 {
		t.Errorf("store holds %q, want one blob", names)
	}
}

func TestPutReadError(t *testing.T) {
	d, root := newStore(t)
	errBroken := errors.New("connection reset")
	r := io.MultiReader(strings.NewReader("partial"), failReader{errBroken})
	if _, err := d.Put(context.Background(), r, ""); !errors.Is(err, errBroken) {
		t.Errorf("Put(failing reader) = %v, want %v", err, errBroken)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Put(ctx, strings.NewReader("data"), ""); !errors.Is(err, context.Canceled) {
		t.Errorf("Put(canceled) = %v, want context.Canceled", err)
	}
	if names := files(t, root); len(names) != 0 {
		t.Errorf("store holds %q after failed Puts, want nothing", names)
	}
}

func TestConcurrentPut(t *testing.T) {
	d, root := newStore(t)
	same := bytes.Repeat([]byte("same"), 256<<10)
	const n = 16
	var wg sync.WaitGroup
	descs := make([]Desc, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			want := ""
			if i%2 == 0 {
				want = digestOf(same)
			}
			descs[i], errs[i] = d.Put(context.Background(), bytes.NewReader(same), want)
		})
	}
	// Different blobs at the same time, through another Dir.
	other, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	otherDescs := make([]Desc, n)
	for i := range n {
		wg.Go(func() {
			b := fmt.Appendf(nil, "blob %d", i)
			var err error
			otherDescs[i], err = other.Put(context.Background(), bytes.NewReader(b), digestOf(b))
			if err != nil {
				t.Errorf("Put(blob %d) = %v", i, err)
			}
		})
	}
	wg.Wait()
	want := Desc{Digest: digestOf(same), Size: int64(len(same))}
	for i := range n {
		if errs[i] != nil || descs[i] != want {
			t.Errorf("concurrent Put %d = %+v, %v; want %+v", i, descs[i], errs[i], want)
		}
	}
	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n+1 {
		t.Errorf("List() has %d blobs, want %d", len(list), n+1)
	}
	if names := files(t, root); len(names) != n+1 {
		t.Errorf("store holds %d files, want %d (no temporary file left)", len(names), n+1)
	}
	f, err := d.Open(want.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, err := io.ReadAll(f); err != nil || !bytes.Equal(got, same) {
		t.Errorf("blob put concurrently reads back %d bytes, %v; want the %d bytes", len(got), err, len(same))
	}
}

func TestNewRemovesAbandonedUploads(t *testing.T) {
	d, root := newStore(t)
	desc, err := d.Put(context.Background(), strings.NewReader("kept"), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "sha256")
	old := time.Now().Add(-time.Hour)
	mk := func(name string, mtime time.Time) *os.File {
		t.Helper()
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString("partial"); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f.Name(), mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return f
	}
	mk(".put-crashed", old).Close()
	mk(".put-fresh", time.Now()).Close()
	live := mk(".put-live", old)
	defer live.Close()
	if err := lockFile(live); err != nil {
		t.Fatal(err)
	}
	// Not a temporary file of ours: left alone, and not listed.
	mk("README", old).Close()

	if _, err := New(root); err != nil {
		t.Fatalf("New(%q) = %v", root, err)
	}
	want := []string{".put-fresh", ".put-live", desc.Digest[len("sha256:"):], "README"}
	if diff := cmp.Diff(want, files(t, root)); diff != "" {
		t.Errorf("files after New (-want +got):\n%s", diff)
	}
	if list, err := d.List(); err != nil || len(list) != 1 || list[0] != desc {
		t.Errorf("List() = %v, %v; want just %v", list, err, desc)
	}
}

func TestBadDigests(t *testing.T) {
	d, _ := newStore(t)
	good := digestOf(nil)
	hexPart := good[len("sha256:"):]
	tests := []string{
		"",
		"sha256:",
		hexPart,
		":" + hexPart,
		"sha256:" + strings.ToUpper(hexPart),
		"SHA256:" + hexPart,
		"sha512:" + hexPart,
		"sha256:" + hexPart[:63],
		"sha256:" + hexPart + "0",
		"sha256:" + hexPart[:62] + "0g",
		"sha256:../../../../../../etc/passwd",
		"sha256:" + hexPart[:60] + "/../",
		"sha256:" + hexPart + "\x00",
		" sha256:" + hexPart,
		"sha256: " + hexPart[1:],
	}
	for _, s := range tests {
		if _, _, err := ParseDigest(s); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseDigest(%q) = %v, want InvalidArgument", s, err)
		}
		if _, err := d.Stat(s); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Stat(%q) = %v, want InvalidArgument", s, err)
		}
		if f, err := d.Open(s); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			f.Close()
			t.Errorf("Open(%q) = %v, want InvalidArgument", s, err)
		}
		if _, err := d.Path(s); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Path(%q) = %v, want InvalidArgument", s, err)
		}
		if err := d.Delete(s); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Delete(%q) = %v, want InvalidArgument", s, err)
		}
		if s != "" {
			if _, err := d.Put(context.Background(), strings.NewReader(""), s); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Put(%q) = %v, want InvalidArgument", s, err)
			}
		}
	}
	algo, h, err := ParseDigest(good)
	if algo != "sha256" || h != hexPart || err != nil {
		t.Errorf("ParseDigest(%q) = %q, %q, %v; want sha256, %q", good, algo, h, err, hexPart)
	}
}

func FuzzParseDigest(f *testing.F) {
	f.Add(digestOf(nil))
	f.Add("sha256:" + strings.Repeat("A", 64))
	f.Add("sha512:abc")
	f.Add("sha256:../x")
	f.Fuzz(func(t *testing.T, s string) {
		algo, h, err := ParseDigest(s)
		if err != nil {
			if algo != "" || h != "" || !errdefs.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ParseDigest(%q) = %q, %q, %v; want empty parts and InvalidArgument", s, algo, h, err)
			}
			return
		}
		if algo != "sha256" || algo+":"+h != s || len(h) != 64 {
			t.Errorf("ParseDigest(%q) = %q, %q", s, algo, h)
		}
		if _, err := hex.DecodeString(h); err != nil || strings.ToLower(h) != h {
			t.Errorf("ParseDigest(%q) accepted %q, not lowercase hex", s, h)
		}
	})
}

// TestModesFixed checks that New takes group and other access off a store
// an older version left readable by everyone, and that new blobs and the
// directories are the owner's only.
func TestModesFixed(t *testing.T) {
	root := filepath.Join(t.TempDir(), "store")
	blob := filepath.Join(root, "sha256", strings.Repeat("ab", 32))
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blob, []byte("old layer"), 0o444); err != nil {
		t.Fatal(err)
	}
	d, err := New(root)
	if err != nil {
		t.Fatalf("New = %v", err)
	}
	desc, err := d.Put(context.Background(), strings.NewReader("new layer"), "")
	if err != nil {
		t.Fatalf("Put = %v", err)
	}
	newBlob := filepath.Join(root, "sha256", desc.Digest[len("sha256:"):])
	for p, want := range map[string]os.FileMode{
		root:                          0o700 | os.ModeDir,
		filepath.Join(root, "sha256"): 0o700 | os.ModeDir,
		blob:                          0o400,
		newBlob:                       0o400,
	} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s has mode %v, want %v", p, fi.Mode(), want)
		}
	}
}
