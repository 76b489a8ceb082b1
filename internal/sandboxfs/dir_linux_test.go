package sandboxfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/testenv"
)

func names(infos []Info) []string {
	var out []string
	for _, i := range infos {
		out = append(out, i.Name)
	}
	return out
}

func TestReadDir(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	mustMkdir(t, s.path("many"))
	for i := 9; i >= 0; i-- {
		mustWrite(t, s.path(fmt.Sprintf("many/f%d", i)), strings.Repeat("x", i))
	}
	if err := os.Symlink("/etc/shadow", s.path("many/link")); err != nil {
		t.Fatal(err)
	}
	all := []string{"f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9", "link"}
	tests := []struct {
		path      string
		limit     int
		want      []string
		truncated bool
	}{
		{path: "/many", want: all},
		{path: "/many", limit: 3, want: all[:3], truncated: true},
		{path: "/many", limit: 11, want: all},
		{path: "/many", limit: 10, want: all[:10], truncated: true},
		{path: "x/many", limit: 1, want: all[:1], truncated: true},
		{path: "/sub", want: []string{"c3", "deeper"}},
		{path: "/abs", want: []string{"shadow"}}, // a link to a directory is followed
		{path: "/dir", want: nil},
	}
	for _, tt := range tests {
		got, truncated, err := r.ReadDir(tt.path, tt.limit)
		if err != nil {
			t.Errorf("ReadDir(%q, %d) = %v", tt.path, tt.limit, err)
			continue
		}
		if diff := cmp.Diff(tt.want, names(got)); diff != "" || truncated != tt.truncated {
			t.Errorf("ReadDir(%q, %d) truncated = %v, want %v; names differ (-want +got):\n%s", tt.path, tt.limit, truncated, tt.truncated, diff)
		}
	}

	got, _, err := r.ReadDir("/many", 0)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(s.path("many/f7"), &st); err != nil {
		t.Fatal(err)
	}
	if want := newInfo("/many/f7", &st); !cmp.Equal(got[7], want) || got[7].Name != "f7" || got[7].Size != 7 {
		t.Errorf("ReadDir(%q)[7] = %+v, want %+v", "/many", got[7], want)
	}
	if got[10].Path != "/many/link" || got[10].Mode != fs.ModeSymlink|0o777 || got[10].LinkTarget != "/etc/shadow" {
		t.Errorf("ReadDir(%q)[10] = %+v, want the symlink itself, with its target", "/many", got[10])
	}

	for _, tt := range []struct {
		path     string
		limit    int
		wantKind error
	}{
		{"/etc/shadow", 0, errdefs.ErrInvalidArgument},
		{"/fifo", 0, errdefs.ErrInvalidArgument},
		{"/c1", 0, errdefs.ErrInvalidArgument},
		{"/missing", 0, errdefs.ErrNotFound},
		{"/out", 0, errdefs.ErrNotFound},
		{"/loop1", 0, errdefs.ErrPermissionDenied},
		{"/z", 0, errdefs.ErrNotFound},
		{"/many", -1, errdefs.ErrInvalidArgument},
		{"", 0, errdefs.ErrInvalidArgument},
	} {
		if got, _, err := r.ReadDir(tt.path, tt.limit); errdefs.Kind(err) != tt.wantKind {
			t.Errorf("ReadDir(%q, %d) = %v, %v, want kind %v", tt.path, tt.limit, names(got), err, tt.wantKind)
		}
	}
}

