package sandboxtest

import (
	"archive/tar"
	"bytes"
	"io"
	"sort"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

func fileCases() []Case {
	return []Case{
		{Name: "FileOperations", Run: testFileOps},
		{Name: "TarRoundTrip", Run: testTarRoundTrip},
		{Name: "BadTarRefusedBeforeWriting", Run: testBadTar},
		{Name: "DiskLimitEnforced", Needs: []sandbox.Capability{sandbox.CapDiskLimit}, Run: testDiskLimit},
	}
}

func testFileOps(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	b := f.Backend
	id := create(t, f, sandbox.Resources{})
	if _, err := b.Mkdir(ctx, id, "/w/a/b", 0o750, true, 1000, 1000); err != nil {
		t.Fatalf("Mkdir -p = %v", err)
	}
	if _, err := b.Mkdir(ctx, id, "/w/a/b", 0o750, false, 0, 0); !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Mkdir of an existing dir = %v, want AlreadyExists", err)
	}
	for _, name := range []string{"z", "y", "x"} {
		if _, err := b.WriteFile(ctx, id, "/w/a/"+name, sandbox.WriteOptions{}, strings.NewReader(name)); err != nil {
			t.Fatal(err)
		}
	}
	Exec(t, f, id, sh("ln -s x /w/a/link"))
	ents, truncated, err := b.ReadDir(ctx, id, "/w/a", 0)
	if err != nil {
		t.Fatalf("ReadDir = %v", err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name)
	}
	if strings.Join(names, ",") != "b,link,x,y,z" || truncated {
		t.Errorf("ReadDir = %v (truncated %v), want b,link,x,y,z", names, truncated)
	}
	for _, e := range ents {
		want := ""
		if e.Name == "link" {
			want = "x"
		}
		if e.LinkTarget != want {
			t.Errorf("ReadDir: %s has link target %q, want %q", e.Name, e.LinkTarget, want)
		}
	}
	if ents, trunc, _ := b.ReadDir(ctx, id, "/w/a", 2); len(ents) != 2 || !trunc {
		t.Errorf("ReadDir limit 2 = %d entries, truncated %v", len(ents), trunc)
	}
	st, err := b.Stat(ctx, id, "/w/a/b")
	if err != nil || !st.Mode.IsDir() || st.Mode.Perm() != 0o750 || st.UID != 1000 {
		t.Errorf("Stat(dir) = %+v, %v; want a 0750 dir owned by 1000", st, err)
	}
	if err := b.Rename(ctx, id, "/w/a/x", "/w/a/y", false); !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Rename onto an existing file without overwrite = %v, want AlreadyExists", err)
	}
	if err := b.Rename(ctx, id, "/w/a/x", "/w/a/y", true); err != nil {
		t.Errorf("Rename with overwrite = %v", err)
	}
	if r := Exec(t, f, id, sh("cat /w/a/y; ls /w/a")); r.Stdout != "xb\nlink\ny\nz\n" {
		t.Errorf("after rename: %q", r.Stdout)
	}
	if err := b.Remove(ctx, id, "/w/a", false); err == nil {
		t.Errorf("Remove of a non-empty dir without recursive succeeded")
	}
	if err := b.Remove(ctx, id, "/w", true); err != nil {
		t.Errorf("Remove -r = %v", err)
	}
	if _, err := b.Stat(ctx, id, "/w"); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat after Remove -r = %v, want NotFound", err)
	}
	if err := b.Remove(ctx, id, "/proc", true); err == nil {
		t.Errorf("Remove -r /proc succeeded")
	}
	if err := b.Remove(ctx, id, "/", true); err == nil {
		t.Errorf("Remove -r / succeeded")
	}
}

