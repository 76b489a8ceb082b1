package adversarial

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/testenv"
	"github.com/dsecproject/dsec/internal/testenv/platform"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// LabelKey is the label every sandbox of the suite has, with the creating
// test's name as its value.
const LabelKey = "adversarial"

// hostPidsReserve is the shared platform's --host-pids-reserve.
const hostPidsReserve = "50%,4096"

// IntruderProject is the project of Intruder's key; the shared platform's
// sandboxes are made with the admin key in project "default".
const IntruderProject = "intruder"

// suite is what the tests share: one platform, one busybox image, one
// sandbox, the probe binary. Each part is made on first use.
var suite struct {
	platformOnce sync.Once
	p            *platform.Platform // closed by TestMain
	ready        bool               // p started and has the busybox image

	sharedOnce sync.Once
	shared     *dsec.Sandbox // nil when it failed to start

	intruderOnce sync.Once
	intruderKey  string

	probeOnce sync.Once
	probeDir  string
	probe     []byte
	probeErr  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if suite.probeDir != "" {
		os.RemoveAll(suite.probeDir)
	}
	if p := suite.p; p != nil {
		if code != 0 {
			fmt.Fprintf(os.Stderr, "platform log (tail):\n%s\n", tail(p.Log(), 200))
		}
		if err := p.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "shared platform: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Env returns the shared platform with the busybox image, starting it on
// first use. It skips t without root (fails in CI).
func Env(t *testing.T) *platform.Platform {
	t.Helper()
	testenv.RequireRoot(t)
	suite.platformOnce.Do(func() {
		p := platform.Open(t, "adv", fusionOptions(t), func(p *platform.Platform) {
			// Half the host's tasks, not the default quarter: the fork
			// bombs fill the ceiling while other test packages run beside
			// this one.
			p.Extra = append(p.Extra, "--host-pids-reserve", hostPidsReserve)
		})
		suite.p = p // closed by TestMain even if the image build fails
		p.Busybox(t)
		suite.ready = true
	})
	if !suite.ready {
		t.Fatal("the shared platform did not start: see the first test that failed")
	}
	return suite.p
}

// Ctx returns a context that ends after d or with the test.
func Ctx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// Admin returns a client of the shared platform with its admin key.
func Admin(t *testing.T) *dsec.Client {
	t.Helper()
	p := Env(t)
	return p.Client(t, p.AdminKey(t))
}

// Intruder returns a client with a key of another project
// (IntruderProject) than the sandboxes Admin and Shared make.
func Intruder(t *testing.T) *dsec.Client {
	t.Helper()
	p := Env(t)
	suite.intruderOnce.Do(func() { suite.intruderKey = p.ProjectKey(t, IntruderProject) })
	if suite.intruderKey == "" {
		t.Fatal("no intruder key: see the first test that failed")
	}
	return p.Client(t, suite.intruderKey)
}

// NewSandbox creates a busybox sandbox with the admin key (64 MiB of
// memory unless opts says otherwise) and deletes it when t ends. Use it
// for attacks that spoil their sandbox.
func NewSandbox(t *testing.T, opts dsec.CreateOptions) *dsec.Sandbox {
	t.Helper()
	return newSandbox(t, Admin(t), opts, true)
}

func newSandbox(t *testing.T, c *dsec.Client, opts dsec.CreateOptions, cleanup bool) *dsec.Sandbox {
	t.Helper()
	if opts.Image == "" {
		opts.Image = "busybox"
	}
	if opts.Memory == 0 {
		opts.Memory = 64 << 20
	}
	if opts.Labels == nil {
		opts.Labels = map[string]string{}
	}
	opts.Labels[LabelKey] = labelValue(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, opts)
	if err != nil {
		t.Fatalf("Create(%+v) = %v", opts, err)
	}
	if cleanup {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := sb.Delete(ctx); err != nil {
				t.Errorf("Delete(%s) = %v", sb.ID, err)
			}
		})
	}
	return sb
}

