package adversarial

import (
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Sealed execs (issue 12): a grader's command in a sandbox an agent
// controlled gets the honest result. Each attack is also run against an
// unsealed exec, where it works, so that each test can fail.

// sealedResult is a finished exec of the raw API.
type sealedResult struct {
	code           int
	stdout, stderr string
	sealed         bool
	timedOut       bool
	err            error
}

// rawExec runs req (its sandbox id set here) through the raw API client:
// the Go SDK may not have the sealed field.
func rawExec(t *testing.T, sb *dsec.Sandbox, req *sandboxv1.ExecRequest) sealedResult {
	t.Helper()
	p := Env(t)
	c := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, p.URL())
	req.SandboxId = sb.ID
	if req.Timeout == nil {
		req.Timeout = durationpb.New(30 * time.Second)
	}
	r := connect.NewRequest(req)
	r.Header().Set("Authorization", "Bearer "+p.AdminKey(t))
	stream, err := c.Exec(Ctx(t, time.Minute), r)
	if err != nil {
		return sealedResult{err: err}
	}
	defer stream.Close()
	var out sealedResult
	var stdout, stderr strings.Builder
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *sandboxv1.ExecResponse_Output:
			if ev.Output.GetStream() == sandboxv1.Stream_STREAM_STDERR {
				stderr.Write(ev.Output.GetData())
			} else {
				stdout.Write(ev.Output.GetData())
			}
		case *sandboxv1.ExecResponse_Exit:
			out.code = int(ev.Exit.GetExitCode())
			out.sealed = ev.Exit.GetSealed()
			out.timedOut = ev.Exit.GetTimedOut()
		}
	}
	out.stdout, out.stderr, out.err = stdout.String(), stderr.String(), stream.Err()
	return out
}

func sealedShell(t *testing.T, sb *dsec.Sandbox, seal sandboxv1.Seal, script string) sealedResult {
	t.Helper()
	r := rawExec(t, sb, &sandboxv1.ExecRequest{Shell: script, Sealed: seal})
	if r.err != nil {
		t.Fatalf("Exec(shell %q, sealed %v) = %v", script, seal, r.err)
	}
	if want := seal != sandboxv1.Seal_SEAL_UNSPECIFIED; r.sealed != want {
		t.Errorf("Exec(shell %q, sealed %v): exit's sealed = %v, want %v", script, seal, r.sealed, want)
	}
	return r
}

