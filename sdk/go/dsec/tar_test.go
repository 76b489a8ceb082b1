package dsec

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// tarEntry is one entry of a test archive.
type tarEntry struct {
	name string
	typ  byte
	body string
	link string
	mode int64
}

func makeTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: mode, Size: int64(len(e.body)),
			ModTime: time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %q: %v", e.name, err)
		}
		if hdr.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// describeTree returns each entry under dir with its type, permissions,
// contents or target, and modification time (files and directories).
func describeTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		mt := info.ModTime().UTC().Format(time.RFC3339)
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "symlink -> " + target
		case info.IsDir():
			out[rel] = fmt.Sprintf("dir %v %s", info.Mode().Perm(), mt)
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %v %s %q", info.Mode(), mt, data)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return out
}

func (f *fake) setTar(key string, data []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tars[key] = data
}

func TestUploadDirDownloadDirRoundTrip(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("modes and symlinks differ on Windows")
	}
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	sb := c.Sandbox("sb-a")

	src := t.TempDir()
	mtime := time.Date(2024, 3, 4, 5, 6, 7, 0, time.UTC)
	files := []struct {
		name string
		mode fs.FileMode
		data string
	}{
		{"a.txt", 0o644, "alpha"},
		{"bin/run.sh", 0o755, "#!/bin/sh\necho hi\n"},
		{"sub/deep/secret", 0o600, strings.Repeat("s", 3*chunkSize/2)},
		{"sub/empty-file", 0o640, ""},
	}
	for _, fl := range files {
		p := filepath.Join(src, filepath.FromSlash(fl.name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(fl.data), fl.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, fl.mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(src, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(src, "sub", "abs")); err != nil {
		t.Fatal(err)
	}
	// Times last: creating entries changes their directories'.
	for _, p := range []string{"a.txt", "bin/run.sh", "sub/deep/secret", "sub/empty-file", "bin", "sub/deep", "sub", "private"} {
		if err := os.Chtimes(filepath.Join(src, p), mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}

	st, err := sb.UploadDir(ctx, src, "/dst", WithMakeParents(), WithOwner("1000"))
	if err != nil {
		t.Fatalf("UploadDir: %v", err)
	}
	wantSt := TarStats{Files: 4, Dirs: 4, Links: 2, Bytes: int64(5 + len(files[1].data) + len(files[2].data))}
	if st != wantSt {
		t.Errorf("UploadDir = %+v, want %+v", st, wantSt)
	}
	f.mu.Lock()
	head := f.tarHead
	f.mu.Unlock()
	if diff := cmp.Diff(&sandboxv1.UploadTarHeader{SandboxId: "sb-a", Path: "/dst", MakeParents: true, User: "1000"}, head, protocmp.Transform()); diff != "" {
		t.Errorf("UploadTar header (-want +got):\n%s", diff)
	}

	dst := filepath.Join(t.TempDir(), "new", "copy")
	if err := sb.DownloadDir(ctx, "/dst", dst); err != nil {
		t.Fatalf("DownloadDir: %v", err)
	}
	if diff := cmp.Diff(describeTree(t, src), describeTree(t, dst)); diff != "" {
		t.Errorf("tree after the round trip (-uploaded +downloaded):\n%s", diff)
	}

	// The raw archive is what UploadDir sent.
	var raw bytes.Buffer
	if err := sb.DownloadTar(ctx, "/dst", &raw); err != nil {
		t.Fatalf("DownloadTar: %v", err)
	}
	f.mu.Lock()
	stored := f.tars["sb-a/dst"]
	f.mu.Unlock()
	if !bytes.Equal(raw.Bytes(), stored) {
		t.Errorf("DownloadTar = %d bytes, want the %d stored", raw.Len(), len(stored))
	}

	if _, err := sb.UploadDir(ctx, filepath.Join(src, "missing"), "/x"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("UploadDir of a missing directory = %v, want fs.ErrNotExist", err)
	}
}

func TestUploadDirRefused(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	src := t.TempDir()
	// Big enough that the walk is still writing when the server refuses.
	if err := os.WriteFile(filepath.Join(src, "big"), make([]byte, 8*chunkSize), 0o644); err != nil {
		t.Fatal(err)
	}
	f.setFail(errors.New("refused")) // the interceptor refuses every call
	if _, err := c.Sandbox("sb-a").UploadDir(t.Context(), src, "/d"); err == nil {
		t.Fatalf("UploadDir to a refusing server succeeded")
	}
	// goleak (TestMain) checks that the walk ended.
}

func TestUploadTarReadErrorAbandons(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	boom := errors.New("tape jammed")
	_, err := c.Sandbox("sb-a").UploadTar(t.Context(), "/d", &errReader{n: chunkSize + 7, err: boom})
	if !errors.Is(err, boom) {
		t.Fatalf("UploadTar with a failing reader = %v, want %v", err, boom)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.tars["sb-a/d"]; ok {
		t.Errorf("the server kept an abandoned archive")
	}
}

func TestDownloadDirLayouts(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb := c.Sandbox("sb-a")
	tests := []struct {
		name    string
		remote  string
		archive []byte
		want    []string
		wantErr bool
	}{
		{
			name:   "relative with root entry",
			remote: "/work/proj",
			archive: makeTar(t,
				tarEntry{name: "./", typ: tar.TypeDir, mode: 0o755},
				tarEntry{name: "./proj/", typ: tar.TypeDir, mode: 0o755}, // a child named like the root
				tarEntry{name: "./proj/x", typ: tar.TypeReg, body: "x"},
				tarEntry{name: "y", typ: tar.TypeReg, body: "y"}),
			want: []string{"proj", "proj/x", "y"},
		},
		{
			name:   "relative without root entry",
			remote: "/work/proj/",
			archive: makeTar(t,
				tarEntry{name: "a/", typ: tar.TypeDir, mode: 0o755},
				tarEntry{name: "a/b", typ: tar.TypeReg, body: "b"}),
			want: []string{"a", "a/b"},
		},
		{
			name:   "rooted at the base name",
			remote: "/work/proj",
			archive: makeTar(t,
				tarEntry{name: "proj/", typ: tar.TypeDir, mode: 0o755},
				tarEntry{name: "proj/src/", typ: tar.TypeDir, mode: 0o755},
				tarEntry{name: "proj/src/main.go", typ: tar.TypeReg, body: "package main"},
				tarEntry{name: "proj/l", typ: tar.TypeLink, link: "proj/src/main.go"}),
			want: []string{"l", "src", "src/main.go"},
		},
		{
			name:   "rooted, then an entry elsewhere",
			remote: "/work/proj",
			archive: makeTar(t,
				tarEntry{name: "proj/", typ: tar.TypeDir, mode: 0o755},
				tarEntry{name: "other/x", typ: tar.TypeReg, body: "x"}),
			wantErr: true,
		},
		{
			name:    "a file",
			remote:  "/etc/hostname",
			archive: makeTar(t, tarEntry{name: "hostname", typ: tar.TypeReg, body: "sb-a\n"}),
			want:    []string{"hostname"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.setTar("sb-a"+tt.remote, tt.archive)
			dst := t.TempDir()
			err := sb.DownloadDir(t.Context(), tt.remote, dst)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("DownloadDir(%q) = nil, want an error", tt.remote)
				}
				return
			}
			if err != nil {
				t.Fatalf("DownloadDir(%q) = %v", tt.remote, err)
			}
			var got []string
			for name := range describeTree(t, dst) {
				got = append(got, name)
			}
			if diff := cmp.Diff(tt.want, got, cmpSorted); diff != "" {
				t.Errorf("DownloadDir(%q) entries (-want +got):\n%s", tt.remote, diff)
			}
		})
	}
}

var cmpSorted = cmp.Transformer("sort", func(in []string) []string {
	out := append([]string(nil), in...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
})

func TestDownloadDirErrors(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb := c.Sandbox("sb-a")
	f.setTar("sb-a/fail-after", makeTar(t, tarEntry{name: "a", typ: tar.TypeReg, body: strings.Repeat("a", 5000)}))
	if err := sb.DownloadDir(t.Context(), "/fail-after", t.TempDir()); !errors.Is(err, ErrResourceExhausted) {
		t.Errorf("DownloadDir of a stream that fails after the archive = %v, want ErrResourceExhausted", err)
	}
	if err := sb.DownloadTar(t.Context(), "/fail-after", &bytes.Buffer{}); !errors.Is(err, ErrResourceExhausted) {
		t.Errorf("DownloadTar of a failing stream = %v, want ErrResourceExhausted", err)
	}
	// Cut in the middle of a file.
	whole := makeTar(t, tarEntry{name: "a", typ: tar.TypeReg, body: strings.Repeat("a", 5000)})
	f.setTar("sb-a/cut", whole[:1500])
	if err := sb.DownloadDir(t.Context(), "/cut", t.TempDir()); err == nil {
		t.Errorf("DownloadDir of a truncated archive = nil, want an error")
	}
	if err := sb.DownloadDir(t.Context(), "/missing", t.TempDir()); !errors.Is(err, ErrNotFound) {
		t.Errorf("DownloadDir of a missing path = %v, want ErrNotFound", err)
	}
	boom := errors.New("disk full")
	f.setTar("sb-a/ok", whole)
	if err := sb.DownloadTar(t.Context(), "/ok", writerFunc(func([]byte) (int, error) { return 0, boom })); !errors.Is(err, boom) {
		t.Errorf("DownloadTar to a failing writer = %v, want %v", err, boom)
	}
}

// maliciousTars are archives that try to write outside the directory they
// are extracted to. outside is an absolute path, in slash form, of a
// directory next to the target ("../outside" from it).
func maliciousTars(t testing.TB, outside string) map[string][]byte {
	rel := strings.TrimPrefix(outside, "/")
	// Through l -> /, aim at /etc/passwd, unless a broken extractor
	// running as root could really overwrite it: then at a file that
	// checkOutside sees.
	passwd := "l/etc/passwd"
	if os.Geteuid() == 0 {
		passwd = "l/" + rel + "/passwd"
	}
	return map[string][]byte{
		"dotdot": makeTar(t,
			tarEntry{name: "ok", typ: tar.TypeReg, body: "fine"},
			tarEntry{name: "../outside/pwned", typ: tar.TypeReg, body: "x"}),
		"dotdot inside a name": makeTar(t, tarEntry{name: "a/../../outside/pwned", typ: tar.TypeReg, body: "x"}),
		"absolute":             makeTar(t, tarEntry{name: outside + "/pwned", typ: tar.TypeReg, body: "x"}),
		"symlink to / then through it": makeTar(t,
			tarEntry{name: "l", typ: tar.TypeSymlink, link: "/"},
			tarEntry{name: passwd, typ: tar.TypeReg, body: "root::0:0::/:/bin/sh\n"},
			tarEntry{name: "l/" + rel + "/pwned", typ: tar.TypeReg, body: "x"}),
		"symlink to an absolute dir then through it": makeTar(t,
			tarEntry{name: "l", typ: tar.TypeSymlink, link: outside},
			tarEntry{name: "l/pwned", typ: tar.TypeReg, body: "x"}),
		"relative symlink out then through it": makeTar(t,
			tarEntry{name: "d/", typ: tar.TypeDir, mode: 0o755},
			tarEntry{name: "d/l", typ: tar.TypeSymlink, link: "../../outside"},
			tarEntry{name: "d/l/pwned", typ: tar.TypeReg, body: "x"}),
		"symlink out then a dir through it": makeTar(t,
			tarEntry{name: "l", typ: tar.TypeSymlink, link: "../outside"},
			tarEntry{name: "l/newdir/", typ: tar.TypeDir, mode: 0o777}),
		"hard link out": makeTar(t, tarEntry{name: "h", typ: tar.TypeLink, link: "../outside/canary"}),
		"hard link through a symlink out": makeTar(t,
			tarEntry{name: "l", typ: tar.TypeSymlink, link: "../outside"},
			tarEntry{name: "h", typ: tar.TypeLink, link: "l/canary"}),
		"symlink replaced by a file": makeTar(t,
			tarEntry{name: "f", typ: tar.TypeSymlink, link: "../outside/canary"},
			tarEntry{name: "f", typ: tar.TypeReg, body: "overwritten?"}),
		"dir symlink then chmod": makeTar(t,
			tarEntry{name: "l", typ: tar.TypeSymlink, link: "../outside"},
			tarEntry{name: "l/", typ: tar.TypeDir, mode: 0o777}),
		"device": makeTar(t, tarEntry{name: "null", typ: tar.TypeChar}),
		"rooted layout escaping": makeTar(t,
			tarEntry{name: "t/", typ: tar.TypeDir, mode: 0o755},
			tarEntry{name: "t/../outside/pwned", typ: tar.TypeReg, body: "x"}),
		"setuid file": makeTar(t, tarEntry{name: "suid", typ: tar.TypeReg, body: "#!/bin/sh", mode: 0o4755}),
	}
}

// checkOutside fails the test if anything under parent other than the
// target "t" and "outside" with its canary changed.
func checkOutside(t *testing.T, parent string) {
	t.Helper()
	entries, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"outside", "t"}, names); diff != "" {
		t.Errorf("entries next to the target (-want +got):\n%s", diff)
	}
	got := describeTree(t, filepath.Join(parent, "outside"))
	want := map[string]string{"canary": fmt.Sprintf("file -rw-r--r-- %s %q", canaryTime.Format(time.RFC3339), "canary")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outside the target (-want +got):\n%s", diff)
	}
	if fi, err := os.Stat(filepath.Join(parent, "outside")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("outside dir = %v, %v; want mode 0755 unchanged", fi.Mode(), err)
	}
}

var canaryTime = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// newTarget makes parent/t (the target) and parent/outside/canary.
func newTarget(t testing.TB) (parent, target string) {
	parent = t.TempDir()
	target = filepath.Join(parent, "t")
	outside := filepath.Join(parent, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	canary := filepath.Join(outside, "canary")
	if err := os.WriteFile(canary, []byte("canary"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(canary, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(canary, canaryTime, canaryTime); err != nil {
		t.Fatal(err)
	}
	return parent, target
}

func TestDownloadDirMalicious(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the archives use Unix paths")
	}
	f := newFake()
	c, _ := f.start(t, testKey)
	sb := c.Sandbox("sb-a")
	// Which archives must fail; the others extract harmlessly.
	wantErr := map[string]bool{
		"dotdot": true, "dotdot inside a name": true, "absolute": true,
		"symlink to / then through it": true, "symlink to an absolute dir then through it": true,
		"relative symlink out then through it": true, "symlink out then a dir through it": true,
		"hard link out": true, "hard link through a symlink out": true, "dir symlink then chmod": true,
		"device": true, "rooted layout escaping": true,
	}
	parent0, _ := newTarget(t)
	for name, archive := range maliciousTars(t, filepath.ToSlash(filepath.Join(parent0, "outside"))) {
		t.Run(name, func(t *testing.T) {
			parent, target := newTarget(t)
			// Rebuild the archive for this parent (absolute names differ).
			archive = maliciousTars(t, filepath.ToSlash(filepath.Join(parent, "outside")))[name]
			f.setTar("sb-a/t", archive)
			err := sb.DownloadDir(t.Context(), "/t", target)
			if wantErr[name] && err == nil {
				t.Errorf("DownloadDir(%s) = nil, want an error", name)
			}
			if !wantErr[name] && err != nil {
				t.Errorf("DownloadDir(%s) = %v, want nil", name, err)
			}
			checkOutside(t, parent)
		})
	}

	// What the harmless ones left inside.
	parent, target := newTarget(t)
	f.setTar("sb-a/t", maliciousTars(t, filepath.ToSlash(filepath.Join(parent, "outside")))["symlink replaced by a file"])
	if err := sb.DownloadDir(t.Context(), "/t", target); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(target, "f")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("f after a symlink and a file of that name = %v, %v; want a regular file", fi, err)
	}
	f.setTar("sb-a/t", maliciousTars(t, "/x")["setuid file"])
	if err := sb.DownloadDir(t.Context(), "/t", target); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(target, "suid")); err != nil || fi.Mode() != 0o755 {
		t.Errorf("setuid file extracted as %v, %v; want 0755 without setuid", fi.Mode(), err)
	}
	checkOutside(t, parent)
}

func FuzzExtractTar(f *testing.F) {
	for _, archive := range maliciousTars(f, "/fuzz-outside") {
		f.Add(archive)
	}
	f.Add(makeTar(f,
		tarEntry{name: "d/", typ: tar.TypeDir, mode: 0o500},
		tarEntry{name: "d/f", typ: tar.TypeReg, body: "data", mode: 0o400},
		tarEntry{name: "d/h", typ: tar.TypeLink, link: "d/f"},
		tarEntry{name: "s", typ: tar.TypeSymlink, link: "d/f"}))
	f.Fuzz(func(t *testing.T, archive []byte) {
		parent, target := newTarget(t)
		if err := os.Mkdir(target, 0o755); err != nil {
			t.Fatal(err)
		}
		root, err := os.OpenRoot(target)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		_ = extractTar(root, bytes.NewReader(archive), "t", 64<<20)
		// Let TempDir's cleanup remove what was made read-only.
		_ = filepath.WalkDir(target, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
		checkOutside(t, parent)
	})
}
