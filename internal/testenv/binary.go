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
// process into $TMPDIR/dsec-test-bin (one file that every test process
// replaces atomically with its build, so nothing accumulates; a binary
// already running keeps its own copy).
func DsecBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("DSEC_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("DSEC_BIN=%s: %v", p, err)
		}
		return p
	}
	buildOnce.Do(func() {
		dir := filepath.Join(os.TempDir(), "dsec-test-bin")
		if buildErr = os.MkdirAll(dir, 0o755); buildErr != nil {
			return
		}
		tmp, err := os.CreateTemp(dir, ".dsec-*")
		if err != nil {
			buildErr = err
			return
		}
		tmp.Close()
		defer os.Remove(tmp.Name()) // gone once renamed; else a failed build's
		cmd := exec.Command("go", "build", "-tags", "netgo,osusergo",
			"-ldflags", "-linkmode external -extldflags -static", "-o", tmp.Name(), "./cmd/dsec")
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if buildOut, buildErr = cmd.CombinedOutput(); buildErr != nil {
			return
		}
		buildPath = filepath.Join(dir, "dsec")
		buildErr = os.Rename(tmp.Name(), buildPath)
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
