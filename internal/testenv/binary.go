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

// DsecBinary returns the dsec command line for tests that run sandboxes
// through it, with the platform binary dsec-node beside it (dsec hands
// dsec-node up, keeper and the other platform verbs): $DSEC_BIN when set
// (make test-root sets it to bin/dsec), else the two built once per test
// process into $TMPDIR/dsec-test-bin (files that every test process
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
	build(t)
	return filepath.Join(buildPath, "dsec")
}

// NodeBinary returns the platform binary, dsec-node, for tests that start
// the keeper or the exec helper themselves: $DSEC_NODE_BIN when set, else
// dsec-node beside $DSEC_BIN, else $DSEC_BIN itself (a platform binary
// runs every verb), else the one built once per test process.
func NodeBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("DSEC_NODE_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("DSEC_NODE_BIN=%s: %v", p, err)
		}
		return p
	}
	if p := os.Getenv("DSEC_BIN"); p != "" {
		beside := filepath.Join(filepath.Dir(p), "dsec-node")
		if _, err := os.Stat(beside); err == nil {
			return beside
		}
		return DsecBinary(t)
	}
	build(t)
	return filepath.Join(buildPath, "dsec-node")
}

// build builds dsec-node and dsec into buildPath once.
func build(t testing.TB) {
	t.Helper()
	buildOnce.Do(func() {
		dir := filepath.Join(os.TempDir(), "dsec-test-bin")
		if buildErr = os.MkdirAll(dir, 0o755); buildErr != nil {
			return
		}
		for _, b := range []struct {
			name, cgo, tags string
			ldflags         []string
		}{
			{"dsec-node", "1", "netgo,osusergo", []string{"-ldflags", "-linkmode external -extldflags -static"}},
			{"dsec", "0", "netgo,osusergo,dsec_client", nil},
		} {
			if buildOut, buildErr = buildOne(dir, b.name, b.cgo, b.tags, b.ldflags); buildErr != nil {
				return
			}
		}
		buildPath = dir
	})
	if buildErr != nil {
		t.Fatalf("build dsec: %v\n%s", buildErr, buildOut)
	}
}

// buildOne builds ./cmd/dsec into dir/name, replacing it atomically.
func buildOne(dir, name, cgo, tags string, ldflags []string) ([]byte, error) {
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return nil, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // gone once renamed; else a failed build's
	args := append(append([]string{"build", "-tags", tags}, ldflags...), "-o", tmp.Name(), "./cmd/dsec")
	cmd := exec.Command("go", args...)
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
	if out, err := cmd.CombinedOutput(); err != nil {
		return out, err
	}
	return nil, os.Rename(tmp.Name(), filepath.Join(dir, name))
}

// moduleRoot is the repository root, found from this file's location.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// ModuleRoot returns the repository root.
func ModuleRoot() string { return moduleRoot() }
