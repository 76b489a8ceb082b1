package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BusyboxRootfs makes a minimal root file system from Debian's static
// busybox in a temporary directory (scripts/busybox-rootfs.sh) and returns
// it. It needs root (it sets owners) and busybox-static.
func BusyboxRootfs(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	_, err := exec.LookPath("busybox")
	Require(t, err == nil, "busybox not installed (apt-get install busybox-static)")
	dir := filepath.Join(t.TempDir(), "rootfs")
	cmd := exec.Command(filepath.Join(moduleRoot(), "scripts", "busybox-rootfs.sh"), dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make busybox rootfs: %v\n%s", err, out)
	}
	return dir
}

// RemoveAll removes dir at the end of the test, with a clear failure.
func RemoveAll(t testing.TB, dir string) {
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
}
