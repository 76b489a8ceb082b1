package adversarial

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/testenv/platform"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Attacks on the file API (ReadFile, WriteFile, Stat, ListDir, MakeDir,
// Remove, Rename, UploadTar, DownloadTar) from a sandbox that plants
// symlinks, ".." paths and special files for the platform to follow. The
// file API runs as host root outside the sandbox, so whatever it follows
// out of the sandbox's root is the host's. Protection for all of them:
// internal/sandboxfs resolves every path in the sandbox's own root with
// openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS), opens only regular files
// of data file systems, writes through fresh temporary files renamed over
// the target, and walks trees by descriptor with O_NOFOLLOW.

// hostDir is a directory on the host with a secret and a victim file, as
// an attacker would aim at: it does not exist in any sandbox.
type hostDir struct {
	path, secret string
}

func newHostDir(t *testing.T) hostDir {
	t.Helper()
	dir, err := os.MkdirTemp("", "dsec-adv-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := hostDir{path: dir, secret: "host-secret-" + platform.RandHex(8)}
	for name, data := range map[string]string{"secret": h.secret, "victim": "victim\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// check fails t unless the host dir holds exactly its secret and victim,
// unchanged.
func (h hostDir) check(t *testing.T, after string) {
	t.Helper()
	ents, err := os.ReadDir(h.path)
	if err != nil {
		t.Fatalf("read the host dir after %s: %v", after, err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if d := cmp.Diff([]string{"secret", "victim"}, names); d != "" {
		t.Errorf("host dir after %s (-want +got):\n%s", after, d)
	}
	if b, err := os.ReadFile(filepath.Join(h.path, "secret")); err != nil || string(b) != h.secret {
		t.Errorf("host secret after %s = %q, %v; want it unchanged", after, b, err)
	}
}

// escapes plants, in a scratch dir of sb, symlinks that lead to the host
// dir h if followed outside the sandbox's root, and returns the sandbox
// paths that name h through them, by a short name of the trick. The
// scratch dir also has ok -> /etc, a benign link the API must follow.
func escapes(t *testing.T, sb *dsec.Sandbox, h hostDir) (dir string, paths map[string]string) {
	t.Helper()
	dir = Scratch(t, sb)
	MustSh(t, sb, "cd "+dir+` &&
		ln -s `+h.path+` abs &&
		ln -s ../../../../../../../../..`+h.path+` climb &&
		ln -s /proc/1/root`+h.path+` proc1root &&
		ln -s /proc/self/root`+h.path+` selfroot &&
		ln -s /proc/self/cwd`+h.path+` selfcwd &&
		ln -s /proc/1/cwd/../../../..`+h.path+` proc1cwd &&
		ln -s abs chain &&
		ln -s /etc ok`)
	return dir, map[string]string{
		"absolute link":           dir + "/abs",
		"climbing relative link":  dir + "/climb",
		"/proc/1/root link":       dir + "/proc1root",
		"/proc/self/root link":    dir + "/selfroot",
		"/proc/self/cwd link":     dir + "/selfcwd",
		"/proc/1/cwd link":        dir + "/proc1cwd",
		"chain of links":          dir + "/chain",
		"dot-dot path":            dir + "/../../../../../../../.." + h.path,
		"/proc/self/root path":    "/proc/self/root" + h.path,
		"/proc/1/root path":       "/proc/1/root" + h.path,
		"absolute host path":      h.path,
		"dot-dot in an link path": dir + "/ok/../../../../.." + h.path,
	}
}

// TestSymlinkEscapeRead reads and stats the host's secret through links and
// paths that leave the sandbox's root, and checks the API never returns
// it, while it does follow a link that stays inside (ok -> /etc).
func TestSymlinkEscapeRead(t *testing.T) {
	Env(t)
	t.Parallel()
	sb, h := Shared(t), newHostDir(t)
	dir, paths := escapes(t, sb, h)
	ctx := Ctx(t, time.Minute)
	if b, err := sb.ReadFile(ctx, dir+"/ok/hostname"); err != nil || len(b) == 0 {
		t.Fatalf("ReadFile(%q) = %q, %v; want the sandbox's hostname through a link inside", dir+"/ok/hostname", b, err)
	}
	for name, p := range paths {
		f := p + "/secret"
		if b, err := sb.ReadFile(ctx, f); err == nil || bytes.Contains(b, []byte(h.secret)) {
			t.Errorf("%s: ReadFile(%q) = %q, %v; want an error", name, f, b, err)
		}
		var buf bytes.Buffer
		if _, err := sb.Download(ctx, f, &buf); err == nil || strings.Contains(buf.String(), h.secret) {
			t.Errorf("%s: Download(%q) = %q, %v; want an error", name, f, buf.String(), err)
		}
		if fi, err := sb.Stat(ctx, f); err == nil {
			t.Errorf("%s: Stat(%q) = %+v; want an error (no such file in the sandbox)", name, f, fi)
		}
	}
	h.check(t, "reads")
}

// TestSymlinkEscapeList lists and downloads as tar the host dir through
// the same links and paths, and checks neither names nor data of the host
// dir come back.
func TestSymlinkEscapeList(t *testing.T) {
	Env(t)
	t.Parallel()
	sb, h := Shared(t), newHostDir(t)
	_, paths := escapes(t, sb, h)
	ctx := Ctx(t, time.Minute)
	for name, p := range paths {
		ents, _, err := sb.ListDir(ctx, p)
		if slices.ContainsFunc(ents, func(e dsec.FileInfo) bool { return e.Name == "secret" }) {
			t.Errorf("%s: ListDir(%q) = %v, %v; want no host entries", name, p, ents, err)
		}
		var buf bytes.Buffer
		err = sb.DownloadTar(ctx, p, &buf)
		if names := tarNames(buf.Bytes()); strings.Contains(buf.String(), h.secret) || slices.Contains(names, "secret") || slices.Contains(names, "./secret") {
			t.Errorf("%s: DownloadTar(%q) = entries %q, %v; want none of the host's", name, p, names, err)
		}
	}
	h.check(t, "listings")
}

// TestSymlinkEscapeWrite writes files, makes directories and uploads a tar
// archive through the links and paths, and checks nothing appears in or
// changes in the host dir; a write onto a link that names the host's
// secret replaces the link in the sandbox, never the secret.
func TestSymlinkEscapeWrite(t *testing.T) {
	Env(t)
	t.Parallel()
	sb, h := Shared(t), newHostDir(t)
	dir, paths := escapes(t, sb, h)
	ctx := Ctx(t, time.Minute)
	for name, p := range paths {
		_ = sb.WriteFile(ctx, p+"/planted", []byte("planted"))
		_ = sb.WriteFile(ctx, p+"/deep/planted", []byte("planted"), dsec.WithMakeParents())
		_ = sb.WriteFile(ctx, p+"/secret", []byte("overwritten"))
		_ = sb.MakeDir(ctx, p+"/newdir")
		_ = sb.MakeDir(ctx, p+"/a/b/c", dsec.WithMakeParents())
		_, _ = sb.UploadTar(ctx, p, bytes.NewReader(tarOf(t, tarFile("untarred", "x"))))
		h.check(t, name+" writes")
	}
	MustSh(t, sb, "ln -s "+h.path+"/secret "+dir+"/secretlink")
	if err := sb.WriteFile(ctx, dir+"/secretlink", []byte("replaced")); err != nil {
		t.Errorf("WriteFile(%q) = %v, want the link replaced", dir+"/secretlink", err)
	}
	if fi, err := sb.Stat(ctx, dir+"/secretlink"); err != nil || fi.Type != dsec.TypeFile {
		t.Errorf("Stat(%q) after WriteFile = %+v, %v; want a regular file in place of the link", dir+"/secretlink", fi, err)
	}
	h.check(t, "a write onto a link")
}

// TestSymlinkEscapeRemoveRename removes and renames the host's victim
// through the links and paths, and renames a sandbox file to them, and
// checks the host dir is unchanged.
func TestSymlinkEscapeRemoveRename(t *testing.T) {
	Env(t)
	t.Parallel()
	sb, h := Shared(t), newHostDir(t)
	dir, paths := escapes(t, sb, h)
	ctx := Ctx(t, time.Minute)
	for name, p := range paths {
		_ = sb.Remove(ctx, p+"/victim", false)
		_ = sb.Remove(ctx, p+"/secret", true)
		_ = sb.Rename(ctx, p+"/victim", dir+"/stolen", true)
		if err := sb.WriteFile(ctx, dir+"/plant", []byte("planted")); err != nil {
			t.Fatal(err)
		}
		_ = sb.Rename(ctx, dir+"/plant", p+"/planted", true)
		_ = sb.Rename(ctx, dir+"/plant", p+"/victim", true)
		h.check(t, name+" removes and renames")
	}
	// Removing the whole tree through a link removes the link, not the host.
	_ = sb.Remove(ctx, dir+"/abs", true)
	_ = sb.Remove(ctx, "/proc/self/root"+h.path, true)
	h.check(t, "recursive removes")
}

// TestMagicLinks reads, through the file API, procfs magic links a
// process in the sandbox holds open: /proc/<pid>/fd/N of a file it opened,
// /proc/<pid>/cwd and /proc/<pid>/root, and a planted link to
// /proc/<pid>/fd/N. Each must be refused, even though the file behind it
// is the sandbox's own: the API resolves as host root, so following magic
// links could lead to any file a process holds, in or out of the sandbox.
// Protection: RESOLVE_NO_MAGICLINKS and the refusal to read procfs.
func TestMagicLinks(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := Shared(t)
	dir := Scratch(t, sb)
	ctx := Ctx(t, time.Minute)
	MustSh(t, sb, "echo inside > "+dir+"/held")
	x, err := sb.ExecDetached(ctx, dsec.ExecRequest{Shell: "exec 7< " + dir + "/held; cd " + dir + "; echo $$ > " + dir + "/pid; exec sleep 60", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Signal(context.Background(), x, 9) })
	var pid string
	for range 100 {
		if b, err := sb.ReadFile(ctx, dir+"/pid"); err == nil && len(b) > 0 {
			pid = strings.TrimSpace(string(b))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if pid == "" {
		t.Fatal("the holder never wrote its pid")
	}
	MustSh(t, sb, "ln -s /proc/"+pid+"/fd/7 "+dir+"/fdlink && cat "+dir+"/fdlink")
	for _, p := range []string{
		"/proc/" + pid + "/fd/7", dir + "/fdlink", "/proc/" + pid + "/cwd/held", "/proc/" + pid + "/root" + dir + "/held",
		"/proc/self/root/etc/hostname", "/proc/1/cwd/etc/hostname", "/proc/thread-self/root/etc/hostname", "/dev/fd/0",
	} {
		if b, err := sb.ReadFile(ctx, p); err == nil {
			t.Errorf("ReadFile(%q) = %q, nil; want a refusal of the magic link", p, b)
		}
		if err := sb.WriteFile(ctx, p, []byte("x")); err == nil && !strings.HasPrefix(p, dir) {
			t.Errorf("WriteFile(%q) = nil; want a refusal", p)
		}
	}
	if b, err := sb.ReadFile(ctx, dir+"/held"); err != nil || string(b) != "inside\n" {
		t.Errorf("ReadFile(%q) = %q, %v; want the file itself readable", dir+"/held", b, err)
	}
}

// TestSpecialFiles points the file API at a FIFO nobody writes, a unix
// socket, and the sandbox's device nodes (/dev/zero, /dev/urandom,
// /dev/tty, /dev/null), and checks every read and download returns at once
// with an error instead of blocking the API, streaming without end or
// opening a device; writes to them never write through to a device; and
// the API answers another call afterwards. Protection: sandboxfs opens
// only what an O_PATH descriptor showed to be a regular file, and writes
// through a temporary file renamed over the target.
func TestSpecialFiles(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := NewSandbox(t, dsec.CreateOptions{}) // a write through could spoil its /dev
	dir := Scratch(t, sb)
	MustSh(t, sb, "mkfifo "+dir+"/fifo && syslogd -O "+dir+"/log && sleep 0.2 && ls -l /dev/log | grep -q '^s'")
	hostNull := hostStat(t, "/dev/null")
	for _, p := range []string{dir + "/fifo", "/dev/log", "/dev/zero", "/dev/urandom", "/dev/tty", "/dev/null", "/dev/full", "/dev/ptmx", "/dev/pts/ptmx"} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		start := time.Now()
		b, err := sb.ReadFile(ctx, p)
		if err == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Errorf("ReadFile(%q) = %d bytes, %v after %v; want an error at once", p, len(b), err, time.Since(start).Round(time.Millisecond))
		}
		var buf bytes.Buffer
		if err := sb.DownloadTar(ctx, p, &buf); errors.Is(ctx.Err(), context.DeadlineExceeded) || buf.Len() > 64<<10 {
			t.Errorf("DownloadTar(%q) = %d bytes, %v; want it to end at once without the file's data", p, buf.Len(), err)
		}
		cancel()
	}
	ctx := Ctx(t, time.Minute)
	var buf bytes.Buffer
	if err := sb.DownloadTar(ctx, "/dev", &buf); err != nil || buf.Len() > 1<<20 {
		t.Errorf("DownloadTar(/dev) = %d bytes, %v; want the tree without device data", buf.Len(), err)
	}
	_ = sb.WriteFile(ctx, "/dev/null", []byte("through"))
	_ = sb.WriteFile(ctx, dir+"/fifo", []byte("through"))
	if got := hostStat(t, "/dev/null"); got != hostNull {
		t.Errorf("host /dev/null after writes through the file API = %s, want %s", got, hostNull)
	}
	if r := Sh(t, sb, "ls -l /dev/null | cut -c1; echo x > /dev/null && echo ok"); r.Stdout != "c\nok\n" {
		t.Errorf("the sandbox's /dev/null after a WriteFile = %q, %q; want a working device", r.Stdout, r.Stderr)
	}
	if _, err := sb.Stat(ctx, dir+"/fifo"); err != nil {
		t.Errorf("Stat(fifo) after the attempts = %v; want the API answering", err)
	}
}

// TestKernelFilesThroughAPI reads and writes kernel files (procfs, sysfs)
// of the sandbox through the file API, which runs as host root: each is
// refused, so no read of /proc/kpagecgroup (the report's kernel crash) and
// no write to /proc/sysrq-trigger or a sysctl can go through it.
// Protection: sandboxfs refuses paths that end on a kernel file system.
func TestKernelFilesThroughAPI(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := Shared(t)
	ctx := Ctx(t, time.Minute)
	for _, p := range []string{"/proc/kpagecgroup", "/proc/kcore", "/proc/self/environ", "/proc/1/environ", "/proc/1/mem", "/proc/self/mountinfo", "/sys/kernel/notes", "/sys/kernel/mm/transparent_hugepage/enabled"} {
		if b, err := sb.ReadFile(ctx, p); err == nil {
			t.Errorf("ReadFile(%q) = %d bytes, nil; want a refusal", p, len(b))
		}
	}
	for _, p := range []string{"/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/sys/kernel/mm/transparent_hugepage/enabled"} {
		if err := sb.WriteFile(ctx, p, []byte("1")); err == nil {
			t.Errorf("WriteFile(%q) = nil; want a refusal", p)
		}
	}
	var buf bytes.Buffer
	_ = sb.DownloadTar(ctx, "/proc/self", &buf)
	if names := tarNames(buf.Bytes()); len(names) > 0 && slices.ContainsFunc(names, func(n string) bool { return strings.Contains(n, "environ") }) {
		t.Errorf("DownloadTar(/proc/self) = %q; want no procfs files", names)
	}
}

// hostStat describes a host file by type, mode, owner and device.
func hostStat(t *testing.T, path string) string {
	t.Helper()
	out, err := Host(t, "stat", "-c", "%F %a %u:%g %t:%T", path)
	if err != nil {
		t.Fatalf("stat %s on the host: %v\n%s", path, err, out)
	}
	return strings.TrimSpace(out)
}

// tarEntry is a header and data for tarOf.
type tarEntry struct {
	hdr  tar.Header
	data string
}

func tarFile(name, data string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))}, data: data}
}

// tarOf makes a tar archive of entries.
func tarOf(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %q: %v", h.Name, err)
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

// tarNames lists the entries of a tar archive, as far as it is readable.
func tarNames(b []byte) []string {
	var names []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err != nil {
			return names
		}
		names = append(names, h.Name)
	}
}
