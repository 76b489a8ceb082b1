// Package swaptest gives tests a swap file of their own: made and turned on
// through package swap, and turned off and removed when the test ends, on
// every path, so that no test leaves the host swapping.
package swaptest

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dsecproject/dsec/internal/swap"
	"github.com/dsecproject/dsec/internal/testenv"
)

// Enable turns on a swap file of size bytes in a directory of its own
// under $TMPDIR and returns its path; t.Cleanup turns it off and removes
// it. It needs root (skips without).
func Enable(t testing.TB, size int64) string {
	t.Helper()
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "dsec-swaptest-")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "swap")
	t.Cleanup(func() { Off(t, dir, path) })
	if _, err := swap.Enable(dir, swap.Spec{Path: path, Size: size}, nil); err != nil {
		t.Fatalf("swap.Enable(%s, %d) = %v", path, size, err)
	}
	return path
}

// Off turns off the swap file at path, recorded in stateDir, and removes
// it with stateDir; it also turns off a file at path that the record no
// longer names, so that a test that broke the record leaves nothing on.
func Off(t testing.TB, stateDir, path string) {
	t.Helper()
	if _, err := swap.Disable(stateDir, nil); err != nil {
		t.Errorf("swap.Disable = %v", err)
	}
	if Active(t, path) {
		t.Errorf("swap file %s still on after Disable", path)
		if err := swapoff(path); err != nil {
			t.Errorf("swapoff %s = %v", path, err)
		}
	}
	_ = os.Remove(path)
	_ = os.RemoveAll(stateDir)
}

// Active reports whether the host swaps to path.
func Active(t testing.TB, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/swaps")
	if err != nil {
		t.Fatal(err)
	}
	es, err := swap.ParseSwaps(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(es, func(e swap.SwapEntry) bool { return e.Path == path })
}
