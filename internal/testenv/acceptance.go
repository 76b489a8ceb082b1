package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// AcceptanceDir returns the directory of the shared acceptance data:
// $DSEC_ACCEPTANCE_DIR when set, else the first shared/acceptance found
// beside the repository root or one of its parents (it is ../shared/acceptance
// from the root in a work tree and in CI). It fails the test when there is
// none: the data is part of every checkout's surroundings.
func AcceptanceDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("DSEC_ACCEPTANCE_DIR"); d != "" {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("DSEC_ACCEPTANCE_DIR=%s: %v", d, err)
		}
		return d
	}
	root, err := filepath.Abs(moduleRoot())
	if err != nil {
		t.Fatal(err)
	}
	for dir := root; ; dir = filepath.Dir(dir) {
		cand := filepath.Join(dir, "shared", "acceptance")
		if st, err := os.Stat(cand); err == nil && st.IsDir() {
			return cand
		}
		if filepath.Dir(dir) == dir {
			break
		}
	}
	t.Fatalf("no shared/acceptance beside %s or its parents: set DSEC_ACCEPTANCE_DIR", root)
	return ""
}
