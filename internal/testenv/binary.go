package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
	buildOut  []byte
)

// DsecBinary returns a static dsec binary for tests that run sandboxes:
// $DSEC_BIN when set (make test-root sets it), else one built once per test
// process into a temporary directory.
func DsecBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("DSEC_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("DSEC_BIN=%s: %v", p, err)
		}
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "dsec-test-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "dsec")
		cmd := exec.Command("go", "build", "-tags", "netgo,osusergo",
			"-ldflags", "-linkmode external -extldflags -static", "-o", buildPath, "./cmd/dsec")
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("build dsec: %v\n%s", buildErr, buildOut)
	}
	return buildPath
}

// moduleRoot is the repository root, found from this file's location.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// ModuleRoot returns the repository root.
func ModuleRoot() string { return moduleRoot() }
