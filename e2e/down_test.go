package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/testenv"
)

// TestDown: dsec down stops dsec up and leaves the sandboxes running for
// the next up; --all needs a confirmation and then leaves nothing; a second
// up on the same state dir names the running one.
func TestDown(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	out, errOut, code := p.CLI(t, "", "run", "-d", "busybox")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("dsec run -d = %q, %q, exit %d", out, errOut, code)
	}
	pid := p.Pid()

	// A second up on the same state dir, in the foreground and with -d.
	want := fmt.Sprintf("dsec is already running (pid %d, API at %s): stop it with `dsec down`", pid, p.Addr)
	for _, d := range [][]string{nil, {"-d"}} {
		args := append([]string{"up", "--state-dir", p.StateDir, "--listen", freePort(t), "--cgroup-parent", p.CgroupParent, "--node", "e2e", "--sandboxfusion-listen="}, d...)
		b, err := exec.Command(p.Bin, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(b), want) {
			t.Errorf("second dsec up %v = %q, %v; want a failure saying %q", d, b, err, want)
		}
	}

	// --all without --yes and without a terminal refuses and does nothing.
	out, errOut, code = p.CLI(t, "yes\n", "down", "--all")
	if code != 2 || !strings.Contains(errOut, "--yes") {
		t.Errorf("dsec down --all without a terminal = %q, %q, exit %d; want exit 2 asking for --yes", out, errOut, code)
	}
	if p.Pid() == 0 || !healthy(p.Addr) {
		t.Fatal("dsec down --all without --yes stopped dsec up")
	}

	// down stops up; the sandbox keeps running under the keeper.
	out, errOut, code = p.CLI(t, "", "down")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("stopped dsec up (pid %d)", pid)) {
		t.Fatalf("dsec down = %q, %q, exit %d", out, errOut, code)
	}
	// down returns once up has exited.
	if err := p.Wait(t, 2*time.Second); err != nil {
		t.Errorf("dsec up after dsec down exited with %v; want a clean exit", err)
	}
	if !sandboxProcess(p.FullFootprint()) {
		t.Errorf("after dsec down no sandbox process is left; want the sandbox running: %v", p.FullFootprint())
	}
	out, errOut, code = p.CLI(t, "", "down")
	if code != 0 || !strings.Contains(out, "dsec is not running") {
		t.Errorf("dsec down with nothing running = %q, %q, exit %d; want exit 0 saying it is not running", out, errOut, code)
	}

	// The next up finds the sandbox.
	p.Start(t)
	out, errOut, code = p.CLI(t, "", "exec", id, "--", "echo", "still here")
	if code != 0 || strings.TrimSpace(out) != "still here" {
		t.Fatalf("exec after dsec down and up = %q, %q, exit %d", out, errOut, code)
	}

	// --all --yes leaves no sandbox, no keeper, no cgroup.
	kc := keeper.NewClient(p.StateDir)
	defer kc.Close()
	v, err := kc.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code = p.CLI(t, "", "down", "--all", "--yes")
	if code != 0 || !strings.Contains(out, "stopped the node keeper") {
		t.Fatalf("dsec down --all --yes = %q, %q, exit %d", out, errOut, code)
	}
	if err := p.Wait(t, 2*time.Second); err != nil {
		t.Errorf("dsec up after dsec down --all exited with %v", err)
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", v.Pid)); err == nil && !strings.Contains(string(st), ") Z ") {
		t.Errorf("the keeper (pid %d) still runs after dsec down --all: %s", v.Pid, st)
	}
	if left := p.FullFootprint(); len(left) > 0 {
		t.Errorf("left after dsec down --all: %v", left)
	}
}

// TestUpDetachedOtherServer: dsec up -d whose bind fails while another
// server answers /healthz on the port does not report "up".
func TestUpDetachedOtherServer(t *testing.T) {
	bin := testenv.DsecBinary(t)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer other.Close()
	dir, err := os.MkdirTemp("", "dsec-e2e-other-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	addr := strings.TrimPrefix(other.URL, "http://")
	b, err := exec.Command(bin, "up", "-d", "--state-dir", dir, "--listen", addr, "--cgroup-parent", "dsec-e2e-other", "--sandboxfusion-listen=").CombinedOutput()
	if err == nil || strings.Contains(string(b), "dsec is up") || !strings.Contains(string(b), "--listen") {
		t.Errorf("dsec up -d on a port another server answers = %q, %v; want a failure naming --listen", b, err)
	}
}

func healthy(addr string) bool {
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func sandboxProcess(footprint []string) bool {
	for _, s := range footprint {
		if s == "process in a sandbox cgroup" {
			return true
		}
	}
	return false
}
