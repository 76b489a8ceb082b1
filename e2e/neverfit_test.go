package e2e

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/testenv"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestNeverFits checks, on one platform, that creates no node could ever
// run are InvalidArgument at once, without a retry hint, naming the
// limit, and that a CPU cap above the node's is clamped and said so.
func TestNeverFits(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))

	for _, tc := range []struct {
		name  string
		opts  dsec.CreateOptions
		names []string // what the message must name
	}{
		{"memory 1 TiB", dsec.CreateOptions{Memory: 1 << 40}, []string{"memory", "1 TiB", "--memory"}},
		{"pids 10^9", dsec.CreateOptions{Pids: 1e9}, []string{"pids", "1000000000", "--pids"}},
		{"disk 10 TiB", dsec.CreateOptions{Disk: 10 << 40}, []string{"disk", "10 TiB", "--disk"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Image = "busybox"
			start := time.Now()
			sb, err := c.Create(ctxT(t), tc.opts)
			took := time.Since(start)
			if err == nil {
				_ = sb.Delete(ctxT(t))
				t.Fatalf("Create(%s) = %s, want InvalidArgument", tc.name, sb.ID)
			}
			var de *dsec.Error
			if !errors.Is(err, dsec.ErrInvalidArgument) || !errors.As(err, &de) {
				t.Fatalf("Create(%s) = %v, want InvalidArgument", tc.name, err)
			}
			if de.RetryAfter != 0 {
				t.Errorf("Create(%s) = %v, want no retry hint", tc.name, err)
			}
			if took > time.Second {
				t.Errorf("Create(%s) took %s, want an answer at once", tc.name, took)
			}
			for _, s := range tc.names {
				if !strings.Contains(de.Message, s) {
					t.Errorf("Create(%s) = %q, want it to name %q", tc.name, de.Message, s)
				}
			}
			for _, s := range []string{"/sys/fs/cgroup", p.CgroupParent, "internal error"} {
				if strings.Contains(de.Message, s) {
					t.Errorf("Create(%s) = %q, names %q", tc.name, de.Message, s)
				}
			}
			t.Logf("Create(%s): %s", tc.name, de.Message)
		})
	}

	t.Run("python", func(t *testing.T) {
		python := requirePython(t)
		cmd := exec.CommandContext(ctxT(t), python, "-m", "unittest", "-v", "test_neverfit")
		cmd.Dir = filepath.Join(testenv.ModuleRoot(), "sdk", "python", "tests")
		cmd.Env = pythonEnv(t, p)
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "Ran 3 tests") {
			t.Errorf("python -m unittest test_neverfit: %v\n%s", err, out)
		}
	})

	t.Run("cpus clamped", func(t *testing.T) {
		sb, err := c.Create(ctxT(t), dsec.CreateOptions{Image: "busybox", CPUs: 64})
		if err != nil {
			t.Fatalf("Create(cpus 64) = %v", err)
		}
		defer sb.Delete(ctxT(t))
		if got, want := sb.Resources.CPUs, float64(runtime.NumCPU()); got != want {
			t.Errorf("Create(cpus 64).Resources.CPUs = %v, want the node's %v", got, want)
		}
		_, stderr, code := p.CLI(t, "", "run", "--cpus", "64", "busybox", "--", "true")
		want := fmt.Sprintf("dsec: --cpus 64 was lowered to this node's %d CPUs", runtime.NumCPU())
		if code != 0 || !strings.Contains(stderr, want) {
			t.Errorf("dsec run --cpus 64 = %d, stderr %q; want 0 and %q", code, stderr, want)
		}
		if _, stderr, _ := p.CLI(t, "", "run", "--cpus", "1", "busybox", "--", "true"); strings.Contains(stderr, "lowered") {
			t.Errorf("dsec run --cpus 1: stderr %q, want no note", stderr)
		}
	})
}
