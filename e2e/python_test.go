package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/testenv"
)

// minPythonTests is fewer tests than sdk/python/tests holds: a run that
// finds fewer lost some on the way (an import error, a discovery change).
const minPythonTests = 70

// TestPython runs the Python SDK's unittest suite against a real dsec up,
// and installs the SDK with pip into a fresh virtual environment, offline,
// and runs the listing with it.
func TestPython(t *testing.T) {
	python := requirePython(t)
	p := newPlatform(t)
	p.Busybox(t)
	root := testenv.ModuleRoot()
	env := pythonEnv(t, p)

	t.Run("Unittest", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, python, "-m", "unittest", "discover", "-s", filepath.Join("sdk", "python", "tests"), "-v")
		cmd.Dir = root
		cmd.Env = env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("python unittest took %s", time.Since(start).Round(100*time.Millisecond))
		if err != nil {
			t.Fatalf("python -m unittest: %v\n%s", err, out)
		}
		ran := regexp.MustCompile(`(?m)^Ran (\d+) tests? in`).FindSubmatch(out)
		n := 0
		if ran != nil {
			n, _ = strconv.Atoi(string(ran[1]))
		}
		if n < minPythonTests {
			t.Errorf("python -m unittest ran %d tests, want at least %d\n%s", n, minPythonTests, out)
		}
		// Nothing may pass by skipping: the server is there.
		if regexp.MustCompile(`(?m)^OK \(.*skipped|\.\.\. skipped`).Match(out) {
			t.Errorf("python tests were skipped with a server present:\n%s", out)
		}
	})

	t.Run("PipInstall", func(t *testing.T) {
		dir := t.TempDir()
		venv := filepath.Join(dir, "venv")
		run := func(name string, args ...string) string {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, name, args...)
			cmd.Dir = dir // not the source tree, so imports come from the venv
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
			}
			return string(out)
		}
		run(python, "-m", "venv", venv)
		vpy := filepath.Join(venv, "bin", "python")
		run(vpy, "-m", "pip", "install", "--no-index", "--no-cache-dir", "--disable-pip-version-check",
			filepath.Join(root, "sdk", "python"))
		got := run(vpy, "-c", "import libdsec, libdsec.sync; print(libdsec.__file__)")
		if !strings.HasPrefix(strings.TrimSpace(got), venv+"/") {
			t.Errorf("import libdsec from the venv loaded %q, want a file under %s", got, venv)
		}
		// The listing, with the installed package.
		listing := `
import asyncio
from libdsec import DSecClient, DSecContainerRunArgs

async def main():
    client = DSecClient(); await client.open()
    args = DSecContainerRunArgs(container_image="busybox", memory_limit_mb=4096, cpu_cores_limit=4,
                                ttl_running_stop=300, network_rules={}, init_user="root")
    sandbox = await client.run_container(args, timeout=120)
    result = await sandbox.run_shell("echo hello world")
    await sandbox.stop()
    print(result.stdout, end="")
    await client.close()

asyncio.run(main())
`
		if got := run(vpy, "-c", listing); got != "hello world\n" {
			t.Errorf("the listing printed %q, want %q", got, "hello world\n")
		}
		// The build leaves nothing in the source tree.
		for _, junk := range []string{"build", "dist", "libdsec.egg-info"} {
			if _, err := os.Stat(filepath.Join(root, "sdk", "python", junk)); err == nil {
				t.Errorf("pip install left sdk/python/%s behind", junk)
			}
		}
	})

	t.Run("NothingLeft", func(t *testing.T) {
		c := p.Client(t, p.AdminKey(t))
		left, err := c.List(ctxT(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range left {
			t.Errorf("sandbox %s (labels %v) left by the Python tests", sb.ID, sb.Labels)
		}
	})
}

// requirePython returns the path of python3 (3.9 or newer), skipping the
// test without it (failing in CI).
func requirePython(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	python, err := exec.LookPath("python3")
	testenv.Require(t, err == nil, "python3 is not installed (apt-get install python3 python3-venv)")
	out, err := exec.Command(python, "-c", "import sys, venv, ensurepip; print(sys.version_info >= (3, 9))").CombinedOutput()
	testenv.Require(t, err == nil && strings.TrimSpace(string(out)) == "True",
		"python3 3.9 or newer with venv and ensurepip is needed (apt-get install python3 python3-venv): "+strings.TrimSpace(string(out)))
	return python
}

// pythonEnv is the environment of the Python processes: the platform's
// address and key, the test image, no user config file, no bytecode written
// into the source tree, and failures (not skips) without a server.
func pythonEnv(t *testing.T, p *platform) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "DSEC_"), strings.HasPrefix(name, "PYTHON"), strings.HasPrefix(name, "PIP_"),
			name == "HOME", name == "XDG_CONFIG_HOME", name == "VIRTUAL_ENV":
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"HOME="+t.TempDir(),
		"DSEC_ADDR=http://"+p.Addr,
		"DSEC_API_KEY="+p.AdminKey(t),
		"DSEC_STATE_DIR="+p.StateDir,
		"DSEC_TEST_IMAGE=busybox",
		"DSEC_TEST_REQUIRE_SERVER=1",
		"PYTHONDONTWRITEBYTECODE=1",
		"PIP_NO_INPUT=1",
	)
}

// TestPythonPause runs the Python SDK's live pause tests
// (sdk/python/tests/pause_live.py, which unittest's discovery leaves out)
// against a real dsec up. It needs the node side of issue 15 (the container
// backend's Pauser).
func TestPythonPause(t *testing.T) {
	python := requirePython(t)
	p := newPlatform(t)
	p.Busybox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "unittest", "pause_live", "-v")
	cmd.Dir = filepath.Join(testenv.ModuleRoot(), "sdk", "python", "tests")
	cmd.Env = pythonEnv(t, p)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python -m unittest pause_live: %v\n%s", err, out)
	}
	if ran := regexp.MustCompile(`(?m)^Ran (\d+) tests? in`).FindSubmatch(out); ran == nil || string(ran[1]) != "5" {
		t.Errorf("python -m unittest pause_live ran %q tests, want 5\n%s", ran, out)
	}
	if regexp.MustCompile(`(?m)^OK \(.*skipped|\.\.\. skipped`).Match(out) {
		t.Errorf("python pause tests were skipped with a server present:\n%s", out)
	}
}
