package sandboxfs

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/testenv"
)

// setTimes sets the modification time of p (not following a symlink) to
// sec seconds and nsec nanoseconds.
func setTimes(t *testing.T, p string, sec, nsec int64) {
	t.Helper()
	ts := []unix.Timespec{{Sec: sec, Nsec: nsec}, {Sec: sec, Nsec: nsec}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

// readTar returns the headers of an archive, by name.
func readTar(t *testing.T, b []byte) map[string]*tar.Header {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	out := map[string]*tar.Header{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("read the archive: %v", err)
		}
		out[hdr.Name] = hdr
	}
}

func ownerOpts() ExtractOptions {
	return ExtractOptions{UID: os.Getuid(), GID: os.Getgid()}
}

// TestTarRoundTrip copies a varied tree out of one sandbox with WriteTar
// and into another with ExtractTar, and compares the trees.
func TestTarRoundTrip(t *testing.T) {
	testenv.RequireRoot(t)
	old := unix.Umask(0o077) // must not show in the modes
	t.Cleanup(func() { unix.Umask(old) })
	const hostBase = 100000
	s := newFakeSandbox(t)
	src := s.path("src")
	long1, long2 := strings.Repeat("l", 255), strings.Repeat("m", 200)
	deep := filepath.Join(strings.Repeat("deep-directory-name/", 8), long2)
	big := make([]byte, 3<<20)
	rand.Read(big)
	type node struct {
		path string
		mode fs.FileMode // permissions; type from the fields below
		dir  bool
		data []byte
		link string
	}
	nodes := []node{
		{path: "", dir: true, mode: 0o755},
		{path: "a", dir: true, mode: 0o750},
		{path: "a/b", dir: true, mode: 0o700},
		{path: "a/b/c", dir: true, mode: 0o755},
		{path: "a/b/c/deep.txt", mode: 0o644, data: []byte("deep\n")},
		{path: "sticky", dir: true, mode: 0o1777},
		{path: "setgid-dir", dir: true, mode: 0o2775},
		{path: "empty", mode: 0o644},
		{path: "exec.sh", mode: 0o755, data: []byte("#!/bin/sh\necho hi\n")},
		{path: "ro", mode: 0o444, data: []byte("read only")},
		{path: "private", mode: 0o600, data: []byte("mine")},
		{path: "big", mode: 0o640, data: big},
		{path: long1, mode: 0o644, data: []byte("long name")},
		{path: filepath.Dir(deep), dir: true, mode: 0o755},
		{path: deep, mode: 0o644, data: []byte("long path")},
		{path: "héllo wörld ✓\nnewline", mode: 0o644, data: []byte("unicode")},
		{path: "rel", link: "a/b/c/deep.txt"},
		{path: "a/up", link: "../exec.sh"},
		{path: "dangling", link: "missing-target"},
		{path: "dirlink", link: "a"},
		{path: "sticky/abs-in", link: "/dst/src/exec.sh"},
		{path: "hard1", mode: 0o644, data: []byte("shared inode")},
	}
	for i, n := range nodes {
		p := filepath.Join(src, n.path)
		var err error
		switch {
		case n.dir:
			err = os.MkdirAll(p, 0o700)
		case n.link != "":
			err = os.Symlink(n.link, p)
		default:
			err = os.WriteFile(p, n.data, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
		if n.link == "" {
			if err := os.Chmod(p, n.mode); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Lchown(p, hostBase+1000+i, hostBase+2000+i); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(src, "hard1"), filepath.Join(src, "a/hard2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "hard1"), filepath.Join(src, "a/b/hard3")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "fifo"), 0o640); err != nil {
		t.Fatal(err)
	}
	// A setuid file loses the bit on the way in.
	mustWrite(t, filepath.Join(src, "suid"), "#!/bin/sh\n")
	if err := os.Chmod(filepath.Join(src, "suid"), 0o4755|fs.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	// Skipped on the way out: a device and a socket.
	if err := unix.Mknod(filepath.Join(src, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(src, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Times last: creating entries changes their directories' times.
	var i int64
	filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		i++
		setTimes(t, p, 1600000000+i*1000, i*1234567)
		return nil
	})

	var archive bytes.Buffer
	mapID := func(uid, gid uint32) (uint32, uint32) { return uid - hostBase, gid - hostBase }
	stats, err := s.open(t).WriteTar(context.Background(), "/src", &archive, TarOptions{MapID: mapID})
	if err != nil {
		t.Fatalf("WriteTar(%q) = %v", "/src", err)
	}
	// Files: 10 regular (one inode with three names) plus suid and fifo;
	// dirs: 6 plus 8 on the long path; links: 5 symlinks, 2 hard links.
	wantStats := TarStats{Files: 12, Dirs: 6 + 8, Links: 7, Bytes: int64(5 + 18 + 9 + 4 + len(big) + 9 + 9 + 7 + 12 + 10), Skipped: 2}
	if diff := cmp.Diff(wantStats, stats); diff != "" {
		t.Errorf("WriteTar(%q) stats differ (-want +got):\n%s", "/src", diff)
	}

	// The archive: names under src/, owners as the sandbox sees them, the
	// hard links as links, link targets as they are.
	hdrs := readTar(t, archive.Bytes())
	if h := hdrs["src/"]; h == nil || h.Typeflag != tar.TypeDir || h.Uid != 1000 || h.Gid != 2000 {
		t.Errorf("archive entry src/ = %+v, want a directory owned by 1000:2000", h)
	}
	if h := hdrs["src/a/b/c/deep.txt"]; h == nil || h.Uid != 1004 || h.Gid != 2004 || h.Mode != 0o644 {
		t.Errorf("archive entry src/a/b/c/deep.txt = %+v, want mode 0644 owned by 1004:2004", h)
	}
	if h := hdrs["src/sticky/abs-in"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/dst/src/exec.sh" {
		t.Errorf("archive entry src/sticky/abs-in = %+v, want a symlink to /dst/src/exec.sh", h)
	}
	var hardLinks []string
	for name, h := range hdrs {
		if h.Typeflag == tar.TypeLink {
			hardLinks = append(hardLinks, name+" -> "+h.Linkname)
		}
	}
	slices.Sort(hardLinks)
	// Names are walked in order: a/b/hard3 comes first.
	if diff := cmp.Diff([]string{"src/a/hard2 -> src/a/b/hard3", "src/hard1 -> src/a/b/hard3"}, hardLinks); diff != "" {
		t.Errorf("WriteTar(%q) hard links differ (-want +got):\n%s", "/src", diff)
	}
	for _, name := range []string{"src/null", "src/sock"} {
		if hdrs[name] != nil {
			t.Errorf("the archive has %s, want it skipped", name)
		}
	}
	if h := hdrs["src/big"]; h == nil || h.Size != int64(len(big)) || h.ModTime.Nanosecond() == 0 {
		t.Errorf("archive entry src/big = %+v, want %d bytes and a time with nanoseconds", h, len(big))
	}

	// Into another directory, owned by the ids given.
	const uid, gid = 200000, 200001
	xstats, err := s.open(t).ExtractTar(context.Background(), "/dst", bytes.NewReader(archive.Bytes()),
		ExtractOptions{UID: uid, GID: gid, MakeParents: true, SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatalf("ExtractTar(%q) = %v", "/dst", err)
	}
	wantX := wantStats
	wantX.Skipped = 0
	wantX.Dirs++ // /dst itself
	if diff := cmp.Diff(wantX, xstats); diff != "" {
		t.Errorf("ExtractTar(%q) stats differ (-want +got):\n%s", "/dst", diff)
	}
	want := snapshot(t, src, "null", "sock")
	if w, ok := want["suid"]; ok {
		w.Mode &^= fs.ModeSetuid
		want["suid"] = w
	}
	got := snapshot(t, s.path("dst/src"))
	ignore := cmpopts.IgnoreFields(fileState{}, "Ino", "UID", "GID")
	if diff := cmp.Diff(want, got, ignore); diff != "" {
		t.Errorf("the extracted tree differs from the source (-want +got):\n%s", diff)
	}
	for p, st := range got {
		if st.UID != uid || st.GID != gid {
			t.Errorf("extracted %s is owned by %d:%d, want %d:%d", p, st.UID, st.GID, uid, gid)
		}
	}
	if st, err := os.Lstat(s.path("dst")); err != nil || st.Mode() != fs.ModeDir|0o755 {
		t.Errorf("ExtractTar(MakeParents) made /dst with mode %v, %v, want %v", st.Mode(), err, fs.ModeDir|0o755)
	}
	if got["a/hard2"].LinkGroup != "a/b/hard3" || got["hard1"].LinkGroup != "a/b/hard3" {
		t.Errorf("the hard links were not kept: %+v %+v", got["a/hard2"], got["hard1"])
	}
	assertNoTemp(t, s.root)
}

// TestExtractTarRefuses: a bad archive is refused and the sandbox is left
// byte for byte as it was, even when good entries come first.
func TestExtractTarRefuses(t *testing.T) {
	good := []ent{tFile("new-file", "new"), tFile("existing", "overwritten"), tDir("newdir"), tFile("newdir/f", "x")}
	big := makeTar(t, append(good, tFile("big", strings.Repeat("x", 1<<20)))...)
	tests := []struct {
		name     string
		tar      []byte
		opts     ExtractOptions
		wantKind error
	}{
		{name: "absolute name", tar: makeTar(t, append(good, tFile("/etc/x", "x"))...), wantKind: errdefs.ErrInvalidArgument},
		{name: "dotdot", tar: makeTar(t, append(good, tFile("../escaped", "x"))...), wantKind: errdefs.ErrInvalidArgument},
		{name: "dotdot deeper", tar: makeTar(t, append(good, tFile("newdir/../../escaped", "x"))...), wantKind: errdefs.ErrInvalidArgument},
		{name: "link to / then through it", tar: makeTar(t, append(good, tSymlink("a", "/"), tFile("a/etc/x", "x"))...), wantKind: errdefs.ErrInvalidArgument},
		{name: "link to a host path then through it", tar: makeTar(t, append(good, tSymlink("a", "newdir"), tFile("a/x", "x"))...), wantKind: errdefs.ErrInvalidArgument},
		{name: "link out", tar: makeTar(t, append(good, tSymlink("l", "../etc/shadow"))...), wantKind: errdefs.ErrInvalidArgument},
		{name: "absolute link out", tar: makeTar(t, append(good, tSymlink("l", "/etc/shadow"))...), wantKind: errdefs.ErrInvalidArgument},
		{name: "hard link out", tar: makeTar(t, append(good, tHardlink("h", "../etc/shadow"))...), wantKind: errdefs.ErrInvalidArgument},
		{name: "hard link to no entry", tar: makeTar(t, append(good, tHardlink("h", "existing-before"))...), wantKind: errdefs.ErrInvalidArgument},
		{name: "device", tar: makeTar(t, append(good, ent{name: "null", typ: tar.TypeChar})...), wantKind: errdefs.ErrInvalidArgument},
		{name: "NUL", tar: paxNameTar("new\x00file"), wantKind: errdefs.ErrInvalidArgument},
		{name: "cut short", tar: big[:len(big)-2000], wantKind: errdefs.ErrInvalidArgument},
		{name: "too many entries", tar: makeTar(t, good...), opts: ExtractOptions{MaxEntries: 3}, wantKind: errdefs.ErrResourceExhausted},
		{name: "oversize", tar: big, opts: ExtractOptions{MaxBytes: 1 << 20}, wantKind: errdefs.ErrResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFakeSandbox(t)
			mustMkdir(t, s.path("dest"))
			mustWrite(t, s.path("dest/existing"), "before")
			mustWrite(t, s.path("dest/existing-before"), "before")
			if err := os.Symlink("/etc", s.path("dest/link")); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, filepath.Dir(s.root))
			spool := t.TempDir()
			opts := tt.opts
			opts.UID, opts.GID, opts.SpoolDir = os.Getuid(), os.Getgid(), spool
			stats, err := s.open(t).ExtractTar(context.Background(), "/dest", bytes.NewReader(tt.tar), opts)
			if errdefs.Kind(err) != tt.wantKind {
				t.Errorf("ExtractTar(%s) = %+v, %v, want kind %v", tt.name, stats, err, tt.wantKind)
			}
			if err != nil && !strings.Contains(err.Error(), "nothing was written") {
				t.Errorf("ExtractTar(%s) = %v, want a message saying nothing was written", tt.name, err)
			}
			if diff := cmp.Diff(before, snapshot(t, filepath.Dir(s.root))); diff != "" {
				t.Errorf("ExtractTar(%s) changed the tree (-before +after):\n%s", tt.name, diff)
			}
			if left, _ := os.ReadDir(spool); len(left) != 0 {
				t.Errorf("ExtractTar(%s) left %d files in the spool directory", tt.name, len(left))
			}
		})
	}
}

func TestExtractTarDest(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	archive := makeTar(t, tFile("f", "data"))
	tests := []struct {
		dest     string
		opts     ExtractOptions
		wantKind error
	}{
		{dest: "/missing", wantKind: errdefs.ErrNotFound},
		{dest: "/etc/shadow", wantKind: errdefs.ErrInvalidArgument},
		{dest: "/etc/shadow/x", opts: ExtractOptions{MakeParents: true}, wantKind: errdefs.ErrInvalidArgument},
		{dest: "/dir", opts: ExtractOptions{UID: -1}, wantKind: errdefs.ErrInvalidArgument},
		{dest: "/dir", opts: ExtractOptions{MaxBytes: -1}, wantKind: errdefs.ErrInvalidArgument},
		{dest: "", wantKind: errdefs.ErrInvalidArgument},
	}
	before := snapshot(t, s.root)
	for _, tt := range tests {
		tt.opts.SpoolDir = t.TempDir()
		if _, err := r.ExtractTar(context.Background(), tt.dest, bytes.NewReader(archive), tt.opts); errdefs.Kind(err) != tt.wantKind {
			t.Errorf("ExtractTar(%q, %+v) = %v, want kind %v", tt.dest, tt.opts, err, tt.wantKind)
		}
	}
	if diff := cmp.Diff(before, snapshot(t, s.root)); diff != "" {
		t.Errorf("refused ExtractTar calls changed the tree (-before +after):\n%s", diff)
	}
	// Links in the destination's path resolve inside the sandbox.
	opts := ownerOpts()
	opts.MakeParents, opts.SpoolDir = true, t.TempDir()
	// A link to a host path leads nowhere in the sandbox: not a directory.
	if _, err := r.ExtractTar(context.Background(), "/out/new", bytes.NewReader(archive), opts); errdefs.Kind(err) != errdefs.ErrInvalidArgument {
		t.Errorf("ExtractTar(%q) = %v, want InvalidArgument", "/out/new", err)
	}
	for _, dest := range []string{"/x/etc", filepath.Join(s.outside, "new"), "/sub/deeper/up/made"} {
		if _, err := r.ExtractTar(context.Background(), dest, bytes.NewReader(archive), opts); err != nil {
			t.Errorf("ExtractTar(%q) = %v", dest, err)
		}
	}
	for _, p := range []string{"etc/f", filepath.Join(s.outside, "new/f"), "made/f"} {
		if got := readFile(t, s.path(p)); got != "data" {
			t.Errorf("ExtractTar wrote %q to %s, want %q", got, p, "data")
		}
	}
	if _, err := os.Lstat(filepath.Join(s.outside, "new")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ExtractTar through a link reached the host: %v", err)
	}
}

// TestExtractTarPlaces: entries replace what is there (links are replaced,
// not followed), the later of two entries wins, existing directories are
// left alone, setuid and setgid are dropped, and modes are exact.
func TestExtractTarPlaces(t *testing.T) {
	old := unix.Umask(0o077)
	t.Cleanup(func() { unix.Umask(old) })
	s := newFakeSandbox(t)
	r := s.open(t)
	mustMkdir(t, s.path("dest/existing-dir"))
	if err := os.Chmod(s.path("dest/existing-dir"), 0o711); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"dest/link-to-shadow": "/etc/shadow",
		"dest/link-to-host":   filepath.Join(s.outside, "secret"),
		"dest/sandbox-link":   "/etc", // a link the sandbox made: followed, inside the sandbox
	} {
		if err := os.Symlink(target, s.path(name)); err != nil {
			t.Fatal(err)
		}
	}
	archive := makeTar(t,
		tFile("link-to-shadow", "replaced"),
		tFile("link-to-host", "replaced"),
		tFile("sandbox-link/through", "written via the sandbox's link"),
		ent{name: "existing-dir", typ: tar.TypeDir, mode: 0o777},
		ent{name: "new-dir", typ: tar.TypeDir, mode: 0o700},
		ent{name: "new-dir", typ: tar.TypeDir, mode: 0o750},
		tFile("dup", "first"), tSymlink("dup", "x"), tFile("dup", "second"),
		ent{name: "suid", data: "x", mode: 0o6755},
		ent{name: "sticky-dir", typ: tar.TypeDir, mode: 0o3777},
		ent{name: "exact", data: "x", mode: 0o777},
		ent{name: "fifo", typ: tar.TypeFifo, mode: 0o620},
		tFile("implicit/parent/f", "x"),
		tFile("hard-src", "same"), tHardlink("hard-dst", "hard-src"), tHardlink("hard-src", "hard-dst"),
	)
	opts := ownerOpts()
	opts.SpoolDir = t.TempDir()
	if _, err := r.ExtractTar(context.Background(), "/dest", bytes.NewReader(archive), opts); err != nil {
		t.Fatalf("ExtractTar() = %v", err)
	}
	if got := readFile(t, s.path("etc/shadow")); got != decoy {
		t.Errorf("ExtractTar wrote through a link to /etc/shadow: %q", got)
	}
	if got := readFile(t, filepath.Join(s.outside, "secret")); got != hostSecret {
		t.Errorf("ExtractTar wrote through a link to the host: %q", got)
	}
	if got := readFile(t, s.path("etc/through")); got != "written via the sandbox's link" {
		t.Errorf("ExtractTar through the sandbox's own link wrote %q to /etc/through", got)
	}
	tests := []struct {
		path string
		mode fs.FileMode
		data string
	}{
		{"dest/link-to-shadow", 0o644, "replaced"},
		{"dest/link-to-host", 0o644, "replaced"},
		{"dest/existing-dir", fs.ModeDir | 0o711, ""},
		{"dest/new-dir", fs.ModeDir | 0o750, ""},
		{"dest/dup", 0o644, "second"},
		{"dest/suid", 0o755, "x"},
		{"dest/sticky-dir", fs.ModeDir | fs.ModeSetgid | fs.ModeSticky | 0o777, ""},
		{"dest/exact", 0o777, "x"},
		{"dest/fifo", fs.ModeNamedPipe | 0o620, ""},
		{"dest/implicit", fs.ModeDir | 0o755, ""},
		{"dest/implicit/parent", fs.ModeDir | 0o755, ""},
		{"dest/hard-src", 0o644, "same"},
		{"dest/hard-dst", 0o644, "same"},
	}
	for _, tt := range tests {
		fi, err := os.Lstat(s.path(tt.path))
		if err != nil || fi.Mode() != tt.mode {
			t.Errorf("after ExtractTar, %s: %v, %v, want mode %v", tt.path, fi, err, tt.mode)
			continue
		}
		if tt.mode.IsRegular() {
			if got := readFile(t, s.path(tt.path)); got != tt.data {
				t.Errorf("after ExtractTar, %s holds %q, want %q", tt.path, got, tt.data)
			}
		}
	}
	var a, b unix.Stat_t
	if unix.Lstat(s.path("dest/hard-src"), &a) != nil || unix.Lstat(s.path("dest/hard-dst"), &b) != nil || a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("dest/hard-src and dest/hard-dst are not one inode with two names: %d/%d %d", a.Ino, b.Ino, a.Nlink)
	}
	assertNoTemp(t, s.root)
}

// TestExtractTarStopsMidway: an error while extracting stops it; what was
// extracted stays, and the error says so.
func TestExtractTarStopsMidway(t *testing.T) {
	s := newFakeSandbox(t)
	mustMkdir(t, s.path("dest"))
	mustWrite(t, s.path("dest/blocker"), "a file where the archive wants a directory")
	mustMkdir(t, s.path("dest/dir-in-the-way"))
	for _, tt := range []struct {
		name    string
		archive []byte
	}{
		{"parent is a file", makeTar(t, tFile("first", "1"), tFile("blocker/x", "2"), tFile("never", "3"))},
		{"directory in the way", makeTar(t, tFile("first", "1"), tFile("dir-in-the-way", "2"), tFile("never", "3"))},
	} {
		opts := ownerOpts()
		opts.SpoolDir = t.TempDir()
		stats, err := s.open(t).ExtractTar(context.Background(), "/dest", bytes.NewReader(tt.archive), opts)
		if err == nil || !strings.Contains(err.Error(), "stopped after 1 entries (they stay in place)") {
			t.Errorf("ExtractTar(%s) = %v, want an error saying it stopped after 1 entry", tt.name, err)
		}
		if stats.Files != 1 || readFile(t, s.path("dest/first")) != "1" {
			t.Errorf("ExtractTar(%s) = %+v: want the first file extracted and counted", tt.name, stats)
		}
		if _, err := os.Lstat(s.path("dest/never")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("ExtractTar(%s) went on after the error: %v", tt.name, err)
		}
		assertNoTemp(t, s.root)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	opts := ownerOpts()
	opts.SpoolDir = t.TempDir()
	if _, err := s.open(t).ExtractTar(ctx, "/dest", bytes.NewReader(makeTar(t, tFile("f", "x"))), opts); !errors.Is(err, context.Canceled) {
		t.Errorf("ExtractTar(cancelled) = %v, want context.Canceled", err)
	}
}

func TestWriteTarSingle(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	mustWrite(t, s.path("dir/f"), "data")
	tests := []struct {
		path     string
		want     []string // names, with types: "d name", "f name", "l name -> target", "p name"
		wantKind error
	}{
		{path: "/etc/shadow", want: []string{"f shadow"}},
		{path: "x/etc/shadow", want: []string{"f shadow"}},
		{path: "/link-to-shadow", want: []string{"l link-to-shadow -> /etc/shadow"}},
		{path: "/out", want: []string{"l out -> " + s.outside}},
		{path: "/fifo", want: []string{"p fifo"}},
		{path: "/dir", want: []string{"d dir/", "f dir/f"}},
		{path: "/x/dir", want: []string{"d dir/", "f dir/f"}},
		{path: "/missing", wantKind: errdefs.ErrNotFound},
		{path: "/out/secret", wantKind: errdefs.ErrNotFound},
		{path: "/loop1/x", wantKind: errdefs.ErrPermissionDenied},
		{path: "", wantKind: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		_, err := r.WriteTar(context.Background(), tt.path, &buf, TarOptions{})
		if tt.wantKind != nil {
			if errdefs.Kind(err) != tt.wantKind {
				t.Errorf("WriteTar(%q) = %v, want kind %v", tt.path, err, tt.wantKind)
			}
			continue
		}
		if err != nil {
			t.Errorf("WriteTar(%q) = %v", tt.path, err)
			continue
		}
		var got []string
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			switch h.Typeflag {
			case tar.TypeDir:
				got = append(got, "d "+h.Name)
			case tar.TypeReg:
				got = append(got, "f "+h.Name)
			case tar.TypeSymlink:
				got = append(got, "l "+h.Name+" -> "+h.Linkname)
			case tar.TypeFifo:
				got = append(got, "p "+h.Name)
			}
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("WriteTar(%q) entries differ (-want +got):\n%s", tt.path, diff)
		}
	}

	// "/" is named ./ and what is under it ./name.
	var buf bytes.Buffer
	if _, err := r.WriteTar(context.Background(), "/", &buf, TarOptions{}); err != nil {
		t.Fatalf("WriteTar(%q) = %v", "/", err)
	}
	hdrs := readTar(t, buf.Bytes())
	if hdrs["./"] == nil || hdrs["./etc/shadow"] == nil || hdrs["./sub/c3"] == nil {
		t.Errorf("WriteTar(%q) = %d entries without ./, ./etc/shadow or ./sub/c3", "/", len(hdrs))
	}

	t.Run("device", func(t *testing.T) {
		testenv.RequireRoot(t)
		if err := unix.Mknod(s.path("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
		if _, err := r.WriteTar(context.Background(), "/null", io.Discard, TarOptions{}); errdefs.Kind(err) != errdefs.ErrInvalidArgument {
			t.Errorf("WriteTar(%q) = %v, want InvalidArgument", "/null", err)
		}
	})
}

func TestWriteTarLimits(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	mustMkdir(t, s.path("d/sub"))
	for _, p := range []string{"d/a", "d/b", "d/sub/c"} {
		mustWrite(t, s.path(p), strings.Repeat("x", 1000))
	}
	if err := os.Link(s.path("d/a"), s.path("d/sub/hard")); err != nil {
		t.Fatal(err)
	}
	// A hard link carries no data: exactly 3000 bytes fit.
	if st, err := r.WriteTar(context.Background(), "/d", io.Discard, TarOptions{MaxBytes: 3000}); err != nil || st.Bytes != 3000 {
		t.Errorf("WriteTar(MaxBytes 3000) = %+v, %v, want 3000 bytes", st, err)
	}
	_, err := r.WriteTar(context.Background(), "/d", io.Discard, TarOptions{MaxBytes: 2500})
	if errdefs.Kind(err) != errdefs.ErrResourceExhausted || !strings.Contains(err.Error(), "more than 2500 bytes") {
		t.Errorf("WriteTar(MaxBytes 2500) = %v, want ResourceExhausted naming the limit", err)
	}
	if _, err := r.WriteTar(context.Background(), "/d", io.Discard, TarOptions{MaxBytes: -1}); errdefs.Kind(err) != errdefs.ErrInvalidArgument {
		t.Errorf("WriteTar(MaxBytes -1) = %v, want InvalidArgument", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.WriteTar(ctx, "/d", io.Discard, TarOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("WriteTar(cancelled) = %v, want context.Canceled", err)
	}
	errBoom := errors.New("the client went away")
	if _, err := r.WriteTar(context.Background(), "/d", &failingWriter{n: 1000, err: errBoom}, TarOptions{}); !errors.Is(err, errBoom) {
		t.Errorf("WriteTar(failing writer) = %v, want %v", err, errBoom)
	}
}

// failingWriter accepts n bytes, then fails.
type failingWriter struct {
	n   int
	err error
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		n := w.n
		w.n = 0
		return n, w.err
	}
	w.n -= len(p)
	return len(p), nil
}

// TestTarKernelFileSystems: WriteTar leaves out procfs, sysfs and a procfs
// file bound elsewhere, but crosses into a tmpfs; neither WriteTar nor
// ExtractTar works on a kernel file system.
func TestTarKernelFileSystems(t *testing.T) {
	testenv.RequireRoot(t)
	s := newFakeSandbox(t)
	mustMkdir(t, s.path("src/proc"), s.path("src/sys"), s.path("src/tmp"), s.path("proc"))
	mustWrite(t, s.path("src/innocent"), "")
	mount(t, "proc", s.path("src/proc"))
	mount(t, "sysfs", s.path("src/sys"))
	mount(t, "tmpfs", s.path("src/tmp"))
	mount(t, "proc", s.path("proc"))
	bind(t, s.path("src/proc/kpagecgroup"), s.path("src/innocent"))
	mustWrite(t, s.path("src/tmp/on-tmpfs"), "data")
	r := s.open(t)

	var buf bytes.Buffer
	stats, err := r.WriteTar(context.Background(), "/src", &buf, TarOptions{})
	if err != nil {
		t.Fatalf("WriteTar(%q) = %v", "/src", err)
	}
	var names []string
	for name := range readTar(t, buf.Bytes()) {
		names = append(names, name)
	}
	slices.Sort(names)
	if diff := cmp.Diff([]string{"src/", "src/tmp/", "src/tmp/on-tmpfs"}, names); diff != "" {
		t.Errorf("WriteTar(%q) entries differ (-want +got):\n%s", "/src", diff)
	}
	if stats.Skipped != 3 {
		t.Errorf("WriteTar(%q).Skipped = %d, want 3 (proc, sys, the bound file)", "/src", stats.Skipped)
	}
	for _, p := range []string{"/src/proc", "/proc/self", "/proc/kpagecgroup", "/src/sys/kernel"} {
		if _, err := r.WriteTar(context.Background(), p, io.Discard, TarOptions{}); errdefs.Kind(err) != errdefs.ErrPermissionDenied {
			t.Errorf("WriteTar(%q) = %v, want PermissionDenied", p, err)
		}
	}
	for _, dest := range []string{"/proc", "/proc/sys/kernel", "/src/sys/kernel"} {
		opts := ownerOpts()
		opts.SpoolDir = t.TempDir()
		_, err := r.ExtractTar(context.Background(), dest, bytes.NewReader(makeTar(t, tFile("dsec-test", "x"))), opts)
		if errdefs.Kind(err) != errdefs.ErrPermissionDenied {
			t.Errorf("ExtractTar(%q) = %v, want PermissionDenied", dest, err)
		}
	}
	// An archive whose entries lead onto procfs through a sandbox link.
	if err := os.Symlink("/proc/sys", s.path("dest-link")); err != nil {
		t.Fatal(err)
	}
	mustMkdir(t, s.path("dest"))
	if err := os.Symlink("/proc/sys/kernel", s.path("dest/k")); err != nil {
		t.Fatal(err)
	}
	opts := ownerOpts()
	opts.SpoolDir = t.TempDir()
	_, err = r.ExtractTar(context.Background(), "/dest", bytes.NewReader(makeTar(t, tFile("k/dsec-test", "x"))), opts)
	if errdefs.Kind(err) != errdefs.ErrPermissionDenied {
		t.Errorf("ExtractTar(k/dsec-test, k -> /proc/sys/kernel) = %v, want PermissionDenied", err)
	}
}

// FuzzExtractTar: whatever the bytes, ExtractTar does not panic, accepts
// only what ValidateTar accepts, and writes nothing outside the
// destination.
func FuzzExtractTar(f *testing.F) {
	for _, seed := range [][]byte{
		makeTar(f),
		makeTar(f, tDir("./"), tDir("a"), tFile("a/f", "data"), tSymlink("a/l", "f"), tHardlink("h", "a/f"), ent{name: "p", typ: tar.TypeFifo}),
		makeTar(f, tSymlink("a", "/"), tFile("a/etc/x", "x")),
		makeTar(f, tSymlink("a", "."), tFile("a/x", "x")),
		makeTar(f, tSymlink("d/b", ".."), tSymlink("d/c", "b/../..")),
		makeTar(f, tSymlink("l", "../outside/x")),
		makeTar(f, tFile("../outside/x", "x")),
		makeTar(f, tHardlink("h", "../outside/file")),
		makeTar(f, tFile("f", "1"), tSymlink("f", "../outside/file"), tFile("f", "2")),
		makeTar(f, tSymlink("l1", "l2"), tSymlink("l2", "l1")),
		paxNameTar("a\x00b"),
		[]byte("garbage"),
		sparseTar(f, "sparse", 1<<20, "data"),
		sparseTar(f, "huge", 1<<62, "data"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, verr := ValidateTar(bytes.NewReader(data), "/dest", 1000)
		base := t.TempDir()
		root := filepath.Join(base, "root")
		for _, d := range []string{"root/dest", "outside", "spool"} {
			if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{"outside/file", "root/file"} {
			if err := os.WriteFile(filepath.Join(base, p), []byte("untouched"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		before := snapshot(t, base, "root/dest", "spool")
		r, err := OpenRoot(root)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		_, err = r.ExtractTar(context.Background(), "/dest", bytes.NewReader(data),
			ExtractOptions{UID: os.Getuid(), GID: os.Getgid(), MaxEntries: 1000, MaxSize: 64 << 20, SpoolDir: filepath.Join(base, "spool")})
		if verr != nil && err == nil {
			t.Fatalf("ExtractTar accepted an archive ValidateTar refuses (%v)", verr)
		}
		after := snapshot(t, base, "root/dest", "spool")
		delete(before, "root") // its time changes with root/dest? it must not, but dest's does
		delete(after, "root")
		if diff := cmp.Diff(before, after); diff != "" {
			t.Fatalf("ExtractTar wrote outside the destination (-before +after):\n%s", diff)
		}
		if verr != nil {
			if entries, _ := os.ReadDir(filepath.Join(root, "dest")); len(entries) != 0 {
				t.Fatalf("ExtractTar wrote %d entries for a refused archive (%v)", len(entries), verr)
			}
		}
		assertNoTemp(t, base)
	})
}
