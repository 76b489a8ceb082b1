package layer

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/erofs/go-erofs"
	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestBuildFromTarOCIWhiteouts(t *testing.T) {
	owned := dir("opq/", 0o700)
	owned.Uid, owned.Gid = 7, 8
	data := makeTar(t,
		dir("etc/", 0o755),
		reg("etc/.wh.passwd", "", 0o644),       // hides a lower etc/passwd
		reg(".wh.gone", "", 0o644),             // at the root
		reg("implicit/.wh.x", "", 0o644),       // parent left out of the stream
		owned,                                  // opaque, its metadata kept
		reg("opq/.wh..wh..opq", "", 0o644),     // after its directory
		reg("opq/kept", "k", 0o644),            // same layer: stays
		reg("late/.wh..wh..opq", "", 0o644),    // before its directory
		dir("late/", 0o750),                    // must not lose the marker
		reg("same", "s", 0o644),                // same layer: not hidden
		reg(".wh.same", "", 0o644),             // ... by a later whiteout
		reg(".wh.again", "", 0o644),            // a whiteout ...
		reg("again", "a", 0o644),               // ... replaced by a later entry
		reg(".wh..wh.plnk/123.456", "", 0o644), // aufs hard link dir: skipped
		reg(".wh..wh.aufs", "", 0o644),         // aufs metadata: skipped
	)
	img, info := mustBuildTar(t, data, Options{OCIWhiteouts: true})
	fsys := readImage(t, img)
	char := fs.ModeDevice | fs.ModeCharDevice
	want := map[string]imgRec{
		"etc":        {Type: fs.ModeDir, Perm: 0o755, Nlink: 2},
		"etc/passwd": {Type: char, Nlink: 1},
		"gone":       {Type: char, Nlink: 1},
		"implicit":   {Type: fs.ModeDir, Perm: 0o755, Nlink: 2},
		"implicit/x": {Type: char, Nlink: 1},
		"opq":        {Type: fs.ModeDir, Perm: 0o700, UID: 7, GID: 8, Nlink: 2},
		"opq/kept":   {Perm: 0o644, Data: "k", Nlink: 1},
		"late":       {Type: fs.ModeDir, Perm: 0o750, Nlink: 2},
		"same":       {Perm: 0o644, Data: "s", Nlink: 1},
		"again":      {Perm: 0o644, Data: "a", Nlink: 1},
	}
	got := map[string]imgRec{}
	xattrs := map[string]map[string]string{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return err
		}
		got[p], _ = statImage(t, fsys, p)
		fi, err := fs.Stat(fsys, p)
		if err != nil {
			return err
		}
		if x := fi.Sys().(*erofs.Stat).Xattrs; len(x) > 0 {
			xattrs[p] = x
		}
		if fi.Mode()&fs.ModeDevice != 0 {
			if rdev := fi.Sys().(*erofs.Stat).Rdev; rdev != 0 {
				t.Errorf("whiteout %s has rdev %#x, want 0", p, rdev)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("image contents (-want +got):\n%s", diff)
	}
	wantX := map[string]map[string]string{"opq": {OpaqueXattr: "y"}, "late": {OpaqueXattr: "y"}}
	if diff := cmp.Diff(wantX, xattrs); diff != "" {
		t.Errorf("xattrs (-want +got):\n%s", diff)
	}
	if info.Skipped != 2 {
		t.Errorf("BuildFromTar().Skipped = %d, want 2 (the aufs entries)", info.Skipped)
	}

	// Without the option the markers are plain files.
	img, _ = mustBuildTar(t, data, Options{})
	if r, _ := statImage(t, readImage(t, img), "etc/.wh.passwd"); r.Type != 0 {
		t.Errorf("without OCIWhiteouts etc/.wh.passwd has type %v, want a regular file", r.Type)
	}
}

func TestBuildFromTarOCIWhiteoutRoot(t *testing.T) {
	img, _ := mustBuildTar(t, makeTar(t, reg(".wh..wh..opq", "", 0o644), reg("f", "x", 0o644)), Options{OCIWhiteouts: true})
	fi, err := fs.Stat(readImage(t, img), ".")
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Sys().(*erofs.Stat).Xattrs[OpaqueXattr]; got != "y" {
		t.Errorf("root %s = %q, want \"y\"", OpaqueXattr, got)
	}
}

func TestBuildFromTarOCIWhiteoutRefuses(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		msg  string
	}{
		{"escaping whiteout", makeTar(t, reg("../.wh.x", "", 0o644)), `"../.wh.x"`},
		{"absolute whiteout", makeTar(t, reg("/etc/.wh.passwd", "", 0o644)), `"/etc/.wh.passwd"`},
		{"whiteout of nothing", makeTar(t, reg("d/.wh.", "", 0o644)), `"d/.wh."`},
		{"whiteout of dot", makeTar(t, reg(".wh..", "", 0o644)), `".wh.."`},
		{"whiteout directory", makeTar(t, dir("d/.wh.x/", 0o755)), `"d/.wh.x/"`},
		{"opaque in a file", makeTar(t, reg("f", "x", 0o644), reg("f/.wh..wh..opq", "", 0o644)), `"f/.wh..wh..opq"`},
		{"whiteout under a symlink", makeTar(t, symlink("l", "/etc"), reg("l/.wh.passwd", "", 0o644)), `"l/.wh.passwd"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := buildTar(t, tt.data, Options{OCIWhiteouts: true})
			if !errdefs.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(errText(err), tt.msg) {
				t.Errorf("BuildFromTar(%s) = %v, want InvalidArgument mentioning %s", tt.name, err, tt.msg)
			}
		})
	}
}

// FuzzBuildFromTarOCI checks whiteout conversion on any stream: the build
// succeeds or fails with InvalidArgument, and a built image holds no
// ".wh." name, no device but whiteouts (0:0), and opaque marks only on
// directories.
func FuzzBuildFromTarOCI(f *testing.F) {
	seeds := [][]byte{
		makeTar(f, dir("d", 0o755), reg("d/.wh.x", "", 0o644), reg("d/.wh..wh..opq", "", 0o644), reg("d/y", "y", 0o644)),
		makeTar(f, reg(".wh..wh..opq", "", 0o644), reg(".wh.a", "", 0o644), reg("a", "a", 0o644)),
		makeTar(f, reg("x/.wh..wh..opq", "", 0o644), dir("x", 0o700), reg(".wh..wh.plnk/1.2", "z", 0o644)),
		makeTar(f, reg("f", "x", 0o644), reg("f/.wh..wh..opq", "", 0o644)),
		makeTar(f, reg("../.wh.x", "", 0o644)),
		makeTar(f, reg(".wh.", "", 0o644), hardlink("l", ".wh.x")),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		img, _, err := buildTar(t, data, Options{OCIWhiteouts: true})
		if err != nil {
			if !errdefs.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("BuildFromTar(%q) = %v, want InvalidArgument or success", data, err)
			}
			return
		}
		fsys := readImage(t, img)
		err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if strings.HasPrefix(d.Name(), whiteoutPrefix) {
				t.Errorf("image holds %q, a whiteout file left unconverted", p)
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			st := fi.Sys().(*erofs.Stat)
			if fi.Mode()&fs.ModeDevice != 0 && (fi.Mode()&fs.ModeCharDevice == 0 || st.Rdev != 0) {
				t.Errorf("image holds device %q (%v, rdev %#x), want only whiteouts", p, fi.Mode(), st.Rdev)
			}
			if _, ok := st.Xattrs[OpaqueXattr]; ok && !fi.IsDir() {
				t.Errorf("image marks non-directory %q opaque", p)
			}
			return nil
		})
		if err != nil {
			t.Errorf("walk built image: %v", err)
		}
	})
}
