// Package platform runs one real `dsec up` for tests: a separate process
// with its own state dir, API port and cgroup parent, so that a test never
// touches a dsec that runs on the machine, plus helpers to drive it through
// the Go SDK and the CLI and to list what it holds on the host.
//
// New starts a platform for one test and removes it when the test ends.
// Open starts one that the caller closes, for a package that shares one
// `dsec up` among all its tests (test/adversarial). Close checks that
// nothing of the platform is left on the host: mounts, cgroups, processes,
// sandbox dirs, loop devices.
package platform

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/testenv"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Platform is one `dsec up`. Options passed to New or Open may set its
// exported fields before it starts; StateDir already exists then.
type Platform struct {
	// Bin is the dsec binary (testenv.DsecBinary).
	Bin string
	// StateDir is the platform's own state dir, a new temporary directory.
	StateDir string
	// Addr is the API's host:port on loopback, a free port.
	Addr string
	// CgroupParent is the platform's own cgroup parent, dsec-NAME-RANDOM.
	CgroupParent string
	// Node is the node's name (--node), the name given to New or Open.
	Node string
	// FusionAddr is the SandboxFusion API's address; empty turns it off.
	FusionAddr string
	// PortsAddr is the ports proxy's address (--ports-listen); empty turns
	// it off, so that platforms of tests never contend for its default.
	PortsAddr string
	// Extra are more flags of dsec up.
	Extra []string

	cmd    *exec.Cmd
	exited chan error
}

// FreePort returns a loopback host:port that was free a moment ago.
func FreePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// RandHex returns n random bytes in hex.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// New starts dsec up for t and registers cleanup that stops it, its keeper
// and every sandbox, and checks nothing is left on the host. name is the
// node's name and a part of the state dir's and cgroup parent's names. It
// skips t without root (fails in CI).
func New(t testing.TB, name string, opts ...func(*Platform)) *Platform {
	t.Helper()
	p := Open(t, name, opts...)
	t.Cleanup(func() { p.Destroy(t) })
	return p
}

// Open starts dsec up like New but leaves it running after t ends: the
// caller must Close it. Start-up failures fail t.
func Open(t testing.TB, name string, opts ...func(*Platform)) *Platform {
	t.Helper()
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "dsec-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	p := &Platform{Bin: testenv.DsecBinary(t), StateDir: dir, Addr: FreePort(t), Node: name, CgroupParent: "dsec-" + name + "-" + RandHex(4)}
	for _, o := range opts {
		o(p)
	}
	if err := p.start(); err != nil {
		if cerr := p.Close(); cerr != nil {
			t.Errorf("clean up after a failed start: %v", cerr)
		}
		t.Fatal(err)
	}
	return p
}

// URL is the API's address as DSEC_ADDR spells it.
func (p *Platform) URL() string { return "http://" + p.Addr }

// Start starts dsec up again (after Stop, Kill9 or Wait) on the same state
// dir and waits until it answers /healthz.
func (p *Platform) Start(t testing.TB) {
	t.Helper()
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
}

func (p *Platform) start() error {
	logf, err := os.OpenFile(filepath.Join(p.StateDir, "up.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	p.cmd = exec.Command(p.Bin, append([]string{"up", "--state-dir", p.StateDir, "--listen", p.Addr,
		"--cgroup-parent", p.CgroupParent, "--node", p.Node, "--sandboxfusion-listen", p.FusionAddr, "--ports-listen", p.PortsAddr}, p.Extra...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		p.cmd = nil
		return fmt.Errorf("start dsec up: %w", err)
	}
	p.exited = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(p.cmd, p.exited)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(p.URL() + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case err := <-p.exited:
			p.cmd = nil
			return fmt.Errorf("dsec up exited: %v\n%s", err, p.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dsec up not ready in 60s\n%s", p.Log())
		}
	}
}

