package sandboxfs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/testenv"
)

// The test binary re-executes itself as a process in its own mount
// namespace (a stand-in for a sandbox's init) when this variable names a
// directory: it mounts a tmpfs there, writes a file and waits for its stdin
// to close.
const helperEnv = "SANDBOXFS_TEST_MOUNTNS_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		if err := mountNSHelper(dir); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func mountNSHelper(dir string) error {
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "visible"), []byte("the sandbox's view\n"), 0o644); err != nil {
		return err
	}
	fmt.Println("ready")
	_, err := io.Copy(io.Discard, os.Stdin)
	return err
}

// mount mounts fstype at target and unmounts it when the test ends.
func mount(t *testing.T, fstype, target string) {
	t.Helper()
	if err := unix.Mount(fstype, target, fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mount %s on %s: %v", fstype, target, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
}

// bind bind-mounts source on target and unmounts it when the test ends.
func bind(t *testing.T, source, target string) {
	t.Helper()
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s on %s: %v", source, target, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
}

func TestKernelFileSystems(t *testing.T) {
	testenv.RequireRoot(t)
	s := newFakeSandbox(t)
	mustMkdir(t, s.path("proc"), s.path("sys"), s.path("tmp"))
	mount(t, "proc", s.path("proc"))
	mount(t, "sysfs", s.path("sys"))
	mount(t, "tmpfs", s.path("tmp"))
	r := s.open(t)

	kcore := errdefs.ErrPermissionDenied
	if _, err := os.Stat("/proc/kcore"); err != nil {
		kcore = errdefs.ErrNotFound // a kernel without CONFIG_PROC_KCORE
	}
	reads := []struct {
		path     string
		wantKind error
	}{
		{"/proc/kcore", kcore},
		{"/proc/kpagecgroup", errdefs.ErrPermissionDenied},
		{"/proc/self/environ", errdefs.ErrPermissionDenied},
		{"/proc/1/environ", errdefs.ErrPermissionDenied},
		{"/proc/meminfo", errdefs.ErrPermissionDenied},
		{"x/proc/../proc/kpagecgroup", errdefs.ErrPermissionDenied},
		{"/sys/kernel/uevent_seqnum", errdefs.ErrPermissionDenied},
		{"/sys/kernel/address_bits", errdefs.ErrPermissionDenied},
		{"/proc/self", errdefs.ErrPermissionDenied},
		// Magic links are never followed, wherever they are in the path.
		{"z/etc/shadow", errdefs.ErrPermissionDenied},
		{"/proc/self/root/etc/shadow", errdefs.ErrPermissionDenied},
		{"/proc/thread-self/root/etc/shadow", errdefs.ErrPermissionDenied},
		{"/proc/1/root/etc/shadow", errdefs.ErrPermissionDenied},
		{"/proc/self/cwd/etc/shadow", errdefs.ErrPermissionDenied},
		{"/proc/self/exe", errdefs.ErrPermissionDenied},
	}
	for _, tt := range reads {
		got, _, err := readAll(t, r, tt.path)
		if errdefs.Kind(err) != tt.wantKind {
			t.Errorf("OpenRead(%q) = %.40q, %v, want kind %v", tt.path, got, err, tt.wantKind)
		}
	}
	_, _, err := readAll(t, r, "/proc/kpagecgroup")
	if want := "reading /proc/kpagecgroup through the file API is not allowed (it is on procfs); run `cat` with exec instead"; errString(err) != want {
		t.Errorf("OpenRead(%q) = %v, want %q", "/proc/kpagecgroup", err, want)
	}

	writes := []struct {
		path string
		opts WriteOptions
	}{
		{path: "/proc/dsec-test"},
		{path: "/proc/sys/kernel/dsec-test"},
		{path: "/proc/sys/kernel/dsec-dir/f", opts: WriteOptions{MakeParents: true}},
		{path: "/sys/kernel/dsec-test"},
		{path: "/sys/kernel/mm/dsec-dir/f", opts: WriteOptions{MakeParents: true}},
		{path: "/proc/sys/vm/drop_caches"},
	}
	for _, tt := range writes {
		_, err := write(r, tt.path, tt.opts, "3\n")
		if errdefs.Kind(err) != errdefs.ErrPermissionDenied || !strings.Contains(err.Error(), "through the file API is not allowed") {
			t.Errorf("WriteFile(%q) = %v, want PermissionDenied", tt.path, err)
		}
	}

	// The check is on the file, wherever it is mounted.
	mustWrite(t, s.path("etc/innocent"), "")
	bind(t, s.path("proc/kpagecgroup"), s.path("etc/innocent"))
	if _, _, err := readAll(t, r, "/etc/innocent"); errdefs.Kind(err) != errdefs.ErrPermissionDenied {
		t.Errorf("OpenRead(%q) = %v, want PermissionDenied for a procfs file bound there", "/etc/innocent", err)
	}
	// A file mounted over cannot be replaced; the error says so.
	mustWrite(t, s.path("etc/hosts"), "127.0.0.1 sandbox\n")
	mustWrite(t, s.path("hosts-source"), "127.0.0.1 mounted\n")
	bind(t, s.path("hosts-source"), s.path("etc/hosts"))
	if _, err := write(r, "/etc/hosts", WriteOptions{}, "new"); errdefs.Kind(err) != errdefs.ErrFailedPrecondition || !strings.Contains(err.Error(), "mount point") {
		t.Errorf("WriteFile(%q) = %v, want FailedPrecondition about a mount point", "/etc/hosts", err)
	}
	if got := readFile(t, s.path("hosts-source")); got != "127.0.0.1 mounted\n" {
		t.Errorf("WriteFile(%q) changed the mounted file to %q", "/etc/hosts", got)
	}
	assertNoTemp(t, s.path("etc"))

	// Stat never opens a file, so it works on procfs.
	info, err := r.Stat("/proc/kpagecgroup")
	if err != nil || !info.Mode.IsRegular() {
		t.Errorf("Stat(%q) = %+v, %v, want a regular file", "/proc/kpagecgroup", info, err)
	}

	// A tmpfs mounted in the sandbox is a place for files like any other.
	rootInfo, err := r.Stat("/")
	if err != nil {
		t.Fatal(err)
	}
	written, err := write(r, "/tmp/a/b/f", WriteOptions{MakeParents: true}, "on tmpfs")
	if err != nil {
		t.Fatalf("WriteFile(%q) = %v", "/tmp/a/b/f", err)
	}
	if written.Dev == rootInfo.Dev {
		t.Errorf("WriteFile(%q).Dev = %d, the root's: the tmpfs was not crossed", "/tmp/a/b/f", written.Dev)
	}
	for _, p := range []string{"/tmp/a/b/f", "x/tmp/a/b/f", "y/tmp/../tmp/a/b/f"} {
		got, info, err := readAll(t, r, p)
		if err != nil || got != "on tmpfs" || info.Dev != written.Dev || info.Ino != written.Ino {
			t.Errorf("OpenRead(%q) = %q, %+v, %v, want %q from the tmpfs", p, got, info, err, "on tmpfs")
		}
	}
	if got := readFile(t, s.path("tmp/a/b/f")); got != "on tmpfs" {
		t.Errorf("the tmpfs holds %q, want %q", got, "on tmpfs")
	}
}

func TestOtherMountNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "host-only"), "under the sandbox's tmpfs")

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("helper: %v\n%s", err, stderr.String())
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("helper did not exit")
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("helper said %q, %v, want ready:\n%s", line, err, stderr.String())
	}

	r, err := OpenRoot(fmt.Sprintf("/proc/%d/root", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	// The sandbox's view has the tmpfs and its file; the host's does not.
	got, _, err := readAll(t, r, filepath.Join(dir, "visible"))
	if err != nil || got != "the sandbox's view\n" {
		t.Errorf("OpenRead(%q) = %q, %v, want the file on the sandbox's tmpfs", filepath.Join(dir, "visible"), got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "visible")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the host sees the sandbox's file: %v", err)
	}
	if _, err := r.Stat(filepath.Join(dir, "host-only")); errdefs.Kind(err) != errdefs.ErrNotFound {
		t.Errorf("Stat(%q) = %v, want NotFound: the tmpfs hides it in the sandbox", filepath.Join(dir, "host-only"), err)
	}

	// A write lands on the sandbox's tmpfs, not in the host's directory.
	target := filepath.Join(dir, "written")
	if _, err := write(r, target, WriteOptions{}, "from the edge"); err != nil {
		t.Fatalf("WriteFile(%q) = %v", target, err)
	}
	if got, _, err := readAll(t, r, target); err != nil || got != "from the edge" {
		t.Errorf("OpenRead(%q) = %q, %v, want %q", target, got, err, "from the edge")
	}
	if _, err := os.Stat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the write reached the host's directory: %v", err)
	}
}