func testTarRoundTrip(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	b := f.Backend
	id := create(t, f, sandbox.Resources{})
	Exec(t, f, id, sh(`mkdir -p /src/d/e && echo one > /src/d/f1 && head -c 300000 /dev/zero > /src/d/e/big &&
		ln -s f1 /src/d/sl && ln /src/d/f1 /src/d/hl && chmod 0600 /src/d/f1 && chown 1000:1000 /src/d/e/big`))
	var buf bytes.Buffer
	if err := b.DownloadTar(ctx, id, "/src/d", &buf); err != nil {
		t.Fatalf("DownloadTar = %v", err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "d/e/big" && (h.Uid != 1000 || h.Size != 300000) {
			t.Errorf("d/e/big header = uid %d size %d, want 1000 and 300000", h.Uid, h.Size)
		}
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "d d/e d/e/big d/f1 d/hl d/sl" && strings.Join(names, " ") != "d/ d/e/ d/e/big d/f1 d/hl d/sl" {
		t.Errorf("tar names = %v", names)
	}
	st, err := b.UploadTar(ctx, id, "/dst/x", bytes.NewReader(buf.Bytes()), sandbox.TarOptions{MakeParents: true, UID: 1000, GID: 1000})
	if err != nil {
		t.Fatalf("UploadTar = %v", err)
	}
	if st.Bytes != 300004 {
		t.Errorf("UploadTar moved %d bytes, want 300004", st.Bytes)
	}
	r := Exec(t, f, id, sh("cd /dst/x/d && cat f1 && stat -c '%a %u' f1 && readlink sl && wc -c < e/big && stat -c %h hl"))
	if r.Stdout != "one\n600 1000\nf1\n300000\n2\n" {
		t.Errorf("extracted tree: %q (stderr %q)", r.Stdout, r.Stderr)
	}
}

func testBadTar(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{})
	Exec(t, f, id, sh("mkdir -p /dst && echo keep > /dst/keep"))
	mk := func(entries ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			if h.Typeflag == tar.TypeReg {
				h.Size = 4
			}
			_ = tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				_, _ = tw.Write([]byte("data"))
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	ok := &tar.Header{Name: "fine.txt", Typeflag: tar.TypeReg, Mode: 0o644}
	for name, data := range map[string][]byte{
		"dotdot":      mk(ok, &tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}),
		"absolute":    mk(ok, &tar.Header{Name: "/etc/evil", Typeflag: tar.TypeReg, Mode: 0o644}),
		"link out":    mk(ok, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}, &tar.Header{Name: "l/etc/x", Typeflag: tar.TypeReg, Mode: 0o644}),
		"hard out":    mk(ok, &tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}),
		"device":      mk(ok, &tar.Header{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1}),
		"relative up": mk(ok, &tar.Header{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "../../.."}),
	} {
		_, err := f.Backend.UploadTar(ctx, id, "/dst", bytes.NewReader(data), sandbox.TarOptions{})
		if !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("UploadTar(%s) = %v, want InvalidArgument", name, err)
		}
	}
	if r := Exec(t, f, id, sh("ls -A /dst; ls /etc/evil /escape 2>&1 | wc -l")); r.Stdout != "keep\n2\n" {
		t.Errorf("after refused tars /dst holds %q: something was written", r.Stdout)
	}
}

func testDiskLimit(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{DiskBytes: 64 << 20})
	r := Exec(t, f, id, sh("dd if=/dev/zero of=/fill bs=1M count=100 2>&1; echo rc=$?"))
	if !strings.Contains(r.Stdout, "No space left") || strings.Contains(r.Stdout, "rc=0") {
		t.Errorf("writing 100 MiB into a 64 MiB writable layer: %q, want ENOSPC", r.Stdout)
	}
	st, err := f.Backend.Stats(ctx, id)
	if err != nil {
		t.Fatalf("Stats = %v", err)
	}
	if st.DiskLimit != 64<<20 || st.DiskBytes < 40<<20 {
		t.Errorf("Stats disk = %d of %d, want most of 64 MiB used", st.DiskBytes, st.DiskLimit)
	}
	_, err = f.Backend.WriteFile(ctx, id, "/more", sandbox.WriteOptions{}, bytes.NewReader(make([]byte, 32<<20)))
	if !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("WriteFile into a full sandbox = %v, want ResourceExhausted", err)
	}
	// Freeing space makes it usable again.
	r = Exec(t, f, id, sh("rm /fill && echo ok > /after && cat /after"))
	if r.Stdout != "ok\n" {
		t.Errorf("after freeing space: %q (stderr %q)", r.Stdout, r.Stderr)
	}
}