func TestReadDirLinkTargets(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	mustMkdir(t, s.path("links"))
	long := strings.Repeat("d/", 1500) + "end" // past the first read's buffer
	for name, target := range map[string]string{"long": long, "rel": "../etc/shadow", "magic": "/proc/1/root"} {
		if err := os.Symlink(target, s.path("links/"+name)); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, s.path("links/file"), "data")
	tests := []struct {
		dir  string
		want map[string]string // name: link target ("" for no symlink)
	}{
		{"/links", map[string]string{"file": "", "long": long, "magic": "/proc/1/root", "rel": "../etc/shadow"}},
		// Listed through a symlink to the directory, the entries' own
		// targets: the host path and the magic link are text, never followed.
		{"/sub/deeper/up/sub", map[string]string{"c3": "../abs/shadow", "deeper": ""}},
		{"/", map[string]string{
			"abs": "/etc", "c1": "c2", "c2": "sub/c3", "dangling": "/nonexistent", "dir": "", "etc": "", "fifo": "",
			"link-to-host": filepath.Join(s.outside, "secret"), "link-to-shadow": "/etc/shadow", "links": "",
			"loop1": "loop2", "loop2": "loop1", "out": s.outside, "outrel": strings.Repeat("../", 40) + s.outside[1:],
			"sub": "", "x": "/", "y": "../../..", "z": "/proc/self/root",
		}},
	}
	for _, tt := range tests {
		ents, _, err := r.ReadDir(tt.dir, 0)
		if err != nil {
			t.Errorf("ReadDir(%q) = %v", tt.dir, err)
			continue
		}
		got := map[string]string{}
		for _, e := range ents {
			got[e.Name] = e.LinkTarget
			if isLink := e.Mode&fs.ModeSymlink != 0; isLink != (e.LinkTarget != "") {
				t.Errorf("ReadDir(%q): %s has mode %v and link target %q", tt.dir, e.Name, e.Mode, e.LinkTarget)
			}
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ReadDir(%q) link targets differ (-want +got):\n%s", tt.dir, diff)
		}
	}
	// Stat follows the link and describes what it leads to.
	if info, err := r.Stat("/links/rel"); err != nil || info.LinkTarget != "" || !info.Mode.IsRegular() {
		t.Errorf("Stat(/links/rel) = %+v, %v; want the regular file it leads to", info, err)
	}
}

func TestMkdir(t *testing.T) {
	old := unix.Umask(0o077)
	t.Cleanup(func() { unix.Umask(old) })
	s := newFakeSandbox(t)
	r := s.open(t)
	uid, gid := os.Getuid(), os.Getgid()
	tests := []struct {
		path     string
		mode     fs.FileMode
		parents  bool
		wantPath string      // where the directory must be, relative to the root
		wantMode fs.FileMode // of it
		wantKind error
	}{
		{path: "/new", wantPath: "new", wantMode: fs.ModeDir | 0o755},
		{path: "/new0700", mode: 0o700, wantPath: "new0700", wantMode: fs.ModeDir | 0o700},
		{path: "/new0777", mode: 0o777, wantPath: "new0777", wantMode: fs.ModeDir | 0o777},
		{path: "/sticky", mode: fs.ModeSticky | fs.ModeSetgid | 0o775, wantPath: "sticky", wantMode: fs.ModeDir | fs.ModeSticky | fs.ModeSetgid | 0o775},
		{path: "x/etc/via-link", wantPath: "etc/via-link", wantMode: fs.ModeDir | 0o755},
		{path: "/p/q/r", mode: 0o700, parents: true, wantPath: "p/q/r", wantMode: fs.ModeDir | 0o700},
		{path: "/etc", parents: true, wantPath: "etc", wantMode: fs.ModeDir | 0o755}, // existing: fine
		{path: "/x", parents: true, wantPath: "", wantMode: fs.ModeDir | 0o755},      // a link to a directory: fine
		{path: "/", parents: true, wantPath: "", wantMode: fs.ModeDir | 0o755},
		{path: "/etc", wantKind: errdefs.ErrAlreadyExists},
		{path: "/", wantKind: errdefs.ErrAlreadyExists},
		{path: "/etc/shadow", wantKind: errdefs.ErrAlreadyExists},
		{path: "/etc/shadow", parents: true, wantKind: errdefs.ErrAlreadyExists},
		{path: "/dangling", parents: true, wantKind: errdefs.ErrAlreadyExists},
		{path: "/nodir/new", wantKind: errdefs.ErrNotFound},
		{path: "/etc/shadow/new", parents: true, wantKind: errdefs.ErrInvalidArgument},
		{path: "/loop1/new", wantKind: errdefs.ErrPermissionDenied},
		{path: "/bad-mode", mode: fs.ModeSymlink | 0o755, wantKind: errdefs.ErrInvalidArgument},
		{path: "/bad-mode", mode: fs.ModeSetuid | 0o755, wantKind: errdefs.ErrInvalidArgument},
		{path: strings.Repeat("n", 300), wantKind: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		info, err := r.Mkdir(tt.path, tt.mode, tt.parents, uid, gid)
		if tt.wantKind != nil {
			if errdefs.Kind(err) != tt.wantKind {
				t.Errorf("Mkdir(%.20q, %v, %v) = %v, want kind %v", tt.path, tt.mode, tt.parents, err, tt.wantKind)
			}
			continue
		}
		if err != nil || info.Mode != tt.wantMode {
			t.Errorf("Mkdir(%q, %v, %v) = %+v, %v, want mode %v", tt.path, tt.mode, tt.parents, info, err, tt.wantMode)
			continue
		}
		fi, err := os.Stat(s.path(tt.wantPath))
		if err != nil || fi.Mode() != tt.wantMode {
			t.Errorf("Mkdir(%q) made %s with mode %v, %v, want %v", tt.path, tt.wantPath, fi.Mode(), err, tt.wantMode)
		}
	}
	if _, err := r.Mkdir("/neg", 0, false, -1, 0); errdefs.Kind(err) != errdefs.ErrInvalidArgument {
		t.Errorf("Mkdir(owner -1) = %v, want InvalidArgument", err)
	}
	for _, p := range []string{"p", "p/q"} {
		if fi, err := os.Stat(s.path(p)); err != nil || fi.Mode() != fs.ModeDir|0o755 {
			t.Errorf("Mkdir(parents) made %s with mode %v, %v, want %v", p, fi.Mode(), err, fs.ModeDir|0o755)
		}
	}
	for _, p := range []string{"bad-mode", "neg", "nodir", "etc/shadow/new"} {
		if _, err := os.Lstat(s.path(p)); !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
			t.Errorf("a refused Mkdir left %s behind: %v", p, err)
		}
	}
}

