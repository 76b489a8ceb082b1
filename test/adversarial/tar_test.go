package adversarial

import (
	"archive/tar"
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestUploadTarRefused uploads archives that would write outside the
// destination directory or make what a sandbox may not make (the attacker
// here is whoever crafts the archive, e.g. an agent's output copied into
// another sandbox), and checks each is refused as InvalidArgument before
// anything is written: the destination stays empty, nothing appears next
// to it, and the host dir that some entries aim at is unchanged.
// Protection: sandboxfs.ValidateTar checks the whole spooled archive first
// (no absolute or ".." names, no devices, hard links only to earlier
// entries, nothing under the archive's own links, no link out of the
// destination), then extraction resolves in the sandbox's root.
func TestUploadTarRefused(t *testing.T) {
	Env(t)
	t.Parallel()
	sb, h := Shared(t), newHostDir(t)
	dir := Scratch(t, sb)
	ctx := Ctx(t, time.Minute)
	link := func(name, target string) tarEntry {
		return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
	}
	hard := func(name, target string) tarEntry {
		return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target, Mode: 0o644}}
	}
	dev := func(name string, typ byte, major, minor int64) tarEntry {
		return tarEntry{hdr: tar.Header{Name: name, Typeflag: typ, Devmajor: major, Devminor: minor, Mode: 0o666}}
	}
	for _, tt := range []struct {
		name    string
		entries []tarEntry
	}{
		{"dot-dot name", []tarEntry{tarFile("../escaped", "x")}},
		{"deep dot-dot name", []tarEntry{tarFile("a/../../../../escaped", "x")}},
		{"absolute name", []tarEntry{tarFile("/escaped", "x")}},
		{"absolute name to the host dir", []tarEntry{tarFile(h.path+"/planted", "x")}},
		{"symlink out then write through it", []tarEntry{link("l", h.path), tarFile("l/planted", "x")}},
		{"climbing symlink then write through it", []tarEntry{link("l", "../../../../../.."+h.path), tarFile("l/planted", "x")}},
		{"symlink inside then write through it", []tarEntry{link("l", "."), tarFile("l/x", "x")}},
		{"symlink to /proc/self/root", []tarEntry{link("l", "/proc/self/root"+h.path)}},
		{"symlink climbing out", []tarEntry{link("l", "../../../etc/passwd")}},
		{"chain of symlinks out", []tarEntry{link("a", "b"), link("b", "../..")}},
		{"hard link out", []tarEntry{hard("h", "../../../etc/passwd")}},
		{"hard link to an absolute path", []tarEntry{hard("h", "/etc/passwd")}},
		{"hard link to a host file", []tarEntry{hard("h", h.path+"/secret")}},
		{"char device /dev/mem", []tarEntry{dev("mem", tar.TypeChar, 1, 1)}},
		{"block device", []tarEntry{dev("disk", tar.TypeBlock, 8, 0)}},
		{"file then a dir of the same name", []tarEntry{tarFile("d", "x"), tarFile("d/x", "x")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stats, err := sb.UploadTar(ctx, dir, bytes.NewReader(tarOf(t, tt.entries...)))
			if !errors.Is(err, dsec.ErrInvalidArgument) {
				t.Errorf("UploadTar(%s) = %+v, %v; want %v", tt.name, stats, err, dsec.ErrInvalidArgument)
			}
			if ents, _, err := sb.ListDir(ctx, dir); err != nil || len(ents) != 0 {
				t.Errorf("ListDir(%q) after a refused upload = %d entries, %v; want none", dir, len(ents), err)
			}
			if r := Sh(t, sb, "ls /adv/escaped /escaped 2>/dev/null"); r.Stdout != "" {
				t.Errorf("files next to the destination after a refused upload: %q", r.Stdout)
			}
			h.check(t, "UploadTar("+tt.name+")")
		})
	}
}

// TestUploadTarThroughPlantedLink plants, in the sandbox, a link from the
// upload's destination (and from a directory inside it) to the host dir,
// then uploads an innocent archive there, and checks the files land in
// the sandbox and never in the host dir. Protection: the destination and
// every parent are resolved in the sandbox's root (RESOLVE_IN_ROOT), and
// entries are created under descriptors, never by host path.
func TestUploadTarThroughPlantedLink(t *testing.T) {
	Env(t)
	t.Parallel()
	sb, h := Shared(t), newHostDir(t)
	dir := Scratch(t, sb)
	ctx := Ctx(t, time.Minute)
	MustSh(t, sb, "ln -s "+h.path+" "+dir+"/dest && mkdir "+dir+"/d && ln -s /proc/1/root"+h.path+" "+dir+"/d/sub")
	archive := tarOf(t, tarFile("planted", "x"), tarFile("sub/planted", "x"))
	_, _ = sb.UploadTar(ctx, dir+"/dest", bytes.NewReader(archive), dsec.WithMakeParents())
	_, _ = sb.UploadTar(ctx, dir+"/d", bytes.NewReader(archive))
	h.check(t, "uploads through planted links")
}

// TestUploadTarSetuidDropped uploads a setuid root file, a setgid file
// and a file of another owner as user nobody, and checks all arrive as
// nobody's without setuid or setgid, so an archive cannot hand a sandbox
// user a setuid binary. Protection: extraction drops setuid and setgid of
// files and ignores the archive's owners.
func TestUploadTarSetuidDropped(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := Shared(t)
	dir := Scratch(t, sb)
	ctx := Ctx(t, time.Minute)
	suid := tarFile("suid", "#!/bin/sh\nid\n")
	suid.hdr.Mode, suid.hdr.Uid, suid.hdr.Gid = 0o4755, 0, 0
	sgid := tarFile("sgid", "#!/bin/sh\nid\n")
	sgid.hdr.Mode = 0o2755
	other := tarFile("owned", "x")
	other.hdr.Uid, other.hdr.Gid = 4242, 4242
	if _, err := sb.UploadTar(ctx, dir, bytes.NewReader(tarOf(t, suid, sgid, other)), dsec.WithOwner("nobody")); err != nil {
		t.Fatalf("UploadTar(setuid file) = %v", err)
	}
	r := Sh(t, sb, "cd "+dir+" && stat -c '%n %a %U' suid sgid owned")
	if want := "suid 755 nobody\nsgid 755 nobody\nowned 644 nobody\n"; r.Stdout != want {
		t.Errorf("stat after UploadTar of setuid and setgid entries = %q, %q; want %q", r.Stdout, r.Stderr, want)
	}
}
