// Package testenv holds helpers that decide whether a test can run here.
//
// Tests that need root or a device skip with a clear reason on a developer's
// machine, but fail in CI (CI=true), where everything they need is present:
// no test may pass by skipping in CI.
package testenv

import (
	"os"
	"testing"
)

// InCI reports whether the tests run in CI.
func InCI() bool { return os.Getenv("CI") == "true" }

// RequireRoot skips t unless it runs as root; in CI it fails instead.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if InCI() {
		t.Fatal("this test needs root, and CI runs as root: run it with sudo")
	}
	t.Skip("needs root (run `make test-root`)")
}

// Require skips t with reason unless ok; in CI it fails instead.
func Require(t testing.TB, ok bool, reason string) {
	t.Helper()
	if ok {
		return
	}
	if InCI() {
		t.Fatalf("missing in CI: %s", reason)
	}
	t.Skip(reason)
}