func TestMkdirOwner(t *testing.T) {
	testenv.RequireRoot(t)
	const id = 1000000000
	s := newFakeSandbox(t)
	r := s.open(t)
	info, err := r.Mkdir("/etc/a/b/c", 0o750, true, id, id+1)
	if err != nil {
		t.Fatal(err)
	}
	if info.UID != id || info.GID != id+1 || info.Mode != fs.ModeDir|0o750 || info.Path != "/etc/a/b/c" || info.Name != "c" {
		t.Errorf("Mkdir() = %+v, want /etc/a/b/c owned by %d:%d with mode %v", info, id, id+1, fs.ModeDir|0o750)
	}
	for _, tt := range []struct {
		path     string
		uid, gid uint32
		mode     fs.FileMode
	}{
		{"etc", 0, 0, fs.ModeDir | 0o755},
		{"etc/a", id, id + 1, fs.ModeDir | 0o755},
		{"etc/a/b", id, id + 1, fs.ModeDir | 0o755},
		{"etc/a/b/c", id, id + 1, fs.ModeDir | 0o750},
	} {
		var st unix.Stat_t
		if err := unix.Lstat(s.path(tt.path), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != tt.uid || st.Gid != tt.gid || fileMode(st.Mode) != tt.mode {
			t.Errorf("%s: owner %d:%d mode %v, want %d:%d %v", tt.path, st.Uid, st.Gid, fileMode(st.Mode), tt.uid, tt.gid, tt.mode)
		}
	}
	// An existing directory keeps its owner and mode.
	if info, err := r.Mkdir("/etc/a", 0o700, true, 5, 5); err != nil || info.UID != id || info.Mode != fs.ModeDir|0o755 {
		t.Errorf("Mkdir(existing, parents) = %+v, %v, want it unchanged", info, err)
	}
}

func TestRemove(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	mustMkdir(t, s.path("tree/a/b/c"), s.path("tree/empty"), s.path("emptydir"), s.path("full"))
	mustWrite(t, s.path("tree/a/b/c/f"), "x")
	mustWrite(t, s.path("tree/f"), "x")
	mustWrite(t, s.path("full/f"), "x")
	mustWrite(t, s.path("dir/f"), "x")
	if err := unix.Mkfifo(s.path("tree/a/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"tree/to-etc":  "/etc",
		"tree/to-host": s.outside,
		"tree/a/up":    "../../..",
		"link-to-dir":  "dir",
	} {
		if err := os.Symlink(target, s.path(name)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		path      string
		recursive bool
		gone      string // relative to the root
		wantKind  error
	}{
		{path: "/link-to-shadow", gone: "link-to-shadow"},
		{path: "/link-to-dir", recursive: true, gone: "link-to-dir"},
		{path: "/emptydir", gone: "emptydir"},
		{path: "x/dir/f", gone: "dir/f"},
		{path: "/fifo", gone: "fifo"},
		{path: "/tree", recursive: true, gone: "tree"},
		{path: "/full", wantKind: errdefs.ErrFailedPrecondition},
		{path: "/missing", wantKind: errdefs.ErrNotFound},
		{path: "/missing", recursive: true, wantKind: errdefs.ErrNotFound},
		{path: "/out/secret", wantKind: errdefs.ErrNotFound},
		{path: "/", recursive: true, wantKind: errdefs.ErrInvalidArgument},
		{path: "x/..", recursive: true, wantKind: errdefs.ErrInvalidArgument},
		{path: "", wantKind: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		err := r.Remove(tt.path, tt.recursive)
		if tt.wantKind != nil {
			if errdefs.Kind(err) != tt.wantKind {
				t.Errorf("Remove(%q, %v) = %v, want kind %v", tt.path, tt.recursive, err, tt.wantKind)
			}
			continue
		}
		if err != nil {
			t.Errorf("Remove(%q, %v) = %v", tt.path, tt.recursive, err)
		}
		if _, err := os.Lstat(s.path(tt.gone)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Remove(%q) left %s: %v", tt.path, tt.gone, err)
		}
	}
	// Links were removed, not followed.
	for _, p := range []string{"etc/shadow", "dir", "sub/deeper", "full/f"} {
		if _, err := os.Lstat(s.path(p)); err != nil {
			t.Errorf("Remove went through a link and removed %s: %v", p, err)
		}
	}
	if got := readFile(t, filepath.Join(s.outside, "secret")); got != hostSecret {
		t.Errorf("the host's file changed: %q", got)
	}
	err := r.Remove("/full", false)
	if !strings.Contains(errString(err), "remove it recursively") {
		t.Errorf("Remove(%q, false) = %v, want a message saying to remove it recursively", "/full", err)
	}
}

// TestRemoveMounts: a tree with a mount point in it is refused whole.
func TestRemoveMounts(t *testing.T) {
	testenv.RequireRoot(t)
	s := newFakeSandbox(t)
	mustMkdir(t, s.path("tree/a/proc"), s.path("tree/b"), s.path("tree2/tmp"), s.path("tree3"), s.path("proc"))
	mustWrite(t, s.path("tree/a/f"), "x")
	mustWrite(t, s.path("tree/b/f"), "x")
	mustWrite(t, s.path("tree3/bound"), "")
	mustWrite(t, s.path("tree3/f"), "x")
	mount(t, "proc", s.path("tree/a/proc"))
	mount(t, "tmpfs", s.path("tree2/tmp"))
	mustWrite(t, s.path("tree2/tmp/on-tmpfs"), "x")
	bind(t, s.path("etc/shadow"), s.path("tree3/bound"))
	mount(t, "proc", s.path("proc"))
	r := s.open(t)

	before := snapshot(t, s.root)
	for _, tt := range []struct {
		path      string
		recursive bool
		wantKind  error
	}{
		{"/tree", true, errdefs.ErrFailedPrecondition},
		{"/tree/a", true, errdefs.ErrFailedPrecondition},
		{"/tree/a/proc", true, errdefs.ErrFailedPrecondition},
		{"/tree2", true, errdefs.ErrFailedPrecondition},
		{"/tree2/tmp", false, errdefs.ErrFailedPrecondition},
		{"/tree3", true, errdefs.ErrFailedPrecondition},
		{"/tree3/bound", false, errdefs.ErrFailedPrecondition},
		{"/proc/self", false, errdefs.ErrPermissionDenied},
		{"/proc/sys/kernel", true, errdefs.ErrPermissionDenied},
		{"/tree/a/proc/1", true, errdefs.ErrPermissionDenied},
	} {
		if err := r.Remove(tt.path, tt.recursive); errdefs.Kind(err) != tt.wantKind {
			t.Errorf("Remove(%q, %v) = %v, want kind %v", tt.path, tt.recursive, err, tt.wantKind)
		}
	}
	if diff := cmp.Diff(before, snapshot(t, s.root)); diff != "" {
		t.Errorf("refused Removes changed the tree (-before +after):\n%s", diff)
	}
	err := r.Remove("/tree", true)
	if want := "/tree/a/proc in the sandbox is a mount point"; !strings.Contains(errString(err), want) {
		t.Errorf("Remove(%q) = %v, want a message with %q", "/tree", err, want)
	}
	// What is on the tmpfs can be removed, from inside it.
	if err := r.Remove("/tree2/tmp/on-tmpfs", false); err != nil {
		t.Errorf("Remove(%q) = %v", "/tree2/tmp/on-tmpfs", err)
	}
}

func TestRename(t *testing.T) {
	s := newFakeSandbox(t)
	r := s.open(t)
	mustMkdir(t, s.path("d1/sub"), s.path("d2"), s.path("full/x"))
	mustWrite(t, s.path("a"), "A")
	mustWrite(t, s.path("b"), "B")
	tests := []struct {
		from, to  string
		overwrite bool
		wantKind  error
		check     func() error // of the outcome, when no error is wanted
	}{
		{from: "/a", to: "/b", wantKind: errdefs.ErrAlreadyExists},
		{from: "/a", to: "/etc", wantKind: errdefs.ErrAlreadyExists},
		{from: "/a", to: "/b", overwrite: true, check: func() error {
			if got := readFile(t, s.path("b")); got != "A" {
				return fmt.Errorf("b holds %q", got)
			}
			_, err := os.Lstat(s.path("a"))
			if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("a is still there: %v", err)
			}
			return nil
		}},
		{from: "/link-to-shadow", to: "/moved-link", check: func() error {
			if target, err := os.Readlink(s.path("moved-link")); err != nil || target != "/etc/shadow" {
				return fmt.Errorf("moved-link: %q, %v", target, err)
			}
			if got := readFile(t, s.path("etc/shadow")); got != decoy {
				return fmt.Errorf("the link's target changed")
			}
			return nil
		}},
		{from: "x/b", to: "x/etc/b", check: func() error {
			if got := readFile(t, s.path("etc/b")); got != "A" {
				return fmt.Errorf("etc/b holds %q", got)
			}
			return nil
		}},
		{from: "/d1", to: "/d2", overwrite: true, check: func() error { // an empty directory is replaced
			_, err := os.Stat(s.path("d2/sub"))
			return err
		}},
		{from: "/d2", to: "/full", overwrite: true, wantKind: errdefs.ErrFailedPrecondition},
		{from: "/d2", to: "/d2/sub/inside", wantKind: errdefs.ErrInvalidArgument},
		{from: "/etc/shadow", to: "/full", overwrite: true, wantKind: errdefs.ErrInvalidArgument},
		{from: "/full", to: "/etc/shadow", overwrite: true, wantKind: errdefs.ErrInvalidArgument},
		{from: "/missing", to: "/new", wantKind: errdefs.ErrNotFound},
		{from: "/etc/shadow", to: "/nodir/new", wantKind: errdefs.ErrNotFound},
		{from: "/etc/shadow", to: "/out/new", wantKind: errdefs.ErrNotFound},
		{from: "/", to: "/new", wantKind: errdefs.ErrInvalidArgument},
		{from: "/etc/shadow", to: "/", overwrite: true, wantKind: errdefs.ErrInvalidArgument},
		{from: "", to: "/new", wantKind: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		err := r.Rename(tt.from, tt.to, tt.overwrite)
		if tt.wantKind != nil {
			if errdefs.Kind(err) != tt.wantKind {
				t.Errorf("Rename(%q, %q, %v) = %v, want kind %v", tt.from, tt.to, tt.overwrite, err, tt.wantKind)
			}
			continue
		}
		if err != nil {
			t.Errorf("Rename(%q, %q, %v) = %v", tt.from, tt.to, tt.overwrite, err)
			continue
		}
		if err := tt.check(); err != nil {
			t.Errorf("after Rename(%q, %q, %v): %v", tt.from, tt.to, tt.overwrite, err)
		}
	}
	if got := readFile(t, filepath.Join(s.outside, "secret")); got != hostSecret {
		t.Errorf("the host's file changed: %q", got)
	}
}

func TestRenameMounts(t *testing.T) {
	testenv.RequireRoot(t)
	s := newFakeSandbox(t)
	mustMkdir(t, s.path("tmp"), s.path("proc"))
	mount(t, "tmpfs", s.path("tmp"))
	mount(t, "proc", s.path("proc"))
	r := s.open(t)
	for _, tt := range []struct {
		from, to string
		wantKind error
	}{
		{"/etc/shadow", "/tmp/shadow", errdefs.ErrFailedPrecondition},
		{"/tmp", "/tmp2", errdefs.ErrFailedPrecondition},
		{"/etc/shadow", "/proc/shadow", errdefs.ErrPermissionDenied},
		{"/proc/self", "/self", errdefs.ErrPermissionDenied},
	} {
		if err := r.Rename(tt.from, tt.to, false); errdefs.Kind(err) != tt.wantKind {
			t.Errorf("Rename(%q, %q) = %v, want kind %v", tt.from, tt.to, err, tt.wantKind)
		}
	}
	if got := readFile(t, s.path("etc/shadow")); got != decoy {
		t.Errorf("/etc/shadow changed: %q", got)
	}
}
