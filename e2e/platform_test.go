// Package e2e runs the real dsec binary: `dsec up` as a separate process,
// driven through the Go SDK and the CLI, with real sandboxes.
package e2e

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

// platform is one `dsec up` with its own state dir, port and cgroup
// parent, so that tests never touch a dsec that runs on the machine.
type platform struct {
	bin, stateDir, addr, cgroupParent string
	// fusionAddr is the SandboxFusion API's address; empty turns it off.
	fusionAddr string
	// extra are more flags of dsec up.
	extra  []string
	cmd    *exec.Cmd
	exited chan error
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newPlatform starts dsec up and registers cleanup that stops it, its
// keeper and every sandbox, and checks nothing is left on the host. Each
// option may set fields of the platform before it starts.
func newPlatform(t *testing.T, opts ...func(*platform)) *platform {
	t.Helper()
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "dsec-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	p := &platform{bin: testenv.DsecBinary(t), stateDir: dir, addr: freePort(t), cgroupParent: "dsec-e2e-" + randHex(4)}
	for _, o := range opts {
		o(p)
	}
	p.start(t)
	t.Cleanup(func() { p.destroy(t) })
	return p
}

func (p *platform) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(p.stateDir, "up.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(p.bin, append([]string{"up", "--state-dir", p.stateDir, "--listen", p.addr,
		"--cgroup-parent", p.cgroupParent, "--node", "e2e", "--sandboxfusion-listen", p.fusionAddr}, p.extra...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.exited = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(p.cmd, p.exited)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + p.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case err := <-p.exited:
			t.Fatalf("dsec up exited: %v\n%s", err, p.log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dsec up not ready in 60s\n%s", p.log())
		}
	}
}

func (p *platform) log() string {
	b, _ := os.ReadFile(filepath.Join(p.stateDir, "up.log"))
	k, _ := os.ReadFile(filepath.Join(p.stateDir, "logs", "keeper.log"))
	return string(b) + "\n--- keeper log ---\n" + string(k)
}

// stop sends SIGTERM (a clean shutdown that keeps sandboxes) and waits.
func (p *platform) stop(t *testing.T) {
	t.Helper()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Errorf("dsec up did not stop in 30s after SIGTERM")
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
}

// kill9 kills dsec up without warning.
func (p *platform) kill9(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

func (p *platform) adminKey(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(p.stateDir, "admin.key"))
	if err != nil {
		t.Fatalf("admin key: %v", err)
	}
	return strings.TrimSpace(string(b))
}

func (p *platform) client(t *testing.T, key string) *dsec.Client {
	t.Helper()
	c, err := dsec.New(dsec.Config{Addr: "http://" + p.addr, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// cli runs the dsec CLI against the platform.
func (p *platform) cli(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(p.bin, args...)
	cmd.Env = append(os.Environ(), "DSEC_ADDR=http://"+p.addr, "DSEC_STATE_DIR="+p.stateDir, "DSEC_API_KEY=", "HOME="+p.stateDir)
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

// busybox builds and registers the busybox image through the CLI.
func (p *platform) busybox(t *testing.T) {
	t.Helper()
	root := testenv.BusyboxRootfs(t)
	out, errOut, code := p.cli(t, "", "image", "build", "busybox", "--from-dir", root)
	if code != 0 || strings.TrimSpace(out) != "busybox:latest" {
		t.Fatalf("dsec image build = %q, %q, exit %d", out, errOut, code)
	}
}

// footprint lists what the platform holds on the host for sandboxes; not
// the keeper's pool of ready disks, nor its warm sandboxes and the layers
// they hold.
func (p *platform) footprint(t *testing.T) []string {
	out := p.fullFootprint(t)
	warm := slices.ContainsFunc(out, func(s string) bool { return strings.Contains(s, "warm_") })
	out = slices.DeleteFunc(out, func(s string) bool {
		return strings.Contains(s, "warm_") || warm && strings.Contains(s, "/layers/")
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

// fullFootprint lists what the platform holds on the host for sandboxes
// but the keeper's pool of ready disks.
func (p *platform) fullFootprint(t *testing.T) []string {
	t.Helper()
	var out []string
	mountsOf := func(pid string) {
		mi, err := os.ReadFile("/proc/" + pid + "/mountinfo")
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(mi), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && strings.HasPrefix(f[4], p.stateDir+"/") && !strings.HasSuffix(f[4], "/run/cgroup2") && !strings.Contains(f[4], "/pool-") {
				out = append(out, "mount "+strings.TrimPrefix(f[4], p.stateDir))
			}
		}
	}
	mountsOf("self")
	kc := keeper.NewClient(p.stateDir)
	defer kc.Close()
	if v, err := kc.Version(context.Background()); err == nil {
		mountsOf(strconv.Itoa(v.Pid))
	}
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range ents {
		groups, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", h.Name(), p.cgroupParent))
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
		if err == nil && strings.Contains(string(cg), "/"+p.cgroupParent+"/") {
			if strings.Contains(string(cg), "/"+p.cgroupParent+"/warm_") {
				out = append(out, "process in a sandbox cgroup (warm_)")
			} else {
				out = append(out, "process in a sandbox cgroup")
			}
		}
	}
	for _, d := range []string{"sandboxes", "run/crun", "run/runc", "run/layers", "run/disks", "run/disks/.images"} {
		es, _ := os.ReadDir(filepath.Join(p.stateDir, d))
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
		if f := strings.TrimSpace(string(bf)); err == nil && strings.HasPrefix(f, p.stateDir+"/") && !strings.Contains(f, "/pool-") {
			out = append(out, "loop device for "+strings.TrimPrefix(f, p.stateDir))
		}
	}
	sort.Strings(out)
	return out
}

// destroy stops everything and removes the state dir.
func (p *platform) destroy(t *testing.T) {
	if t.Failed() {
		t.Logf("platform log:\n%s", p.log())
	}
	p.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc := keeper.NewClient(p.stateDir)
	defer kc.Close()
	if v, err := kc.Version(ctx); err == nil {
		if err := kc.Shutdown(ctx, true); err != nil {
			t.Errorf("keeper shutdown: %v", err)
		}
		for range 500 {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", v.Pid)); os.IsNotExist(err) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if left := p.fullFootprint(t); len(left) > 0 {
		t.Errorf("left on the host after shutdown: %v", left)
	}
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range ents {
		_ = os.Remove(filepath.Join("/sys/fs/cgroup", h.Name(), p.cgroupParent))
	}
	os.RemoveAll(p.stateDir)
}
