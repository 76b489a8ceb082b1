package nsexec

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestExecMountNS: a command with MountNS runs in that mount namespace
// (one owned by the host's user namespace, as a sealed exec's) and in the
// target's other namespaces.
func TestExecMountNS(t *testing.T) {
	target := startTarget(t)
	dir, err := os.MkdirTemp("", "dsec-mountns-") // 0755 for the target's root, unlike t.TempDir's parents
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A holder in a mount namespace of its own with a tmpfs over dir.
	holder := exec.Command(busybox, "sh", "-c",
		busybox+" mount -t tmpfs -o mode=755 none "+dir+" && "+busybox+" touch "+dir+"/marker && exec "+busybox+" sleep 100000")
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Unshareflags: syscall.CLONE_NEWNS}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = holder.Process.Kill()
		_ = holder.Wait()
	})
	// The marker seen through the holder's root is in its namespace (its
	// shell's command line names sleep before the mount is done).
	waitFor(t, "the holder to mount", func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d/root%s/marker", holder.Process.Pid, dir))
		return err == nil
	})
	if _, err := os.Stat(filepath.Join(dir, "marker")); err == nil {
		t.Fatal("the holder's mount reached the test's namespace")
	}
	mntns := fmt.Sprintf("/proc/%d/ns/mnt", holder.Process.Pid)
	forEachSpawner(t, func(t *testing.T, sp spawner) {
		stdout, stderr, ws := run(t, sp, ExecConfig{
			Pid: target, MountNS: mntns, Env: defaultEnv,
			Argv: []string{busybox, "sh", "-c", "ls " + dir + "; cat /proc/self/uid_map; hostname"},
		})
		fields := strings.Fields(stdout)
		if ws.ExitStatus() != 0 || len(fields) < 5 || fields[0] != "marker" || fields[2] != fmt.Sprint(hostIDBase) || fields[4] != targetHostname {
			t.Errorf("command in MountNS = exit %d, stdout %q, stderr %q; want marker, the target's uid map (%d) and hostname %s",
				ws.ExitStatus(), stdout, stderr, hostIDBase, targetHostname)
		}
	})
}

// TestExecMountNSNeedsTarget: a mount namespace of its own is refused for
// a target in the helper's own user namespace (the command would run as
// the host's root), and a missing one is an error.
func TestExecMountNSNeedsTarget(t *testing.T) {
	target := startTarget(t)
	tests := []struct {
		name, msg string
		cfg       ExecConfig
		errno     syscall.Errno
	}{
		{"host target", "needs the target's user and pid namespaces", ExecConfig{Pid: os.Getpid(), MountNS: "/proc/self/ns/mnt"}, syscall.EINVAL},
		{"no such namespace", "open mount namespace", ExecConfig{Pid: target, MountNS: "/nonexistent/ns/mnt"}, syscall.ENOENT},
	}
	forEachSpawner(t, func(t *testing.T, sp spawner) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				cfg := tt.cfg
				cfg.Argv, cfg.Env = []string{busybox, "true"}, defaultEnv
				child, err := sp.spawn(t, cfg, [3]*os.File{})
				var he *HelperError
				if !errors.As(err, &he) || !errors.Is(err, tt.errno) || !strings.Contains(err.Error(), tt.msg) || child != 0 {
					t.Fatalf("Spawn(%+v) = %d, %v; want a *HelperError, errno %v, with %q", cfg, child, err, tt.errno, tt.msg)
				}
			})
		}
	})
}