// TestSealedReplacedTools: the agent replaced /bin/sh, /bin/busybox and
// /usr/bin/python3 with programs that say the tests passed and planted
// /etc/ld.so.preload; a sealed shell command runs the platform's sh and
// tools, sees the image's own files under /.dsec/image and loads nothing
// the agent planted.
func TestSealedReplacedTools(t *testing.T) {
	sb := NewSandbox(t, dsec.CreateOptions{})
	// The real busybox stays reachable for the fakes as /opt/bb/sh (it
	// picks its applet by name).
	MustSh(t, sb, `set -e
mkdir -p /opt/bb /usr/bin
for a in sh mv cat; do cp /bin/busybox /opt/bb/$a; done
fake='#!/opt/bb/sh
echo "all tests passed"; exit 0'
for f in /usr/bin/python3 /bin/sh.new /bin/busybox.new; do printf '%s\n' "$fake" > $f; chmod 755 $f; done
echo /nonexistent/libgrade.so > /etc/ld.so.preload
ln -s /tmp /.dsec
/opt/bb/mv /bin/sh.new /bin/sh
/opt/bb/mv /bin/busybox.new /bin/busybox`)

	// The attack works on an unsealed exec.
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_UNSPECIFIED, "exit 3"); r.code != 0 || !strings.Contains(r.stdout, "all tests passed") {
		t.Fatalf("unsealed shell 'exit 3' after /bin/sh was replaced = exit %d, %q; want the fake's exit 0 (the attack does not work: fix the test)", r.code, r.stdout)
	}
	cases := []struct {
		name, script string
		code         int
		stdout       string
	}{
		{"shell", "exit 3", 3, ""},
		{"sandbox's user and pid namespaces", `[ "$(awk '{print $2}' /proc/self/uid_map)" != 0 ] && [ -e /proc/self/mountinfo ] && echo sandbox`, 0, "sandbox\n"},
		{"busybox on PATH", "busybox true && echo honest", 0, "honest\n"},
		{"sh on PATH", "sh -c 'exit 4'", 4, ""},
		{"image's sh", "chroot /.dsec/image /bin/sh -c 'exit 5'", 5, ""},
		{"image's python3", "chroot /.dsec/image python3 -c 'print(1)' 2>/dev/null; echo $?", 0, "127\n"},
		{"image view is read-only", "touch /.dsec/image/x 2>/dev/null || echo refused", 0, "refused\n"},
		{"tools are read-only", "echo x > /.dsec/bin/sh 2>/dev/null || echo refused", 0, "refused\n"},
		{"ld.so.preload", "wc -c < /etc/ld.so.preload", 0, "0\n"},
		{"LD_ variables", "env | grep '^LD_' || echo none", 0, "none\n"},
	}
	for _, c := range cases {
		r := rawExec(t, sb, &sandboxv1.ExecRequest{Shell: c.script, Sealed: sandboxv1.Seal_SEAL_FREEZE, Env: map[string]string{"LD_PRELOAD": "/nonexistent/libgrade.so"}})
		if r.err != nil {
			t.Errorf("%s: sealed Exec(%q) = %v", c.name, c.script, r.err)
			continue
		}
		if r.code != c.code || r.stdout != c.stdout || !r.sealed {
			t.Errorf("%s: sealed Exec(%q) = exit %d, stdout %q, stderr %q, sealed %v; want exit %d, %q, sealed", c.name, c.script, r.code, r.stdout, r.stderr, r.sealed, c.code, c.stdout)
		}
	}
	// Unsealed, the planted preload is there for the loader.
	if r := rawExec(t, sb, &sandboxv1.ExecRequest{Argv: []string{"/opt/bb/cat", "/etc/ld.so.preload"}}); r.stdout != "/nonexistent/libgrade.so\n" {
		t.Errorf("unsealed cat /etc/ld.so.preload = %q, %v; want the planted line", r.stdout, r.err)
	}
	// The sealed exec's mounts stay its own, and went nowhere the link
	// at /.dsec pointed.
	if r := rawExec(t, sb, &sandboxv1.ExecRequest{Argv: []string{"/opt/bb/sh", "-c", "ls /.dsec/bin /tmp/bin /tmp/image 2>/dev/null | wc -l; wc -c < /etc/ld.so.preload"}}); r.stdout != "0\n25\n" {
		t.Errorf("unsealed view after sealed execs: %q, %v; want no tools and the planted preload (0, 25)", r.stdout, r.err)
	}
}

