package layer

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/testenv"
)

// variedTar is a tar stream with every kind of entry a layer keeps, in the
// forms real tools write them.
func variedTar(t *testing.T) []byte {
	at := func(e tarEntry, sec int64, nsec int64) tarEntry {
		e.ModTime = time.Unix(sec, nsec)
		return e
	}
	own := func(e tarEntry, uid, gid int) tarEntry {
		e.Uid, e.Gid = uid, gid
		return e
	}
	xattrs := func(e tarEntry, kv ...string) tarEntry {
		e.PAXRecords = map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			e.PAXRecords["SCHILY.xattr."+kv[i]] = kv[i+1]
		}
		return e
	}
	fifo := tarEntry{tar.Header{Typeflag: tar.TypeFifo, Name: "dir/fifo", Mode: 0o640}, ""}
	big := string(randomBytes(t, 5<<20))
	// Each directory's entries together, as tar -c writes them: GNU tar
	// sets a directory's time when it leaves it.
	return makeTar(t,
		dir("./", 0o755),
		reg(strings.Repeat("N", 255), "long", 0o644),
		symlink("dangling", "no/such/file"),
		at(dir("dir/", 0o755), 1_650_000_000, 0),
		symlink("dir/abs", "/usr/bin/python3"),
		xattrs(reg("dir/attrs", "a", 0o644), "user.one", "1", "user.two", strings.Repeat("2", 500)),
		xattrs(reg("dir/cap", "c", 0o755), "security.capability", capV2()),
		fifo,
		reg("dir/one", "1", 0o600),
		hardlink("dir/one-link", "./dir/one"),
		symlink("dir/rel", "../dir/one"),
		own(dir("dir/sub/", 0o750), 1000, 1000), // GNU tar wants the same spelling as its children
		at(reg("dir/sub/big", big, 0o755), 1_650_000_001, 999_999_999),
		own(reg("dir/sub/owned", "mine\n", 0o640), 1000, 1000),
		own(reg("dir/suid", "#!/bin/true\n", 0o4755), 0, 0),
		own(reg("dir/wide-ids", "ids\n", 0o644), 100_000, 100_001),
		reg("./dir/zero", "", 0o644),
		reg("dup", "old contents", 0o644),
		reg("dup", "new", 0o640),
		xattrs(dir("opaque", 0o755), "trusted.overlay.opaque", "y"),
		dir("sgid", 0o2775),
		dir("tmp", 0o1777),
		hardlink("tmp/big-link", "dir/sub/big"),
		hardlink("tmp/link-of-link", "dir/one-link"),
	)
}

// extract runs tar -x of data as root into a new directory.
func extract(t *testing.T, data []byte) string {
	t.Helper()
	tarPath := filepath.Join(t.TempDir(), "in.tar")
	if err := os.WriteFile(tarPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "x")
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "--same-owner",
		"--same-permissions", "-xf", tarPath, "-C", dst)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	return dst
}

func TestBuildFromTarMounted(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("tar")
	testenv.Require(t, err == nil, "needs GNU tar")

	data := variedTar(t)
	want := extract(t, data)
	for _, tt := range []struct {
		name string
		data []byte
	}{
		{"plain", data},
		{"gzip", gzipped(t, data)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			img, info := mustBuildTar(t, tt.data, Options{})
			compareTrees(t, want, mountImage(t, img), compareOpts{})
			if info.Files != 22 || info.Skipped != 0 {
				t.Errorf("BuildFromTar() = %d files, %d skipped; want 22, 0", info.Files, info.Skipped)
			}
			// The same tree on disk gives the same layer.
			_, fromDir := buildDir(t, want, Options{})
			if fromDir != info {
				t.Errorf("BuildFromDir(tar -x of the stream) = %+v, want BuildFromTar's %+v", fromDir, info)
			}
		})
	}
}

func TestBuildFromTarMissingParents(t *testing.T) {
	testenv.RequireRoot(t)
	img, _ := mustBuildTar(t, makeTar(t, reg("a/b/c", "x", 0o600)), Options{})
	mnt := mountImage(t, img)
	recs := scanTree(t, mnt, compareOpts{})
	for _, p := range []string{"", "a", "a/b"} {
		r := recs[p]
		if r.Type != "dir" || r.Perm != 0o755 || r.UID != 0 || r.GID != 0 {
			t.Errorf("implicit directory %q = %+v, want a 0755 directory owned by 0:0", p, r)
		}
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "a/b/c")); err != nil || !bytes.Equal(b, []byte("x")) {
		t.Errorf("a/b/c = %q, %v; want %q", b, err, "x")
	}
}

func TestBuildFromTarLargeXattrs(t *testing.T) {
	testenv.RequireRoot(t)
	// Values larger than a block: the inode's xattr area spans blocks.
	e := reg("x", "data", 0o644)
	e.PAXRecords = map[string]string{}
	want := map[string]string{}
	for i := range 3 {
		v := strings.Repeat(string(rune('a'+i)), 60_000)
		e.PAXRecords["SCHILY.xattr.user.big"+strconv.Itoa(i)] = v
		want["user.big"+strconv.Itoa(i)] = v
	}
	img, _ := mustBuildTar(t, makeTar(t, e, reg("y", "after", 0o644)), Options{})
	mnt := mountImage(t, img)
	recs := scanTree(t, mnt, compareOpts{})
	if diff := cmp.Diff(want, recs["x"].Xattrs); diff != "" {
		t.Errorf("xattrs of x (-want +got):\n%s", diff)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "y")); err != nil || string(b) != "after" {
		t.Errorf("y = %q, %v; want %q", b, err, "after")
	}
}