// Pid is the running dsec up's pid, 0 when none runs.
func (p *Platform) Pid() int {
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Log returns dsec up's output and the keeper's log.
func (p *Platform) Log() string {
	b, _ := os.ReadFile(filepath.Join(p.StateDir, "up.log"))
	k, _ := os.ReadFile(filepath.Join(p.StateDir, "logs", "keeper.log"))
	return string(b) + "\n--- keeper log ---\n" + string(k)
}

// Stop sends SIGTERM (a clean shutdown that keeps sandboxes) and waits.
func (p *Platform) Stop(t testing.TB) {
	t.Helper()
	if err := p.stop(); err != nil {
		t.Error(err)
	}
}

func (p *Platform) stop() error {
	if p.cmd == nil {
		return nil
	}
	defer func() { p.cmd = nil }()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return errors.New("dsec up did not stop in 30s after SIGTERM")
	}
}

// Kill9 kills dsec up without warning.
func (p *Platform) Kill9(t testing.TB) {
	t.Helper()
	if p.cmd == nil {
		t.Fatal("Kill9: dsec up is not running")
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

// Signal sends sig to dsec up; Wait then waits for it to exit.
func (p *Platform) Signal(sig os.Signal) error {
	if p.cmd == nil {
		return errors.New("dsec up is not running")
	}
	return p.cmd.Process.Signal(sig)
}

// Wait waits up to d for dsec up to exit, after Signal or after something
// else stopped it (dsec purge), and returns how it exited. It fails t when
// dsec up is still running after d.
func (p *Platform) Wait(t testing.TB, d time.Duration) error {
	t.Helper()
	if p.cmd == nil {
		return nil
	}
	select {
	case err := <-p.exited:
		p.cmd = nil
		return err
	case <-time.After(d):
		t.Fatalf("dsec up still runs %v later", d)
		return nil
	}
}

// AdminKey returns the admin key dsec up made in its state dir.
func (p *Platform) AdminKey(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.StateDir, "admin.key"))
	if err != nil {
		t.Fatalf("admin key: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// Client returns a Go SDK client with key, closed when t ends.
func (p *Platform) Client(t testing.TB, key string) *dsec.Client {
	t.Helper()
	c, err := dsec.New(dsec.Config{Addr: p.URL(), APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ProjectKey creates a non-admin API key of project through the admin API
// and returns its secret.
func (p *Platform) ProjectKey(t testing.TB, project string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	secret, _, err := p.Client(t, p.AdminKey(t)).CreateKey(ctx, dsec.KeyOptions{Name: project, Project: project})
	if err != nil {
		t.Fatalf("CreateKey(project %q) = %v", project, err)
	}
	return secret
}

// CLI runs the dsec CLI against the platform with the admin key of its
// state dir (DSEC_API_KEY is cleared; pass --api-key for another).
func (p *Platform) CLI(t testing.TB, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(p.Bin, args...)
	cmd.Env = append(os.Environ(), "DSEC_ADDR="+p.URL(), "DSEC_STATE_DIR="+p.StateDir, "DSEC_API_KEY=", "HOME="+p.StateDir)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.Stdin = strings.NewReader(stdin)
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run dsec %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// Busybox builds and registers the busybox image through the CLI, public
// (as scripts/quickstart.sh does), so that keys of every project run it.
func (p *Platform) Busybox(t testing.TB) {
	t.Helper()
	root := testenv.BusyboxRootfs(t)
	out, errOut, code := p.CLI(t, "", "image", "build", "busybox", "--from-dir", root, "--public")
	if code != 0 || strings.TrimSpace(out) != "busybox:latest" {
		t.Fatalf("dsec image build = %q, %q, exit %d", out, errOut, code)
	}
}

// Footprint lists what the platform holds on the host for sandboxes; not
// the keeper's pool of ready disks, nor its warm sandboxes and the layers
// they hold. It is nil when nothing is held.
func (p *Platform) Footprint() []string {
	out := p.FullFootprint()
	warm := slices.ContainsFunc(out, func(s string) bool { return strings.Contains(s, "warm_") })
	out = slices.DeleteFunc(out, func(s string) bool {
		return strings.Contains(s, "warm_") || warm && strings.Contains(s, "/layers/")
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

// FullFootprint lists what the platform holds on the host for sandboxes
// but the keeper's pool of ready disks, sorted.
func (p *Platform) FullFootprint() []string {
	var out []string
	mountsOf := func(pid string) {
		mi, err := os.ReadFile("/proc/" + pid + "/mountinfo")
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(mi), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && strings.HasPrefix(f[4], p.StateDir+"/") && !strings.HasSuffix(f[4], "/run/cgroup2") && !strings.Contains(f[4], "/pool-") {
				out = append(out, "mount "+strings.TrimPrefix(f[4], p.StateDir))
			}
		}
	}
	mountsOf("self")
	kc := keeper.NewClient(p.StateDir)
	defer kc.Close()
	if v, err := kc.Version(context.Background()); err == nil {
		mountsOf(strconv.Itoa(v.Pid))
	}
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range ents {
		groups, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", h.Name(), p.CgroupParent))
		for _, g := range groups {
			if g.IsDir() {
				out = append(out, "cgroup "+h.Name()+"/"+g.Name())
			}
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, pr := range procs {
		if _, err := strconv.Atoi(pr.Name()); err != nil {
			continue
		}
		cg, err := os.ReadFile("/proc/" + pr.Name() + "/cgroup")
		if err == nil && strings.Contains(string(cg), "/"+p.CgroupParent+"/") {
			if strings.Contains(string(cg), "/"+p.CgroupParent+"/warm_") {
				out = append(out, "process in a sandbox cgroup (warm_)")
			} else {
				out = append(out, "process in a sandbox cgroup")
			}
		}
	}
	for _, d := range []string{"sandboxes", "run/crun", "run/runc", "run/layers", "run/disks", "run/disks/.images"} {
		es, _ := os.ReadDir(filepath.Join(p.StateDir, d))
		for _, e := range es {
			if strings.HasPrefix(e.Name(), "pool-") || strings.HasPrefix(e.Name(), ".") {
				continue // the keeper's pool of ready disks and the disk store's own files
			}
			out = append(out, "dir "+d+"/"+e.Name())
		}
	}
	blocks, _ := os.ReadDir("/sys/block")
	for _, e := range blocks {
		bf, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if f := strings.TrimSpace(string(bf)); err == nil && strings.HasPrefix(f, p.StateDir+"/") && !strings.Contains(f, "/pool-") {
			out = append(out, "loop device for "+strings.TrimPrefix(f, p.StateDir))
		}
	}
	sort.Strings(out)
	return out
}

// Destroy is Close for a test: it logs the platform's log when t failed
// and fails t when something is left.
func (p *Platform) Destroy(t testing.TB) {
	t.Helper()
	if t.Failed() {
		t.Logf("platform log:\n%s", p.Log())
	}
	if err := p.Close(); err != nil {
		t.Error(err)
	}
}

// Close stops dsec up, shuts its keeper down with every sandbox, removes
// the cgroup parent and the state dir, and reports what was left on the
// host after the shutdown.
func (p *Platform) Close() error {
	errs := []error{p.stop()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc := keeper.NewClient(p.StateDir)
	defer kc.Close()
	if v, err := kc.Version(ctx); err == nil {
		if err := kc.Shutdown(ctx, true); err != nil {
			errs = append(errs, fmt.Errorf("keeper shutdown: %w", err))
		}
		for range 500 {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", v.Pid)); os.IsNotExist(err) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if left := p.FullFootprint(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("left on the host after shutdown: %v", left))
	}
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range ents {
		_ = os.Remove(filepath.Join("/sys/fs/cgroup", h.Name(), p.CgroupParent))
	}
	os.RemoveAll(p.StateDir)
	return errors.Join(errs...)
}