// TestSealedFreezeAndThaw: while a sealed command runs, the agent's
// service is frozen; afterwards it runs again. SEAL_KILL kills it. An
// exec started beside a sealed one is refused.
func TestSealedFreezeAndThaw(t *testing.T) {
	sb := NewSandbox(t, dsec.CreateOptions{})
	MustSh(t, sb, `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/beat; usleep 10000; done' </dev/null >/dev/null 2>&1 &
mkdir -p /tmp/www && echo up > /tmp/www/index.html
setsid httpd -f -p 127.0.0.1:8080 -h /tmp/www </dev/null >/dev/null 2>&1 &
sleep 0.2`)
	const still = `a=$(cat /tmp/beat); sleep 0.3; b=$(cat /tmp/beat); [ "$a" = "$b" ] && echo still || echo moving`
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_UNSPECIFIED, still); r.stdout != "moving\n" {
		t.Fatalf("unsealed heartbeat check = %q, %q; want moving", r.stdout, r.stderr)
	}
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_FREEZE, still); r.stdout != "still\n" {
		t.Errorf("sealed heartbeat check = %q, %q; want still (the agent's loop frozen)", r.stdout, r.stderr)
	}
	// Thawed: the service runs and answers again.
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_UNSPECIFIED, still); r.stdout != "moving\n" {
		t.Errorf("heartbeat after a sealed exec = %q, %q; want moving (thawed)", r.stdout, r.stderr)
	}
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_UNSPECIFIED, "wget -q -O - http://127.0.0.1:8080/"); r.code != 0 || r.stdout != "up\n" {
		t.Errorf("the agent's server after a sealed exec: exit %d, %q, %q; want it to answer", r.code, r.stdout, r.stderr)
	}

	// Beside a running sealed exec, another exec is refused.
	started := make(chan sealedResult, 1)
	go func() {
		started <- rawExec(t, sb, &sandboxv1.ExecRequest{Shell: "sleep 2", Sealed: sandboxv1.Seal_SEAL_FREEZE})
	}()
	refused := false
	time.Sleep(500 * time.Millisecond) // the sealed exec has started
	for end := time.Now().Add(time.Second); time.Now().Before(end) && !refused; time.Sleep(20 * time.Millisecond) {
		r := rawExec(t, sb, &sandboxv1.ExecRequest{Argv: []string{"true"}})
		refused = connect.CodeOf(r.err) == connect.CodeFailedPrecondition
	}
	if !refused {
		t.Errorf("an exec beside a sealed one was never refused with FailedPrecondition")
	}
	if r := <-started; r.err != nil || r.code != 0 || !r.sealed {
		t.Errorf("sealed sleep 2 = exit %d, sealed %v, %v", r.code, r.sealed, r.err)
	}

	// A sealed exec that times out: what it left dies with it, and the
	// sandbox thaws.
	r := rawExec(t, sb, &sandboxv1.ExecRequest{Shell: "sleep 31 & sleep 32", Sealed: sandboxv1.Seal_SEAL_FREEZE, Timeout: durationpb.New(300 * time.Millisecond)})
	if r.err != nil || !r.timedOut || !r.sealed {
		t.Errorf("sealed exec past its timeout = %+v; want timed out, sealed", r)
	}
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_UNSPECIFIED, "ps -o args | grep -c '[s]leep 3'; "+still); r.stdout != "0\nmoving\n" {
		t.Errorf("after a sealed exec timed out: %q, %q; want no sleep left and the heartbeat moving", r.stdout, r.stderr)
	}

	// The journal says which ran sealed.
	p := Env(t)
	lr := connect.NewRequest(&sandboxv1.ListExecsRequest{SandboxId: sb.ID})
	lr.Header().Set("Authorization", "Bearer "+p.AdminKey(t))
	list, err := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, p.URL()).ListExecs(Ctx(t, time.Minute), lr)
	if err != nil {
		t.Fatalf("ListExecs = %v", err)
	}
	sealed := 0
	for _, x := range list.Msg.GetExecs() {
		if x.GetSealed() != x.GetExit().GetSealed() {
			t.Errorf("exec %s %q: journal sealed %v, exit sealed %v", x.GetExecId(), x.GetArgv(), x.GetSealed(), x.GetExit().GetSealed())
		}
		if x.GetSealed() {
			sealed++
			if x.GetArgv()[0] != "/.dsec/bin/sh" {
				t.Errorf("sealed exec %s ran %q, want /.dsec/bin/sh", x.GetExecId(), x.GetArgv())
			}
		}
	}
	if sealed != 3 {
		t.Errorf("ListExecs has %d sealed execs, want 3", sealed)
	}

	// SEAL_KILL: the agent's processes are gone, and stay gone.
	const agents = "ps -o args | grep -c -e '[h]ttpd' -e '[w]hile'; true"
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_FREEZE, agents); r.stdout == "0\n" {
		t.Errorf("the agent's processes seen by a sealed exec: %q, %q; want them there (frozen)", r.stdout, r.stderr)
	}
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_KILL, agents); r.stdout != "0\n" {
		t.Errorf("the agent's processes seen by a SEAL_KILL exec: %q, %q; want 0", r.stdout, r.stderr)
	}
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_UNSPECIFIED, still); r.stdout != "still\n" {
		t.Errorf("heartbeat after a SEAL_KILL exec = %q, %q; want still (killed)", r.stdout, r.stderr)
	}
}

