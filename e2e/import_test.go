package e2e

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/testenv"
)

// registryHandler is an in-process OCI registry.
var registryHandler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))

// imgEntry is one entry of a layer the test writes.
type imgEntry struct {
	tar.Header
	data string
}

func ie(typ byte, name string, mode int64, uid, gid int, data string) imgEntry {
	return imgEntry{tar.Header{Typeflag: typ, Name: name, Mode: mode, Uid: uid, Gid: gid, Size: int64(len(data)), ModTime: time.Unix(1_700_000_000, 0), Format: tar.FormatPAX}, data}
}

func iSym(name, target string) imgEntry {
	e := ie(tar.TypeSymlink, name, 0o777, 0, 0, "")
	e.Linkname = target
	return e
}

func iLink(name, target string) imgEntry {
	e := ie(tar.TypeLink, name, 0o644, 0, 0, "")
	e.Linkname = target
	return e
}

func writeLayerTar(t *testing.T, entries ...imgEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestImportRoundTrip builds an OCI image of several layers (whiteouts, an
// opaque directory, hard and symbolic links, user xattrs, setuid and
// sticky modes, non-root owners) over busybox, imports it with the CLI,
// and compares the tree a sandbox of it sees with `tar -x` of the same
// layers applied in order on the host.
func TestImportRoundTrip(t *testing.T) {
	p := newPlatform(t)
	work := t.TempDir()

	// Layer 1: busybox, as GNU tar writes a directory.
	root := testenv.BusyboxRootfs(t)
	base, err := exec.Command("tar", "-C", root, "--numeric-owner", "--xattrs", "-cf", "-", ".").Output()
	if err != nil {
		t.Fatalf("tar the busybox root: %v", err)
	}
	xa := ie(tar.TypeReg, "data/keep", 0o644, 0, 0, "keep v1\n")
	xa.PAXRecords = map[string]string{"SCHILY.xattr.user.color": "blue", "SCHILY.xattr.user.empty": ""}
	// Layer 2: the test's tree.
	l2 := writeLayerTar(t,
		ie(tar.TypeDir, "data/", 0o755, 0, 0, ""),
		xa,
		ie(tar.TypeReg, "data/gone", 0o644, 0, 0, "to be removed\n"),
		ie(tar.TypeDir, "data/opq/", 0o755, 1234, 5678, ""),
		ie(tar.TypeReg, "data/opq/old1", 0o600, 1234, 5678, "old 1\n"),
		ie(tar.TypeDir, "data/opq/olddir/", 0o755, 0, 0, ""),
		ie(tar.TypeReg, "data/opq/olddir/f", 0o644, 0, 0, "f\n"),
		ie(tar.TypeReg, "data/h1", 0o640, 1000, 1000, "linked\n"),
		iLink("data/h2", "data/h1"),
		iSym("data/rel", "keep"),
		iSym("data/abs", "/bin/busybox"),
		iSym("data/dangling", "../nowhere"),
		ie(tar.TypeDir, "data/task/", 0o755, 1000, 1000, ""),
		ie(tar.TypeDir, "secret/", 0o700, 1000, 1000, ""),
		ie(tar.TypeReg, "secret/key", 0o400, 1000, 1000, "k\n"),
		ie(tar.TypeDir, "shared/", 0o1777, 0, 0, ""),
		ie(tar.TypeDir, "opt/tools/bin/", 0o755, 0, 0, ""),
		ie(tar.TypeReg, "opt/tools/bin/hello", 0o755, 0, 0, "#!/bin/sh\necho hello from tools\n"),
		ie(tar.TypeReg, "opt/tools/bin/suid", 0o4755, 0, 0, "#!/bin/sh\n"),
		ie(tar.TypeReg, "opt/tools/bin/sgid", 0o2711, 0, 50, "#!/bin/sh\n"),
		ie(tar.TypeFifo, "data/fifo", 0o620, 0, 0, ""),
		ie(tar.TypeChar, "data/null", 0o666, 0, 0, ""), // a device node: left out
	)
	// Layer 3: whiteouts, an opaque directory, replacements.
	l3 := writeLayerTar(t,
		ie(tar.TypeReg, "data/.wh.gone", 0o644, 0, 0, ""),
		ie(tar.TypeReg, "etc/.wh.hostname", 0o644, 0, 0, ""),
		ie(tar.TypeReg, ".wh.home", 0o644, 0, 0, ""),
		ie(tar.TypeDir, "data/opq/", 0o750, 1234, 5678, ""),
		ie(tar.TypeReg, "data/opq/.wh..wh..opq", 0o644, 0, 0, ""),
		ie(tar.TypeReg, "data/opq/new", 0o644, 1234, 5678, "new\n"),
		ie(tar.TypeReg, "data/keep", 0o644, 0, 0, "keep v2\n"), // replaced, without its xattrs
		ie(tar.TypeReg, "data/tagged", 0o644, 0, 0, "t\n"),
		iLink("data/tagged2", "data/tagged"),
	)
	tagged := ie(tar.TypeReg, "data/attr", 0o644, 0, 0, "a\n")
	tagged.PAXRecords = map[string]string{"SCHILY.xattr.user.color": "green", "SCHILY.xattr.user.kind": "file"}
	l3 = writeLayerTar(t, append(tarEntries(t, l3), tagged)...)
	tars := [][]byte{base, l2, l3}

	// The OCI image: gzip, zstd and plain layers.
	var layers []v1.Layer
	for i, comp := range []compression.Compression{compression.GZip, compression.ZStd, compression.None} {
		b := tars[i]
		opts := []tarball.LayerOption{tarball.WithCompression(comp)}
		switch comp {
		case compression.ZStd:
			opts = append(opts, tarball.WithMediaType(types.OCILayerZStd))
		case compression.None:
			opts = append(opts, tarball.WithMediaType(types.OCIUncompressedLayer))
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, opts...)
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layers...)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{
		Env:        []string{"PATH=/opt/tools/bin:/usr/bin:/bin", "GREETING=hi there"},
		WorkingDir: "/data/task",
		Cmd:        []string{"sh"},
	})
	if err != nil {
		t.Fatal(err)
	}
	lp, err := layout.Write(filepath.Join(work, "oci"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	out, errOut, code := p.CLI(t, "", "image", "import", "oci-layout:"+filepath.Join(work, "oci")+":v1", "imported:1")
	if code != 0 || strings.TrimSpace(out) != "imported:1" {
		t.Fatalf("dsec image import = %q, %q, exit %d", out, errOut, code)
	}
	t.Logf("import of 3 layers (%d KiB of tar) took %v:\n%s", (len(base)+len(l2)+len(l3))>>10, time.Since(start), errOut)
	if !strings.Contains(errOut, "3 uploaded") || !strings.Contains(errOut, "1 device nodes") {
		t.Errorf("dsec image import stderr = %q, want 3 layers uploaded and 1 device node skipped", errOut)
	}

	// The same image from a docker save archive: nothing to upload.
	tag, err := name.NewTag("example.com/rt:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(filepath.Join(work, "img.tar"), tag, img); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = p.CLI(t, "", "image", "import", "docker-archive:"+filepath.Join(work, "img.tar"), "imported:2")
	if code != 0 || strings.TrimSpace(out) != "imported:2" || !strings.Contains(errOut, "0 uploaded, 3 already stored") {
		t.Errorf("dsec image import docker-archive = %q, %q, exit %d; want 3 layers already stored", out, errOut, code)
	}

	// From a registry that wants a password: refused without it, then
	// imported with --username and --password-stdin.
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, pw, ok := r.BasicAuth(); !ok || u != "ci" || pw != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="e2e"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"log in"}]}`, http.StatusUnauthorized)
			return
		}
		registryHandler.ServeHTTP(w, r)
	}))
	defer reg.Close()
	regRef := strings.TrimPrefix(reg.URL, "http://") + "/rt/img:v1"
	rref, err := name.ParseReference(regRef)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(rref, img, remote.WithAuth(&authn.Basic{Username: "ci", Password: "s3cret"})); err != nil {
		t.Fatalf("push to the test registry: %v", err)
	}
	_, errOut, code = p.CLI(t, "", "image", "import", "--insecure", "docker://"+regRef, "imported:3")
	if code == 0 || !strings.Contains(errOut, "log in") {
		t.Errorf("dsec image import without credentials = %q, exit %d; want a failure saying to log in", errOut, code)
	}
	out, errOut, code = p.CLI(t, "s3cret\n", "image", "import", "--insecure", "--username", "ci", "--password-stdin", "docker://"+regRef, "imported:3")
	if code != 0 || strings.TrimSpace(out) != "imported:3" || !strings.Contains(errOut, "3 already stored") {
		t.Errorf("dsec image import from the registry = %q, %q, exit %d; want imported:3 with 3 layers already stored", out, errOut, code)
	}

	// Bad input through the CLI: a name that does not parse registers nothing.
	_, errOut, code = p.CLI(t, "", "image", "import", "oci-layout:"+filepath.Join(work, "oci"), "Bad Name")
	if code == 0 || !strings.Contains(errOut, "Bad Name") {
		t.Errorf("dsec image import with a bad name = %q, exit %d; want a failure naming it", errOut, code)
	}

	// The reference: tar -x of each layer in order, whiteouts applied.
	ref := filepath.Join(work, "ref")
	if err := os.Mkdir(ref, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, b := range tars {
		applyWhiteouts(t, ref, b)
		cmd := exec.Command("tar", "-C", ref, "--numeric-owner", "-xpf", "-", "--xattrs", "--xattrs-include=user.*", "--exclude=.wh.*", "--exclude=data/null")
		cmd.Stdin = bytes.NewReader(b)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("tar -x layer %d: %v\n%s", i+1, err, out)
		}
	}
	want := hostTree(t, ref)

	// The sandbox's view.
	out, errOut, code = p.CLI(t, "", "run", "-d", "imported:1")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("dsec run -d imported:1 = %q, %q, exit %d", out, errOut, code)
	}
	defer p.CLI(t, "", "rm", id)
	const list = `cd / && find . -xdev ! -path ./proc ! -path './proc/*' ! -path ./sys ! -path './sys/*' ! -path ./dev ! -path './dev/*' | sort |
while IFS= read -r f; do
  s=$(stat -c '%f|%u|%g|%h' "$f")
  if [ -L "$f" ]; then x=$(readlink "$f"); elif [ -f "$f" ]; then x=$(md5sum < "$f" | cut -d' ' -f1); else x=; fi
  echo "$f|$s|$x"
done`
	out, errOut, code = p.CLI(t, "", "exec", id, "--", "sh", "-c", list)
	if code != 0 {
		t.Fatalf("list the sandbox's tree: %q, exit %d", errOut, code)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f, rest, _ := strings.Cut(line, "|")
		got[strings.TrimPrefix(strings.TrimPrefix(f, "."), "/")] = normalizeRec(rest)
	}
	// What the runtime adds to every sandbox, not the image.
	for _, p := range []string{"", "proc", "sys", "dev", "etc/hosts", "etc/resolv.conf", "etc/hostname"} {
		delete(got, p)
		delete(want, p)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sandbox tree vs tar -x of the layers (-want +got):\n%s", diff)
	}
	for _, p := range []string{"data/gone", "data/opq/old1", "data/opq/olddir", "home", "data/null"} {
		if _, ok := got[p]; ok {
			t.Errorf("sandbox shows %s, which the image removes or leaves out", p)
		}
	}

	// User xattrs, read through the sandbox init's root.
	pid := sandboxPID(t, p, id)
	for path, wantX := range map[string]map[string]string{
		"data/attr": {"user.color": "green", "user.kind": "file"},
		"data/keep": {}, // replaced by a layer without them
	} {
		gotX := userXattrs(t, fmt.Sprintf("/proc/%d/root/%s", pid, path))
		if diff := cmp.Diff(wantX, gotX); diff != "" {
			t.Errorf("xattrs of %s in the sandbox (-want +got):\n%s", path, diff)
		}
	}

	// The image config applies.
	for _, tt := range []struct{ cmd, want string }{
		{"pwd", "/data/task"},
		{"echo $PATH", "/opt/tools/bin:/usr/bin:/bin"},
		{"echo $GREETING", "hi there"},
		{"hello", "hello from tools"},
	} {
		out, errOut, code := p.CLI(t, "", "exec", id, "--", "sh", "-c", tt.cmd)
		if strings.TrimSpace(out) != tt.want || code != 0 {
			t.Errorf("exec %q = %q, %q, exit %d; want %q", tt.cmd, out, errOut, code, tt.want)
		}
	}
}

func tarEntries(t *testing.T, b []byte) []imgEntry {
	t.Helper()
	var out []imgEntry
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		d, _ := io.ReadAll(tr)
		out = append(out, imgEntry{*h, string(d)})
	}
}

// applyWhiteouts removes from dir what the layer's whiteouts hide, before
// the layer is extracted over it (a whiteout never hides an entry of its
// own layer).
func applyWhiteouts(t *testing.T, dir string, layer []byte) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		parent, base := filepath.Split(filepath.Clean(h.Name))
		switch {
		case base == ".wh..wh..opq":
			es, _ := os.ReadDir(filepath.Join(dir, parent))
			for _, e := range es {
				if err := os.RemoveAll(filepath.Join(dir, parent, e.Name())); err != nil {
					t.Fatal(err)
				}
			}
		case strings.HasPrefix(base, ".wh."):
			if err := os.RemoveAll(filepath.Join(dir, parent, strings.TrimPrefix(base, ".wh."))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// hostTree lists dir as the sandbox's listing script does.
func hostTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			rel = ""
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		x := ""
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			x, _ = os.Readlink(p)
		case fi.Mode().IsRegular():
			b, err := exec.Command("md5sum", p).Output()
			if err != nil {
				return err
			}
			x, _, _ = strings.Cut(string(b), " ")
		}
		out[rel] = normalizeRec(fmt.Sprintf("%x|%d|%d|%d|%s", st.Mode, st.Uid, st.Gid, st.Nlink, x))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// normalizeRec drops the link count of directories (overlayfs counts them
// its own way).
func normalizeRec(rec string) string {
	f := strings.Split(rec, "|")
	if len(f) == 5 {
		var mode uint32
		fmt.Sscanf(f[0], "%x", &mode)
		if mode&unix.S_IFMT == unix.S_IFDIR {
			f[3] = "-"
		}
	}
	return strings.Join(f, "|")
}

// sandboxPID starts a marked process in the sandbox id and returns its
// host PID, whose /proc/PID/root is the sandbox's root.
func sandboxPID(t *testing.T, p *platform, id string) int {
	t.Helper()
	mark := fmt.Sprintf("%d.%03d", 600+time.Now().UnixNano()%1000, time.Now().UnixNano()%1000)
	if _, errOut, code := p.CLI(t, "", "exec", "-d", id, "--", "sleep", mark); code != 0 {
		t.Fatalf("exec -d sleep: %q, exit %d", errOut, code)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, c := range procs {
			b, _ := os.ReadFile(c)
			if string(b) == "sleep\x00"+mark+"\x00" {
				var pid int
				fmt.Sscanf(c, "/proc/%d/cmdline", &pid)
				return pid
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no process \"sleep %s\" of sandbox %s on the host", mark, id)
	return 0
}

// userXattrs reads the user.* extended attributes of p.
func userXattrs(t *testing.T, p string) map[string]string {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	out := map[string]string{}
	for _, k := range strings.Split(string(buf[:n]), "\x00") {
		if !strings.HasPrefix(k, "user.") {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, k, v)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, k, err)
		}
		out[k] = string(v[:m])
	}
	return out
}
