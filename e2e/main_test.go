package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/debian"
	"github.com/dsecproject/dsec/internal/testenv"
)

// shared holds what the tests of this process build once and share: a
// root file system made from Debian packages takes tens of seconds, its
// import into each test's platform a second or two.
var shared struct {
	dir string // removed by TestMain

	pythonOnce sync.Once
	pythonTar  string
	pythonErr  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// pythonPackages are the Debian packages of the tests' Python image: pip
// for TestNetworkPip, and python3 with it for the rollout workers.
const pythonPackages = "python3-pip"

// pythonImage registers the tests' Python image (Debian's python3-pip and
// its dependencies, python3 among them) as name in p, public. Its root file
// system is built with mmdebstrap once per test process.
func pythonImage(t *testing.T, p *platform, name string) {
	t.Helper()
	_, err := exec.LookPath("mmdebstrap")
	testenv.Require(t, err == nil, "mmdebstrap not installed (apt-get install mmdebstrap)")
	shared.pythonOnce.Do(func() {
		start := time.Now()
		if shared.dir == "" {
			if shared.dir, shared.pythonErr = os.MkdirTemp("", "dsec-e2e-shared-"); shared.pythonErr != nil {
				return
			}
		}
		path := filepath.Join(shared.dir, "python.tar")
		f, err := os.Create(path)
		if err != nil {
			shared.pythonErr = err
			return
		}
		defer f.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if shared.pythonErr = debian.Build(ctx, debian.Options{Packages: []string{pythonPackages}}, f); shared.pythonErr == nil {
			shared.pythonTar = path
			t.Logf("the Python root file system (%s) built in %.0fs", pythonPackages, time.Since(start).Seconds())
		}
	})
	if shared.pythonErr != nil {
		t.Fatalf("build the Python root file system (%s): %v", pythonPackages, shared.pythonErr)
	}
	if out, errOut, code := p.CLI(t, "", "image", "build", name, "--from-tar", shared.pythonTar, "--public"); code != 0 {
		t.Fatalf("dsec image build %s --from-tar: exit %d\n%s\n%s", name, code, out, errOut)
	}
}
