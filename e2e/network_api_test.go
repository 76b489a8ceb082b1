package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/testenv"
)

// TestNetworkRulesPython is DSec's listing with its network rules, as
// written, through the Python SDK against the real binary: the sandbox is
// made with network_rules={"pypi": True, "npm": False}, has a link (an
// address and eth0) before run_container returns, and its policy reads back
// through the SDK and through `dsec net show`; `dsec net set -l` changes
// it while it runs, by label, and --merge adds to it; `dsec net log` runs.
// (The enforcement itself, pip against a fake index and npm refused, is the
// keeper's tests'.) Needs the keeper's /v1/network (branch net-proxy).
func TestNetworkRulesPython(t *testing.T) {
	python := requirePython(t)
	p := newPlatform(t)
	p.Busybox(t)
	env := pythonEnv(t, p)
	script := `
import asyncio, json, sys
from libdsec import DSecClient, DSecContainerRunArgs

async def main():
    client = DSecClient(); await client.open()
    args = DSecContainerRunArgs(container_image="busybox", memory_limit_mb=4096, cpu_cores_limit=4,
                                ttl_running_stop=300, network_rules={"pypi": True, "npm": False}, init_user="root",
                                labels={"e2e": "net"})
    sandbox = await client.run_container(args, timeout=120)
    result = await sandbox.run_shell("echo hello world; cat /sys/class/net/eth0/operstate")
    info = await sandbox.network()
    print(json.dumps({"id": sandbox.id, "stdout": result.stdout, "exit": result.exit_code,
                      "policy": info.policy, "address": info.address}))
    await client.close()

asyncio.run(main())
`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", script)
	cmd.Dir = filepath.Join(testenv.ModuleRoot(), "sdk", "python")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("the listing with network_rules: %v\n%s%s", err, out, stderr)
	}
	var got struct {
		ID, Stdout, Address string
		Exit                int
		Policy              struct {
			Mode  string
			Rules []map[string]any
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("the listing printed %q: %v", out, err)
	}
	t.Cleanup(func() { p.CLI(t, "", "rm", got.ID) })
	if !strings.HasPrefix(got.Stdout, "hello world\n") || got.Exit != 0 {
		t.Errorf("run_shell = %q, exit %d; want hello world and eth0's state", got.Stdout, got.Exit)
	}
	if got.Address == "" {
		t.Errorf("network().address is empty: the sandbox has no link")
	}
	if got.Policy.Mode != "rules" || len(got.Policy.Rules) != 2 || got.Policy.Rules[0]["service"] != "pypi" || got.Policy.Rules[1]["action"] != "deny" {
		t.Errorf("network().policy = %+v, want allow pypi, deny npm", got.Policy)
	}

	stdout, stderr, code := p.CLI(t, "", "net", "show", got.ID)
	if code != 0 || !strings.Contains(stdout, "allow=pypi,deny=npm") || !strings.Contains(stdout, got.Address) {
		t.Errorf("dsec net show: exit %d, %q %q", code, stdout, stderr)
	}
	stdout, stderr, code = p.CLI(t, "", "net", "set", "-l", "e2e=net", "--allow", "github")
	if code != 0 || stdout != got.ID+"\tallow=github\n" {
		t.Errorf("dsec net set -l e2e=net --allow github: exit %d, %q %q", code, stdout, stderr)
	}
	stdout, stderr, code = p.CLI(t, "", "net", "set", got.ID, "--merge", "--deny", "npm")
	if code != 0 || stdout != got.ID+"\tallow=github,deny=npm\n" {
		t.Errorf("dsec net set --merge --deny npm: exit %d, %q %q", code, stdout, stderr)
	}
	_, stderr, code = p.CLI(t, "", "net", "set", got.ID, "--allow", "pipy")
	if code != 125 || !strings.Contains(stderr, `rule 1 (allow "pipy")`) {
		t.Errorf("dsec net set --allow pipy: exit %d, %q; want the rule named", code, stderr)
	}
	if _, stderr, code = p.CLI(t, "", "net", "log", got.ID); code != 0 {
		t.Errorf("dsec net log: exit %d, %q", code, stderr)
	}
	// Another project's key sees nothing of it.
	other := p.ProjectKey(t, "other")
	_, stderr, code = p.CLI(t, "", "--api-key", other, "net", "show", got.ID)
	if code == 0 || !strings.Contains(stderr, "not found") {
		t.Errorf("dsec net show with another project's key: exit %d, %q; want not found", code, stderr)
	}
}
