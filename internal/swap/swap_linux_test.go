package swap_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/swap"
	"github.com/dsecproject/dsec/internal/swap/swaptest"
	"github.com/dsecproject/dsec/internal/testenv"
)

// newDirs returns a state directory and a swap file path, in temporary
// directories on a file system that holds swap files (/tmp here; not
// t.TempDir's name, which can be long and hold spaces on other hosts),
// with a cleanup that leaves no swap on.
func newDirs(t *testing.T) (stateDir, path string) {
	t.Helper()
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "dsec-swap-test-")
	if err != nil {
		t.Fatal(err)
	}
	stateDir, path = filepath.Join(dir, "state"), filepath.Join(dir, "swapfile")
	t.Cleanup(func() {
		swaptest.Off(t, stateDir, path)
		os.RemoveAll(dir)
	})
	return stateDir, path
}

func swapEntry(t *testing.T, path string) (swap.SwapEntry, bool) {
	t.Helper()
	b, err := os.ReadFile("/proc/swaps")
	if err != nil {
		t.Fatal(err)
	}
	es, err := swap.ParseSwaps(string(b))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Path == path {
			return e, true
		}
	}
	return swap.SwapEntry{}, false
}

// TestEnableDisable makes a swap file, takes it again as it is, replaces
// it by one of another size (as a dsec up restarted with another --swap
// does, or one after a crash), and turns it off and removes it.
func TestEnableDisable(t *testing.T) {
	stateDir, path := newDirs(t)
	const size = 64 << 20
	st, err := swap.Enable(stateDir, swap.Spec{Path: path, Size: size}, nil)
	if err != nil {
		t.Fatalf("Enable = %v", err)
	}
	if !st.Active || st.Record.Path != path || st.Record.Size != size || st.Record.Ino == 0 {
		t.Errorf("Enable = %+v, want an active record of %s, %d bytes, with its inode", st, path, size)
	}
	e, ok := swapEntry(t, path)
	if !ok {
		t.Fatalf("/proc/swaps has no %s after Enable", path)
	}
	// The kernel counts the pages after the header.
	if page := int64(os.Getpagesize()); e.Type != "file" || e.Size != size-page {
		t.Errorf("/proc/swaps entry = %+v, want a file of %d bytes", e, size-page)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("swap file mode = %v, want 0600", fi.Mode().Perm())
	}

	// The same spec again: taken as it is, not made again.
	again, err := swap.Enable(stateDir, swap.Spec{Path: path, Size: size}, nil)
	if err != nil {
		t.Fatalf("Enable again = %v", err)
	}
	if diff := cmp.Diff(st.Record, again.Record); diff != "" {
		t.Errorf("Enable again made another file (-first +again):\n%s", diff)
	}

	// Another size: the old one goes, a new one comes.
	bigger, err := swap.Enable(stateDir, swap.Spec{Path: path, Size: 2 * size}, nil)
	if err != nil {
		t.Fatalf("Enable with another size = %v", err)
	}
	if e, ok := swapEntry(t, path); !ok || !bigger.Active || e.Size != 2*size-int64(os.Getpagesize()) {
		t.Errorf("after Enable with another size: /proc/swaps %+v (%v), status %+v", e, ok, bigger)
	}

	rec, err := swap.Disable(stateDir, nil)
	if err != nil {
		t.Fatalf("Disable = %v", err)
	}
	if rec.Path != path {
		t.Errorf("Disable = %+v, want the record of %s", rec, path)
	}
	if _, ok := swapEntry(t, path); ok {
		t.Errorf("%s still in /proc/swaps after Disable", path)
	}
	for _, p := range []string{path, swap.RecordPath(stateDir)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after Disable: %v, want it gone", p, err)
		}
	}
	if rec, err := swap.Disable(stateDir, nil); err != nil || rec.Path != "" {
		t.Errorf("Disable with nothing recorded = %+v, %v; want nothing, nil", rec, err)
	}
}

// TestEnableLeavesForeignFile: a file at the path that dsec did not make
// is refused, never overwritten or removed.
func TestEnableLeavesForeignFile(t *testing.T) {
	stateDir, path := newDirs(t)
	want := []byte("the host's own file\n")
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := swap.Enable(stateDir, swap.Spec{Path: path, Size: 32 << 20}, nil)
	if !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Enable over an existing file = %v, want AlreadyExists", err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, want) {
		t.Errorf("the existing file now holds %q, want %q", got, want)
	}
	if _, err := os.Stat(swap.RecordPath(stateDir)); !os.IsNotExist(err) {
		t.Errorf("record after a refused Enable: %v, want none", err)
	}
}

// TestDisableLeavesReplacedFile: when the recorded path now holds another
// file (the swap file was removed by hand and the name reused), Disable
// drops the record and leaves the file.
func TestDisableLeavesReplacedFile(t *testing.T) {
	stateDir, path := newDirs(t)
	if _, err := swap.Enable(stateDir, swap.Spec{Path: path, Size: 32 << 20}, nil); err != nil {
		t.Fatal(err)
	}
	// Off by hand (as an operator would) and a new file at the name.
	if out, err := exec.Command("swapoff", path).CombinedOutput(); err != nil {
		t.Fatalf("swapoff: %v: %s", err, out)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := swap.Disable(stateDir, nil); err != nil {
		t.Fatalf("Disable = %v", err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "mine" {
		t.Errorf("the new file after Disable = %q, %v; want it left", got, err)
	}
	if _, err := os.Stat(swap.RecordPath(stateDir)); !os.IsNotExist(err) {
		t.Errorf("record after Disable: %v, want none", err)
	}
}

// TestEnableOnTmpfs: a file system that cannot hold swap is refused with
// what to do, and nothing is left.
func TestEnableOnTmpfs(t *testing.T) {
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("/dev/shm", "dsec-swap-test-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	defer os.RemoveAll(dir)
	stateDir, path := filepath.Join(dir, "state"), filepath.Join(dir, "swapfile")
	defer swaptest.Off(t, stateDir, path)
	_, err = swap.Enable(stateDir, swap.Spec{Path: path, Size: 16 << 20}, nil)
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "ext4 or xfs") {
		t.Errorf("Enable on tmpfs = %v, want FailedPrecondition naming what holds swap", err)
	}
	for _, p := range []string{path, swap.RecordPath(stateDir)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after a refused Enable: %v, want none", p, err)
		}
	}
}