// TestSealedPtraceHijack: a setsid process the agent left attaches to
// every new process of the grader's and forces exit 0; a sealed command
// is out of its reach (it is frozen) and keeps its own exit code.
func TestSealedPtraceHijack(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the hijacking probe rewrites amd64 registers")
	}
	sb := NewSandbox(t, dsec.CreateOptions{})
	InstallProbe(t, sb)
	MustSh(t, sb, `setsid probe hijack grademe 60 </dev/null >/tmp/hijack 2>&1 & sleep 0.2`)
	grade := []string{"/bin/busybox", "sh", "-c", "sleep 0.2; exit 7", "grademe"}
	if r := rawExec(t, sb, &sandboxv1.ExecRequest{Argv: grade}); r.err != nil || r.code != 0 {
		log := MustSh(t, sb, "cat /tmp/hijack")
		t.Fatalf("unsealed grade = exit %d, %v (hijacker: %q); want the forced exit 0 (the attack does not work: fix the test)", r.code, r.err, log)
	}
	r := rawExec(t, sb, &sandboxv1.ExecRequest{Argv: grade, Sealed: sandboxv1.Seal_SEAL_FREEZE})
	if r.err != nil || r.code != 7 || !r.sealed {
		t.Errorf("sealed grade = exit %d, sealed %v, %v; want exit 7, sealed", r.code, r.sealed, r.err)
	}
	// Were anything of the sandbox left running, the platform's tools are
	// not dumpable: a process of the same user cannot ptrace a sealed
	// command's sleep, as it can an unsealed one's.
	const traceShell = "sleep 5 & probe ptrace $! | head -1 | cut -d' ' -f2; kill -9 $!"
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_UNSPECIFIED, traceShell); r.stdout != "ok\n" {
		t.Errorf("ptrace of an unsealed command's sleep = %q, %q; want ok", r.stdout, r.stderr)
	}
	if r := sealedShell(t, sb, sandboxv1.Seal_SEAL_FREEZE, traceShell); r.stdout != "EPERM\n" {
		t.Errorf("ptrace of a sealed command's sleep = %q, %q; want EPERM", r.stdout, r.stderr)
	}

	// The hijacker runs again afterwards, and still works unsealed.
	if r := rawExec(t, sb, &sandboxv1.ExecRequest{Argv: grade}); r.err != nil || r.code != 0 {
		t.Errorf("unsealed grade after the sealed one = exit %d, %v; want the hijacker's exit 0 (thawed)", r.code, r.err)
	}
}

// TestSealedPrivateMount: the agent's own mount namespace with a tmpfs
// over the test directory does not reach a sealed command, which sees
// the sandbox's mounts as made at create.
func TestSealedPrivateMount(t *testing.T) {
	sb := NewSandbox(t, dsec.CreateOptions{})
	MustSh(t, sb, `mkdir -p /workspace && echo honest > /workspace/result`)
	r := Sh(t, sb, `setsid unshare -rm sh -c 'mount -t tmpfs none /workspace && echo forged > /workspace/result && touch /tmp/mounted && sleep 60' </dev/null >/tmp/unshare.log 2>&1 &
for i in $(seq 50); do [ -e /tmp/mounted ] && break; sleep 0.05; done; [ -e /tmp/mounted ] && echo mounted || cat /tmp/unshare.log`)
	if strings.TrimSpace(r.Stdout) != "mounted" {
		t.Logf("the sandbox cannot make a mount namespace of its own (%q): only the sealed view is checked", r.Stdout)
	}
	got := sealedShell(t, sb, sandboxv1.Seal_SEAL_FREEZE, "cat /workspace/result; grep -c ' /workspace ' /proc/self/mountinfo")
	if got.stdout != "honest\n0\n" {
		t.Errorf("sealed view of /workspace = %q, %q; want honest and no mount there", got.stdout, got.stderr)
	}
}
