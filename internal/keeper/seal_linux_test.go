package keeper

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestSealedEnv(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{"no PATH", []string{"HOME=/root"}, []string{"HOME=/root", "PATH=/.dsec/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
		{"PATH kept after the tools", []string{"PATH=/opt/bin:/bin", "A=1"}, []string{"A=1", "PATH=/.dsec/bin:/opt/bin:/bin"}},
		{"LD_ dropped", []string{"LD_PRELOAD=/x.so", "LD_LIBRARY_PATH=/evil", "LD_AUDIT=/a.so", "OLD_X=1", "PATH=/bin"}, []string{"OLD_X=1", "PATH=/.dsec/bin:/bin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sealedEnv(tt.in); !cmp.Equal(got, tt.want) {
				t.Errorf("sealedEnv(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// A busybox that is there but does not run now (here: not executable; on
// a busy node: no processes or files left) is Unavailable, to retry, not
// "install busybox-static"; none at all is FailedPrecondition. Neither is
// cached (issue 13: a sealed exec under load told the user to install a
// package that was installed).
func TestSealToolsNotRunnable(t *testing.T) {
	src, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("%v: install busybox-static (scripts/lib.sh does)", err)
	}
	dir := t.TempDir()
	bb := filepath.Join(dir, "busybox")
	if err := os.WriteFile(bb, src, 0o644); err != nil {
		t.Fatal(err)
	}
	saved := sealBusyboxPaths
	t.Cleanup(func() {
		sealBusyboxPaths = saved
		sealTools.mu.Lock()
		sealTools.path, sealTools.applets = "", nil
		sealTools.mu.Unlock()
	})
	sealTools.mu.Lock()
	sealTools.path, sealTools.applets = "", nil
	sealTools.mu.Unlock()
	sealBusyboxPaths = []string{filepath.Join(dir, "none"), bb}
	if _, _, err := findSealTools(execOutput); !errdefs.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("findSealTools with a busybox that cannot run = %v, want Unavailable", err)
	}
	if err := os.Chmod(bb, 0o755); err != nil {
		t.Fatal(err)
	}
	if p, applets, err := findSealTools(execOutput); err != nil || p != bb || len(applets) == 0 {
		t.Errorf("findSealTools once it runs = %q, %d applets, %v; want it found (nothing cached from the failure)", p, len(applets), err)
	}
	sealTools.mu.Lock()
	sealTools.path, sealTools.applets = "", nil
	sealTools.mu.Unlock()
	sealBusyboxPaths = []string{filepath.Join(dir, "none")}
	if _, _, err := findSealTools(execOutput); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("findSealTools with no busybox = %v, want FailedPrecondition", err)
	}
}

// The keeper's reaper waits for every child (wait4(-1)), so the sealed
// execs' busybox is asked for its applets through the reaper too: an
// os/exec child of the keeper loses its exit status to the reaper and
// reads as "could not be run just now".
func TestSealToolsBesideTheReaper(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: it makes the test process a child subreaper's reaper")
	}
	k := &Keeper{log: slog.New(slog.DiscardHandler), reaper: newReaper()}
	defer k.reaper.close()
	saved := sealBusyboxPaths
	t.Cleanup(func() { sealBusyboxPaths = saved })
	sealBusyboxPaths = []string{"/bin/busybox"}
	reset := func() {
		sealTools.mu.Lock()
		sealTools.path, sealTools.applets = "", nil
		sealTools.mu.Unlock()
	}
	defer reset()
	for i := range 50 {
		reset()
		if p, applets, err := findSealTools(k.run); err != nil || len(applets) == 0 {
			t.Fatalf("findSealTools beside the reaper, try %d = %q, %d applets, %v; want busybox's applets", i, p, len(applets), err)
		}
	}
}
