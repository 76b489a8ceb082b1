package sandboxfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/testenv"
)

const (
	decoy      = "root:decoy-hash-from-the-sandbox:19000:0:99999:7:::\n"
	hostSecret = "the host's secret\n"
)

// fakeSandbox is a sandbox root in a temporary directory, with the links a
// hostile agent plants, and a directory outside it that plays the host.
type fakeSandbox struct {
	root    string // the sandbox's "/"
	outside string // a host directory outside the sandbox; holds "secret"
}

func newFakeSandbox(t *testing.T) fakeSandbox {
	t.Helper()
	base := t.TempDir()
	s := fakeSandbox{root: filepath.Join(base, "root"), outside: filepath.Join(base, "outside")}
	mustMkdir(t, s.outside, s.root, s.path("etc"), s.path("dir"), s.path("sub/deeper"))
	mustWrite(t, filepath.Join(s.outside, "secret"), hostSecret)
	mustWrite(t, s.path("etc/shadow"), decoy)
	links := map[string]string{
		"x":              "/",
		"y":              "../../..",
		"z":              "/proc/self/root",
		"abs":            "/etc",
		"c1":             "c2",
		"c2":             "sub/c3",
		"sub/c3":         "../abs/shadow",
		"loop1":          "loop2",
		"loop2":          "loop1",
		"out":            s.outside,                                 // absolute link to a host path
		"outrel":         strings.Repeat("../", 40) + s.outside[1:], // climbs to the host's /
		"sub/deeper/up":  "../../../../../..",
		"dangling":       "/nonexistent",
		"link-to-shadow": "/etc/shadow",
		"link-to-host":   filepath.Join(s.outside, "secret"),
	}
	for name, target := range links {
		if err := os.Symlink(target, s.path(name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(s.path("fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Modes independent of the umask the tests run with.
	for p, mode := range map[string]fs.FileMode{"": 0o755, "etc": 0o755, "dir": 0o755, "fifo": 0o644} {
		if err := os.Chmod(s.path(p), mode); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (s fakeSandbox) path(p string) string { return filepath.Join(s.root, p) }

func (s fakeSandbox) open(t *testing.T) *Root {
	t.Helper()
	r, err := OpenRoot(s.root)
	if err != nil {
		t.Fatalf("OpenRoot(%q) = %v", s.root, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func mustMkdir(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func mustWrite(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// readAll reads p through r, failing the test if OpenRead does not return
// within a few seconds (a fifo that was opened would block it).
func readAll(t *testing.T, r *Root, p string) (string, Info, error) {
	t.Helper()
	type result struct {
		data string
		info Info
		err  error
	}
	done := make(chan result, 1)
	go func() {
		f, info, err := r.OpenRead(p)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		done <- result{string(b), info, err}
	}()
	select {
	case res := <-done:
		return res.data, res.info, res.err
	case <-time.After(5 * time.Second):
		t.Fatalf("OpenRead(%q) did not return within 5s", p)
		return "", Info{}, nil
	}
}

// hostShadow returns the host's /etc/shadow, or "" when it cannot be read.
func hostShadow() string {
	b, _ := os.ReadFile("/etc/shadow")
	return string(b)
}

func TestOpenReadStaysInRoot(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	host := hostShadow()
	tests := []struct {
		path     string
		want     string // the content, when no error is wanted
		wantKind error
		wantMsg  string // a part of the message, when an error is wanted
	}{
		{path: "/etc/shadow", want: decoy},
		{path: "etc/shadow", want: decoy},
		{path: "x/etc/shadow", want: decoy},
		{path: "y/etc/shadow", want: decoy},
		{path: "/../../etc/shadow", want: decoy},
		{path: "abs/shadow", want: decoy},
		{path: "x/x/y/abs/shadow", want: decoy},
		{path: "sub/deeper/up/etc/shadow", want: decoy},
		{path: "c1", want: decoy},
		{path: "link-to-shadow", want: decoy},
		// Links to the host's paths resolve inside the root, where there is
		// nothing.
		{path: "out/secret", wantKind: errdefs.ErrNotFound},
		{path: "outrel/secret", wantKind: errdefs.ErrNotFound},
		{path: "link-to-host", wantKind: errdefs.ErrNotFound},
		{path: "z/etc/shadow", wantKind: errdefs.ErrNotFound},
		{path: "dangling", wantKind: errdefs.ErrNotFound},
		{path: "missing", wantKind: errdefs.ErrNotFound, wantMsg: "no such file or directory: /missing in the sandbox"},
		{path: "etc/shadow/x", wantKind: errdefs.ErrNotFound},
		{path: "loop1", wantKind: errdefs.ErrPermissionDenied},
		{path: "fifo", wantKind: errdefs.ErrInvalidArgument, wantMsg: "fifo"},
		{path: "dir", wantKind: errdefs.ErrInvalidArgument, wantMsg: "use `dsec cp` for directories"},
		{path: "x", wantKind: errdefs.ErrInvalidArgument},
		{path: "/", wantKind: errdefs.ErrInvalidArgument},
		{path: "", wantKind: errdefs.ErrInvalidArgument},
		{path: "etc\x00/shadow", wantKind: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		got, info, err := readAll(t, r, tt.path)
		if tt.wantKind != nil {
			if errdefs.Kind(err) != tt.wantKind || !strings.Contains(errString(err), tt.wantMsg) {
				t.Errorf("OpenRead(%q) = %q, %v, want kind %v with %q", tt.path, got, err, tt.wantKind, tt.wantMsg)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("OpenRead(%q) = %q, %v, want %q", tt.path, got, err, tt.want)
		}
		if host != "" && got == host || got == hostSecret {
			t.Errorf("OpenRead(%q) read the host's file", tt.path)
		}
		if want := "/" + strings.TrimPrefix(tt.path, "/"); tt.path != "/../../etc/shadow" && info.Path != want {
			t.Errorf("OpenRead(%q) info.Path = %q, want %q", tt.path, info.Path, want)
		}
		if info.Size != int64(len(decoy)) || !info.Mode.IsRegular() {
			t.Errorf("OpenRead(%q) info = %+v, want a regular file of %d bytes", tt.path, info, len(decoy))
		}
	}
}

func TestOpenReadSocketAndDevice(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	l, err := net.Listen("unix", s.path("sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, _, err := readAll(t, r, "sock"); errdefs.Kind(err) != errdefs.ErrInvalidArgument {
		t.Errorf("OpenRead(%q) = %v, want InvalidArgument", "sock", err)
	}

	t.Run("device", func(t *testing.T) {
		testenv.RequireRoot(t)
		if err := unix.Mknod(s.path("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(s.path("null"), 0o666); err != nil {
			t.Fatal(err)
		}
		if _, _, err := readAll(t, r, "null"); errdefs.Kind(err) != errdefs.ErrInvalidArgument {
			t.Errorf("OpenRead(%q) = %v, want InvalidArgument", "null", err)
		}
		info, err := r.Stat("null")
		if want := fs.ModeDevice | fs.ModeCharDevice | 0o666; err != nil || info.Mode != want {
			t.Errorf("Stat(%q) = %v, %v, want mode %v", "null", info.Mode, err, want)
		}
	})
}

func TestStat(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	var rootSt, shadowSt unix.Stat_t
	if err := unix.Stat(s.root, &rootSt); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(s.path("etc/shadow"), &shadowSt); err != nil {
		t.Fatal(err)
	}
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	tests := []struct {
		path  string
		lstat bool
		want  Info // ModTime is not compared
	}{
		{path: "/", want: Info{Path: "/", Name: "/", Mode: fs.ModeDir | 0o755, Ino: rootSt.Ino}},
		{path: "x", want: Info{Path: "/x", Name: "x", Mode: fs.ModeDir | 0o755, Ino: rootSt.Ino}},
		{path: "y/..", want: Info{Path: "/", Name: "/", Mode: fs.ModeDir | 0o755, Ino: rootSt.Ino}},
		{path: "c1", want: Info{Path: "/c1", Name: "c1", Mode: 0o644, Size: int64(len(decoy)), Ino: shadowSt.Ino}},
		{path: "c1", lstat: true, want: Info{Path: "/c1", Name: "c1", Mode: fs.ModeSymlink | 0o777, Size: 2, LinkTarget: "c2"}},
		{path: "z", lstat: true, want: Info{Path: "/z", Name: "z", Mode: fs.ModeSymlink | 0o777, Size: int64(len("/proc/self/root")), LinkTarget: "/proc/self/root"}},
		{path: "fifo", want: Info{Path: "/fifo", Name: "fifo", Mode: fs.ModeNamedPipe | 0o644}},
	}
	ignore := cmpopts.IgnoreFields(Info{}, "ModTime")
	for _, tt := range tests {
		stat, name := r.Stat, "Stat"
		if tt.lstat {
			stat, name = r.Lstat, "Lstat"
		}
		got, err := stat(tt.path)
		if err != nil {
			t.Errorf("%s(%q) = %v", name, tt.path, err)
			continue
		}
		tt.want.UID, tt.want.GID, tt.want.Dev = uid, gid, uint64(rootSt.Dev)
		if tt.want.Ino == 0 {
			tt.want.Ino = got.Ino
		}
		if tt.want.Mode.IsDir() {
			tt.want.Size = got.Size
		}
		if diff := cmp.Diff(tt.want, got, ignore); diff != "" {
			t.Errorf("%s(%q) differs (-want +got):\n%s", name, tt.path, diff)
		}
	}
	for _, p := range []string{"z", "out/secret", "missing"} {
		if _, err := r.Stat(p); errdefs.Kind(err) != errdefs.ErrNotFound {
			t.Errorf("Stat(%q) = %v, want NotFound", p, err)
		}
	}
	if _, err := r.Stat("loop1"); errdefs.Kind(err) != errdefs.ErrPermissionDenied {
		t.Errorf("Stat(%q) = %v, want PermissionDenied", "loop1", err)
	}
}

func write(r *Root, p string, opts WriteOptions, data string) (Info, error) {
	return r.WriteFile(p, opts, strings.NewReader(data))
}

func ownIDs() WriteOptions { return WriteOptions{UID: os.Getuid(), GID: os.Getgid()} }

func TestWriteFileStaysInRoot(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	tests := []struct {
		path     string
		wantFile string // where the data must land, relative to the root
	}{
		{path: "x/newfile", wantFile: "newfile"},
		{path: "y/new2", wantFile: "new2"},
		{path: "/../../new3", wantFile: "new3"},
		{path: "abs/new4", wantFile: "etc/new4"},
		{path: "sub/deeper/up/new5", wantFile: "new5"},
		{path: "x/sub/deeper/new6", wantFile: "sub/deeper/new6"},
	}
	for _, tt := range tests {
		data := "data for " + tt.path
		info, err := write(r, tt.path, ownIDs(), data)
		if err != nil {
			t.Errorf("WriteFile(%q) = %v", tt.path, err)
			continue
		}
		if got := readFile(t, s.path(tt.wantFile)); got != data {
			t.Errorf("WriteFile(%q) wrote %q to %s, want %q", tt.path, got, tt.wantFile, data)
		}
		if info.Size != int64(len(data)) || info.Mode != 0o644 {
			t.Errorf("WriteFile(%q) = %+v, want a 0644 file of %d bytes", tt.path, info, len(data))
		}
	}
	// Links to host paths resolve inside the root, where the directory does
	// not exist.
	for _, p := range []string{"out/new", "outrel/new"} {
		if _, err := write(r, p, ownIDs(), "x"); errdefs.Kind(err) != errdefs.ErrNotFound || !strings.Contains(err.Error(), "make_parents") {
			t.Errorf("WriteFile(%q) = %v, want NotFound mentioning make_parents", p, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(s.outside, "new")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a write through a link reached the host directory: %v", err)
	}
	// A dangling link is not a directory to make.
	opts := ownIDs()
	opts.MakeParents = true
	if _, err := write(r, "out/new", opts, "x"); errdefs.Kind(err) != errdefs.ErrInvalidArgument {
		t.Errorf("WriteFile(%q, MakeParents) = %v, want InvalidArgument", "out/new", err)
	}
	// A sandbox path that names a host directory is made inside the root.
	hostPath := filepath.Join(s.outside, "new")
	if _, err := write(r, hostPath, opts, "inside"); err != nil {
		t.Fatalf("WriteFile(%q, MakeParents) = %v", hostPath, err)
	}
	if got := readFile(t, s.path(hostPath)); got != "inside" {
		t.Errorf("WriteFile(%q, MakeParents) wrote %q, want %q", hostPath, got, "inside")
	}
	if _, err := os.Lstat(hostPath); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a write reached the host directory: %v", err)
	}
	// Now that it exists inside the root, the link leads there.
	if _, err := write(r, "out/new", opts, "through the link"); err != nil {
		t.Errorf("WriteFile(%q) = %v", "out/new", err)
	}
	if got := readFile(t, s.path(hostPath)); got != "through the link" {
		t.Errorf("WriteFile(%q) wrote %q, want %q", "out/new", got, "through the link")
	}
	if _, err := os.Lstat(hostPath); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a write through a link reached the host directory: %v", err)
	}
}

func TestWriteFileReplacesLinks(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	for _, p := range []string{"link-to-shadow", "link-to-host", "dangling", "z", "loop1", "fifo"} {
		if _, err := write(r, p, ownIDs(), "replaced"); err != nil {
			t.Errorf("WriteFile(%q) = %v", p, err)
			continue
		}
		fi, err := os.Lstat(s.path(p))
		if err != nil || !fi.Mode().IsRegular() || readFile(t, s.path(p)) != "replaced" {
			t.Errorf("after WriteFile(%q): %v, %v, want a regular file with the data", p, fi, err)
		}
	}
	if got := readFile(t, s.path("etc/shadow")); got != decoy {
		t.Errorf("WriteFile(%q) changed its target to %q", "link-to-shadow", got)
	}
	if got := readFile(t, filepath.Join(s.outside, "secret")); got != hostSecret {
		t.Errorf("WriteFile(%q) changed the host's file to %q", "link-to-host", got)
	}
	if _, err := os.Stat("/nonexistent"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("WriteFile(%q) created the link's target on the host: %v", "dangling", err)
	}

	// Replacing a file makes a new inode: readers of the old one keep it.
	before, _ := r.Stat("etc/shadow")
	after, err := write(r, "etc/shadow", ownIDs(), "new shadow")
	if err != nil || after.Ino == before.Ino || readFile(t, s.path("etc/shadow")) != "new shadow" {
		t.Errorf("WriteFile(%q) = %+v, %v, want a new inode with the data", "etc/shadow", after, err)
	}
}

func TestWriteFileRefuses(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	tests := []struct {
		path     string
		opts     WriteOptions
		wantKind error
		wantMsg  string
	}{
		{path: "dir", wantKind: errdefs.ErrInvalidArgument, wantMsg: "is a directory"},
		{path: "/", wantKind: errdefs.ErrInvalidArgument},
		{path: "", wantKind: errdefs.ErrInvalidArgument},
		{path: "nodir/f", wantKind: errdefs.ErrNotFound, wantMsg: "make_parents"},
		{path: "etc/shadow/f", wantKind: errdefs.ErrInvalidArgument, wantMsg: "not a directory"},
		{path: "etc/shadow/f", opts: WriteOptions{MakeParents: true}, wantKind: errdefs.ErrInvalidArgument},
		{path: "dangling/f", opts: WriteOptions{MakeParents: true}, wantKind: errdefs.ErrInvalidArgument, wantMsg: "in the way"},
		{path: "loop1/f", wantKind: errdefs.ErrPermissionDenied},
		{path: "f", opts: WriteOptions{Mode: fs.ModeDir | 0o755}, wantKind: errdefs.ErrInvalidArgument},
		{path: "f", opts: WriteOptions{Mode: fs.ModeSymlink}, wantKind: errdefs.ErrInvalidArgument},
		{path: "f", opts: WriteOptions{UID: -1}, wantKind: errdefs.ErrInvalidArgument},
		{path: "f", opts: WriteOptions{MaxBytes: -1}, wantKind: errdefs.ErrInvalidArgument},
		{path: strings.Repeat("n", 300), wantKind: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		if tt.opts.UID == 0 && tt.opts.GID == 0 {
			tt.opts.UID, tt.opts.GID = os.Getuid(), os.Getgid()
		}
		_, err := write(r, tt.path, tt.opts, "data")
		if errdefs.Kind(err) != tt.wantKind || !strings.Contains(errString(err), tt.wantMsg) {
			t.Errorf("WriteFile(%.20q, %+v) = %v, want kind %v with %q", tt.path, tt.opts, err, tt.wantKind, tt.wantMsg)
		}
	}
	if fi, err := os.Lstat(s.path("dir")); err != nil || !fi.IsDir() {
		t.Errorf("the directory was replaced: %v, %v", fi, err)
	}
	assertNoTemp(t, s.root)
}

// assertNoTemp fails t if a temporary file is left anywhere under dir.
func assertNoTemp(t *testing.T, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".dsec-") {
			t.Errorf("temporary file left behind: %s", p)
		}
		return nil
	})
}

func TestWriteFileMode(t *testing.T) {
	// A umask that would show if it applied.
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })
	s := newFakeSandbox(t)
	r := s.open(t)
	tests := []struct {
		mode fs.FileMode
		want fs.FileMode
	}{
		{mode: 0, want: 0o644},
		{mode: 0o600, want: 0o600},
		{mode: 0o777, want: 0o777},
		{mode: 0o4755, want: fs.ModeSetuid | 0o755},
		{mode: fs.ModeSetuid | 0o755, want: fs.ModeSetuid | 0o755},
		{mode: fs.ModeSetgid | fs.ModeSticky | 0o750, want: fs.ModeSetgid | fs.ModeSticky | 0o750},
		{mode: 0o3750, want: fs.ModeSetgid | fs.ModeSticky | 0o750},
		{mode: 0o444, want: 0o444},
	}
	for _, tt := range tests {
		opts := ownIDs()
		opts.Mode = tt.mode
		info, err := write(r, "f", opts, "#!/bin/sh\n")
		if err != nil || info.Mode != tt.want {
			t.Errorf("WriteFile(mode %v) = %v, %v, want mode %v", tt.mode, info.Mode, err, tt.want)
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(s.path("f"), &st); err != nil || fileMode(st.Mode) != tt.want {
			t.Errorf("WriteFile(mode %v) made a file of mode %v, %v, want %v", tt.mode, fileMode(st.Mode), err, tt.want)
		}
	}
	opts := ownIDs()
	opts.MakeParents = true
	if _, err := write(r, "p/q/f", opts, ""); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"p", "p/q"} {
		fi, err := os.Lstat(s.path(d))
		if err != nil || fi.Mode() != fs.ModeDir|0o755 {
			t.Errorf("WriteFile(MakeParents) made %s with mode %v, %v, want %v", d, fi.Mode(), err, fs.ModeDir|0o755)
		}
	}
}

func TestWriteFileOwner(t *testing.T) {
	testenv.RequireRoot(t)
	const id = 1000000000
	s := newFakeSandbox(t)
	r := s.open(t)
	info, err := r.WriteFile("x/etc/new/deeper/f", WriteOptions{UID: id, GID: id + 1, MakeParents: true, Mode: 0o4755}, strings.NewReader("data"))
	if err != nil {
		t.Fatal(err)
	}
	if info.UID != id || info.GID != id+1 || info.Mode != fs.ModeSetuid|0o755 {
		t.Errorf("WriteFile() = %+v, want owner %d:%d and mode %v", info, id, id+1, fs.ModeSetuid|0o755)
	}
	for _, tt := range []struct {
		path     string
		uid, gid uint32
		mode     fs.FileMode
	}{
		{"etc", 0, 0, fs.ModeDir | 0o755}, // existing: untouched
		{"etc/new", id, id + 1, fs.ModeDir | 0o755},
		{"etc/new/deeper", id, id + 1, fs.ModeDir | 0o755},
		{"etc/new/deeper/f", id, id + 1, fs.ModeSetuid | 0o755},
	} {
		var st unix.Stat_t
		if err := unix.Lstat(s.path(tt.path), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != tt.uid || st.Gid != tt.gid || fileMode(st.Mode) != tt.mode {
			t.Errorf("%s: owner %d:%d mode %v, want %d:%d %v", tt.path, st.Uid, st.Gid, fileMode(st.Mode), tt.uid, tt.gid, tt.mode)
		}
	}
}

// failingReader returns some data, then an error.
type failingReader struct {
	data string
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.data == "" {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

func TestWriteFileLeavesNothingOnError(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	errBoom := errors.New("the client went away")
	mp := ownIDs()
	mp.MakeParents = true
	mp.MaxBytes = 10
	tests := []struct {
		name     string
		path     string
		opts     WriteOptions
		src      io.Reader
		wantKind error
		wantErr  error
	}{
		{name: "over MaxBytes", path: "etc/shadow", opts: WriteOptions{MaxBytes: 10}, src: strings.NewReader("12345678901"), wantKind: errdefs.ErrInvalidArgument},
		{name: "over MaxBytes, new file", path: "newfile", opts: WriteOptions{MaxBytes: 10}, src: strings.NewReader(strings.Repeat("x", 1<<20)), wantKind: errdefs.ErrInvalidArgument},
		{name: "over MaxBytes, new parents", path: "a/b/c/f", opts: mp, src: strings.NewReader("12345678901"), wantKind: errdefs.ErrInvalidArgument},
		{name: "reader fails", path: "etc/shadow", src: &failingReader{"partial", errBoom}, wantKind: errdefs.ErrInternal, wantErr: errBoom},
		{name: "reader fails, new parents", path: "x/a/b/f", opts: mp, src: &failingReader{"partial", errBoom}, wantKind: errdefs.ErrInternal, wantErr: errBoom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !tt.opts.MakeParents {
				tt.opts.UID, tt.opts.GID = os.Getuid(), os.Getgid()
			}
			_, err := r.WriteFile(tt.path, tt.opts, tt.src)
			if errdefs.Kind(err) != tt.wantKind || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Errorf("WriteFile(%q) = %v, want kind %v", tt.path, err, tt.wantKind)
			}
			if got := readFile(t, s.path("etc/shadow")); got != decoy {
				t.Errorf("WriteFile(%q) changed /etc/shadow to %q", tt.path, got)
			}
			for _, p := range []string{"newfile", "a"} {
				if _, err := os.Lstat(s.path(p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("WriteFile(%q) left %s behind: %v", tt.path, p, err)
				}
			}
			assertNoTemp(t, s.root)
		})
	}
	// Exactly MaxBytes is fine.
	if info, err := r.WriteFile("f", WriteOptions{MaxBytes: 10, UID: os.Getuid(), GID: os.Getgid()}, strings.NewReader("1234567890")); err != nil || info.Size != 10 {
		t.Errorf("WriteFile(10 bytes, MaxBytes 10) = %+v, %v, want 10 bytes", info, err)
	}
}

func TestWriteFileEmpty(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	if _, err := r.WriteFile("empty", ownIDs(), bytes.NewReader(nil)); err != nil {
		t.Fatal(err)
	}
	got, info, err := readAll(t, r, "empty")
	if err != nil || got != "" || info.Size != 0 {
		t.Errorf("OpenRead(%q) = %q, %+v, %v, want an empty file", "empty", got, info, err)
	}
}

// TestRacingSwap swaps a directory with links that point out of the root
// while files are read and written through it: whatever the interleaving,
// nothing outside the root is touched.
func TestRacingSwap(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	mustMkdir(t, s.path("sw"))
	mustWrite(t, s.path("sw/secret"), "inside")
	for name, target := range map[string]string{
		"swabs": s.outside,
		"swrel": strings.Repeat("../", 40) + s.outside[1:],
	} {
		if err := os.Symlink(target, s.path(name)); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			other := s.path("swabs")
			if i%2 == 1 {
				other = s.path("swrel")
			}
			if err := unix.Renameat2(unix.AT_FDCWD, s.path("sw"), unix.AT_FDCWD, other, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("swap: %v", err)
				return
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()
	seen := map[string]int{}
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		got, _, err := readAll(t, r, "sw/secret")
		switch {
		case err == nil && got == "inside":
			seen["inside"]++
		case errdefs.Kind(err) == errdefs.ErrNotFound:
			seen["not found"]++
		default:
			t.Fatalf("OpenRead(%q) = %q, %v, want %q or NotFound", "sw/secret", got, err, "inside")
		}
		if _, err := write(r, "sw/written", ownIDs(), "w"); err != nil && errdefs.Kind(err) != errdefs.ErrNotFound {
			t.Fatalf("WriteFile(%q) = %v, want success or NotFound", "sw/written", err)
		}
	}
	if _, err := os.Lstat(filepath.Join(s.outside, "written")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a write escaped the root: %v", err)
	}
	if got := readFile(t, filepath.Join(s.outside, "secret")); got != hostSecret {
		t.Errorf("the host's file changed to %q", got)
	}
	t.Logf("reads: %v", seen)
}

func TestClosedRoot(t *testing.T) {
	s := newFakeSandbox(t)
	r, err := OpenRoot(s.root)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}
	if _, err := r.Stat("/"); err == nil {
		t.Errorf("Stat on a closed root = nil, want an error")
	}
}

func TestOpenRoot(t *testing.T) {
	s := newFakeSandbox(t)
	for _, tt := range []struct {
		name string
		want error
	}{
		{s.path("missing"), errdefs.ErrNotFound},
		{s.path("etc/shadow"), errdefs.ErrInvalidArgument},
		{"/proc/999999999/root", errdefs.ErrNotFound},
	} {
		r, err := OpenRoot(tt.name)
		if errdefs.Kind(err) != tt.want {
			t.Errorf("OpenRoot(%q) = %v, %v, want kind %v", tt.name, r, err, tt.want)
		}
	}
}

// TestOpenReadLease: a sandbox process that holds a write lease on a file
// cannot make the edge wait for the lease to be broken.
func TestOpenReadLease(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	f, err := os.OpenFile(s.path("etc/shadow"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		testenv.Require(t, false, "cannot take a lease: "+err.Error())
	}
	defer unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
	start := time.Now()
	_, _, err = readAll(t, r, "etc/shadow")
	if errdefs.Kind(err) != errdefs.ErrUnavailable || time.Since(start) > time.Second {
		t.Errorf("OpenRead(%q) = %v after %v, want Unavailable at once", "etc/shadow", err, time.Since(start))
	}
}