// Shared returns the suite's shared sandbox (default limits but 64 MiB),
// made on first use and deleted with the platform. Attacks that use it
// must leave it working for the others: write only under Scratch.
func Shared(t *testing.T) *dsec.Sandbox {
	t.Helper()
	c := Admin(t)
	suite.sharedOnce.Do(func() {
		suite.shared = newSandbox(t, c, dsec.CreateOptions{}, false)
	})
	if suite.shared == nil {
		t.Fatal("no shared sandbox: see the first test that failed")
	}
	return c.Sandbox(suite.shared.ID)
}

// Scratch makes a directory of t's own in sb and returns its path.
func Scratch(t *testing.T, sb *dsec.Sandbox) string {
	t.Helper()
	dir := "/adv/" + labelValue(t.Name())
	if err := sb.MakeDir(Ctx(t, time.Minute), dir, dsec.WithMakeParents()); err != nil {
		t.Fatalf("MakeDir(%q) = %v", dir, err)
	}
	return dir
}

// Result is a finished command in a sandbox.
type Result struct {
	dsec.ExitStatus
	Stdout, Stderr string
}

// Sh runs script with /bin/sh -c in sb and returns its output and exit
// status; an API error fails t. Its default timeout is a minute.
func Sh(t *testing.T, sb *dsec.Sandbox, script string, opts ...dsec.ExecOption) Result {
	t.Helper()
	opts = append([]dsec.ExecOption{dsec.WithTimeout(time.Minute)}, opts...)
	r, err := sb.Shell(Ctx(t, 2*time.Minute), script, opts...)
	if err != nil {
		t.Fatalf("Shell(%q) = %v", script, err)
	}
	return Result{ExitStatus: r.ExitStatus, Stdout: string(r.Stdout), Stderr: string(r.Stderr)}
}

// MustSh is Sh for commands that set up an attack: it fails t unless the
// script exits 0, and returns its stdout.
func MustSh(t *testing.T, sb *dsec.Sandbox, script string) string {
	t.Helper()
	r := Sh(t, sb, script)
	if r.Code() != 0 {
		t.Fatalf("Shell(%q) = exit %d, stderr %q; want exit 0", script, r.Code(), r.Stderr)
	}
	return r.Stdout
}

// InstallProbe uploads the probe (./probe, built once per test process) to
// /usr/bin/probe in sb.
func InstallProbe(t *testing.T, sb *dsec.Sandbox) {
	t.Helper()
	suite.probeOnce.Do(func() {
		suite.probeDir, suite.probeErr = os.MkdirTemp("", "dsec-adv-probe-")
		if suite.probeErr != nil {
			return
		}
		bin := filepath.Join(suite.probeDir, "probe")
		cmd := exec.Command("go", "build", "-o", bin, "./test/adversarial/probe")
		cmd.Dir = testenv.ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			suite.probeErr = fmt.Errorf("build probe: %v\n%s", err, out)
			return
		}
		suite.probe, suite.probeErr = os.ReadFile(bin)
	})
	if suite.probeErr != nil {
		t.Fatal(suite.probeErr)
	}
	if err := sb.WriteFile(Ctx(t, time.Minute), "/usr/bin/probe", suite.probe, dsec.WithMode(0o755), dsec.WithMakeParents()); err != nil {
		t.Fatalf("WriteFile(/usr/bin/probe) = %v", err)
	}
}

// Host runs a command on the host with a timeout of 30 seconds and
// returns its combined output and error.
func Host(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// HostAlive fails t unless the host can still fork and run a program,
// and the platform answers /healthz and an API call in time.
func HostAlive(t *testing.T) {
	t.Helper()
	if out, err := Host(t, "sh", "-c", "echo alive"); err != nil || out != "alive\n" {
		t.Errorf("sh -c 'echo alive' on the host = %q, %v; want alive", out, err)
	}
	p := Env(t)
	hc := http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(p.URL() + "/healthz")
	if err != nil {
		t.Errorf("GET /healthz = %v, want 200", err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /healthz = %d, want 200", resp.StatusCode)
		}
	}
	if _, err := Admin(t).List(Ctx(t, 10*time.Second), map[string]string{LabelKey: "none"}); err != nil {
		t.Errorf("List = %v, want the API to answer", err)
	}
}

// labelValue makes a test name a label value and a file name.
func labelValue(name string) string {
	s := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, name)
	return s[:min(len(s), 63)]
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
