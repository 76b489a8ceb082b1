package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestPlatform drives one dsec up through the SDK and the CLI.
func TestPlatform(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	admin := p.Client(t, p.AdminKey(t))
	t.Run("SDKLifecycle", func(t *testing.T) { testSDKLifecycle(t, p, admin) })
	t.Run("CLI", func(t *testing.T) { testCLI(t, p) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, p, admin) })
	t.Run("Projects", func(t *testing.T) { testProjects(t, p, admin) })
	t.Run("Protocols", func(t *testing.T) { testProtocols(t, p) })
	t.Run("BrokenUpload", func(t *testing.T) { testBrokenUpload(t, p, admin) })
	t.Run("ListDirLinks", func(t *testing.T) { testListDirLinks(t, p, admin) })
	t.Run("NothingLeft", func(t *testing.T) {
		if left := p.Footprint(); len(left) > 0 {
			t.Errorf("after the tests deleted their sandboxes, left: %v", left)
		}
	})
}

func testSDKLifecycle(t *testing.T, p *platform, c *dsec.Client) {
	ctx := ctxT(t)
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Labels: map[string]string{"job": "sdk", "n": "1"}, Memory: 128 << 20, Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	if sb.State != dsec.StateRunning || !strings.HasPrefix(sb.ID, "e2e-") || len(sb.ID) > 63 {
		t.Errorf("Create = %+v, want running with an ID naming node e2e", sb)
	}
	if sb.Resources.Memory != 128<<20 || sb.Resources.CPUs != 1 || sb.Resources.Pids != 4096 || sb.Resources.Disk != 10<<30 {
		t.Errorf("resources = %+v, want 128M and the defaults", sb.Resources)
	}
	if ttl := time.Until(sb.ExpiresAt); ttl < 59*time.Minute || ttl > time.Hour {
		t.Errorf("hard TTL left = %v, want the 1h default", ttl)
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.ID != sb.ID || got.Labels["job"] != "sdk" {
		t.Errorf("Get = %+v, %v", got, err)
	}
	r, err := sb.Shell(ctx, `echo "$GREETING $(hostname)"; echo oops >&2; exit 7`)
	if err != nil {
		t.Fatalf("Shell = %v", err)
	}
	if string(r.Stdout) != "hi "+sb.ID+"\n" || string(r.Stderr) != "oops\n" || r.ExitCode != 7 {
		t.Errorf("Shell = stdout %q stderr %q code %d", r.Stdout, r.Stderr, r.ExitCode)
	}
	// A large output streams in chunks.
	r, err = sb.Exec(ctx, []string{"sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x"})
	if err != nil || len(r.Stdout) != 3000000 {
		t.Errorf("3 MB of output: got %d bytes, %v", len(r.Stdout), err)
	}
	data := bytes.Repeat([]byte("dsec "), 300000)
	if err := sb.WriteFile(ctx, "/data/in.txt", data, dsec.WithMakeParents(), dsec.WithMode(0o600)); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	back, err := sb.ReadFile(ctx, "/data/in.txt")
	if err != nil || !bytes.Equal(back, data) {
		t.Errorf("ReadFile = %d bytes, %v; want the %d written", len(back), err, len(data))
	}
	r, _ = sb.Shell(ctx, "stat -c '%a %u' /data/in.txt && wc -c < /data/in.txt")
	if got := string(r.Stdout); got != fmt.Sprintf("600 0\n%d\n", len(data)) {
		t.Errorf("inside: %q", got)
	}
	sb2, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox:latest", Labels: map[string]string{"job": "sdk", "n": "2"}})
	if err != nil {
		t.Fatalf("second Create = %v", err)
	}
	list, err := c.List(ctx, map[string]string{"job": "sdk"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range list {
		ids = append(ids, s.ID)
	}
	want := []string{sb.ID, sb2.ID}
	if d := cmp.Diff(want, ids); d != "" {
		t.Errorf("List(job=sdk) (-want +got):\n%s", d)
	}
	if l, _ := c.List(ctx, map[string]string{"job": "sdk", "n": "2"}); len(l) != 1 || l[0].ID != sb2.ID {
		t.Errorf("List(job=sdk,n=2) = %v, want only %s", l, sb2.ID)
	}
	deleted, err := c.DeleteSelector(ctx, map[string]string{"job": "sdk"})
	sort.Strings(deleted)
	sort.Strings(want)
	if err != nil || !cmp.Equal(deleted, want) {
		t.Errorf("DeleteSelector = %v, %v, want %v", deleted, err, want)
	}
	if _, err := c.Get(ctx, sb.ID); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("Get after delete = %v, want NotFound", err)
	}
	if _, err := sb.Shell(ctx, "true"); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("exec after delete = %v, want NotFound", err)
	}
}

func testCLI(t *testing.T, p *platform) {
	out, errOut, code := p.CLI(t, "", "run", "busybox", "--", "sh", "-c", "echo hi; echo err >&2; exit 3")
	if out != "hi\n" || errOut != "err\n" || code != 3 {
		t.Errorf("dsec run = %q, %q, exit %d; want hi, err, 3", out, errOut, code)
	}
	_, _, code = p.CLI(t, "", "run", "busybox", "--", "sh", "-c", "kill -9 $$")
	if code != 128+9 {
		t.Errorf("dsec run of a command killed by SIGKILL exited %d, want 137", code)
	}
	out, _, code = p.CLI(t, "", "run", "-d", "--count", "2", "--label", "job=cli", "--memory", "64M", "busybox")
	ids := strings.Fields(out)
	if code != 0 || len(ids) != 2 {
		t.Fatalf("dsec run -d --count 2 = %q, exit %d", out, code)
	}
	out, _, _ = p.CLI(t, "", "ps", "-q", "-l", "job=cli")
	got := strings.Fields(out)
	sort.Strings(got)
	sort.Strings(ids)
	if !cmp.Equal(got, ids) {
		t.Errorf("dsec ps -q -l job=cli = %v, want %v", got, ids)
	}
	out, _, _ = p.CLI(t, "", "ps")
	if !strings.Contains(out, ids[0]) || !strings.Contains(out, "running") || !strings.Contains(out, "job=cli") {
		t.Errorf("dsec ps table lacks the sandbox:\n%s", out)
	}
	out, _, code = p.CLI(t, "", "ps", "-o", "json", "-l", "job=cli")
	// The API's JSON: its names, durations like "900s".
	if code != 0 || !strings.Contains(out, `"id": "`+ids[0]) || !regexp.MustCompile(`"idleTtl": "[0-9.]+s"`).MatchString(out) || strings.Contains(out, `"IdleTTL"`) {
		t.Errorf("dsec ps -o json = %s", out)
	}
	id := ids[0]
	out, errOut, code = p.CLI(t, "", "exec", id, "--", "no-such-tool", "--help")
	if code != 127 || !strings.Contains(errOut, "no-such-tool: command not found") {
		t.Errorf("exec of a missing command = %q, %q, exit %d; want 127 with a message", out, errOut, code)
	}
	out, _, code = p.CLI(t, "some input", "exec", "-i", "-e", "X=1", "-w", "/tmp", id, "--", "sh", "-c", "cat; echo \" $X $(pwd)\"")
	if out != "some input 1 /tmp\n" || code != 0 {
		t.Errorf("exec -i -e -w = %q, exit %d", out, code)
	}
	out, _, code = p.CLI(t, "", "exec", "-d", id, "--", "sh", "-c", "sleep 0.2; echo bg > /tmp/bg")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "x") {
		t.Errorf("exec -d = %q, exit %d; want an exec ID", out, code)
	}
	time.Sleep(500 * time.Millisecond)
	out, _, _ = p.CLI(t, "", "exec", id, "--", "cat", "/tmp/bg")
	if out != "bg\n" {
		t.Errorf("a detached exec's file = %q, want bg", out)
	}
	_, _, code = p.CLI(t, "", "exec", "--timeout", "200ms", id, "--", "sleep", "5")
	if code != 124 {
		t.Errorf("exec --timeout exited %d, want 124", code)
	}
	// Its journal entry: timed out, signal 9, no exit code, in the API's JSON.
	out, _, _ = p.CLI(t, "", "execs", "-o", "json", id)
	var execs []map[string]any
	if err := json.Unmarshal([]byte(out), &execs); err != nil || len(execs) == 0 {
		t.Fatalf("execs -o json = %q: %v", out, err)
	}
	if ex, _ := execs[len(execs)-1]["exit"].(map[string]any); ex["timedOut"] != true || ex["signal"] != float64(9) || ex["exitCode"] != nil {
		t.Errorf("a timed-out exec's exit = %v, want timedOut, signal 9 and no exitCode", ex)
	}
	// cp both ways, and to stdout.
	local := filepath.Join(t.TempDir(), "f.txt")
	if err := os.WriteFile(local, []byte("copied\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, e, code := p.CLI(t, "", "cp", local, id+":/work/f.txt"); code != 0 {
		t.Fatalf("cp in: %s", e)
	}
	out, _, _ = p.CLI(t, "", "exec", id, "--", "stat", "-c", "%a", "/work/f.txt")
	if out != "640\n" {
		t.Errorf("mode of the copied file = %q, want 640", out)
	}
	back := filepath.Join(t.TempDir(), "back.txt")
	if _, e, code := p.CLI(t, "", "cp", id+":/work/f.txt", back); code != 0 {
		t.Fatalf("cp out: %s", e)
	}
	if b, _ := os.ReadFile(back); string(b) != "copied\n" {
		t.Errorf("copied back %q", b)
	}
	out, _, _ = p.CLI(t, "", "cp", id+":/etc/hostname", "-")
	if out != "dsec\n" {
		t.Errorf("cp to stdout = %q", out)
	}
	out, _, code = p.CLI(t, "", "rm", "-l", "job=cli")
	got = strings.Fields(out)
	sort.Strings(got)
	if code != 0 || !cmp.Equal(got, ids) {
		t.Errorf("dsec rm -l job=cli = %v, exit %d; want %v", got, code, ids)
	}
	out, _, _ = p.CLI(t, "", "ps", "-q")
	if strings.TrimSpace(out) != "" {
		t.Errorf("dsec ps after rm = %q, want none", out)
	}
}

func testBadInput(t *testing.T, p *platform, c *dsec.Client) {
	ctx := ctxT(t)
	_, err := c.Create(ctx, dsec.CreateOptions{Image: "no-such-image:1"})
	if !errors.Is(err, dsec.ErrNotFound) || !strings.Contains(err.Error(), "dsec image build") {
		t.Errorf("Create(unknown image) = %v, want NotFound that says how to build one", err)
	}
	if _, err := c.Create(ctx, dsec.CreateOptions{Image: "Bad Name!"}); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("Create(bad name) = %v, want InvalidArgument", err)
	}
	if _, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Labels: map[string]string{"bad key!": "x"}}); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("Create(bad label) = %v, want InvalidArgument", err)
	}
	if _, err := c.Get(ctx, "e2e-aaaaaaaaaaaa"); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("Get(unknown) = %v, want NotFound", err)
	}
	if _, err := c.Get(ctx, "nonsense"); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("Get(not an ID) = %v, want InvalidArgument", err)
	}
	if _, err := c.Get(ctx, "other-aaaaaaaaaaaa"); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("Get(ID of an unknown node) = %v, want NotFound", err)
	}
	_, errOut, code := p.CLI(t, "", "run", "--memory", "12Q", "busybox", "--", "true")
	if code == 0 || !strings.Contains(errOut, "12Q") {
		t.Errorf("run --memory 12Q = %q, exit %d; want a message quoting the size", errOut, code)
	}
	wrong := p.Client(t, "dsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
	if _, err := wrong.List(ctx, nil); !errors.Is(err, dsec.ErrUnauthenticated) {
		t.Errorf("List with a wrong key = %v, want Unauthenticated", err)
	}
	// No key at all, over plain HTTP.
	resp, err := http.Post("http://"+p.Addr+"/dsec.sandbox.v1.SandboxService/List", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("List without a key: HTTP %d, want 401", resp.StatusCode)
	}
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Labels: map[string]string{"job": "bad"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(context.Background())
	if _, err := sb.Shell(ctx, "ln -s / /escape"); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/escape/etc/shadow", "../../../../etc/shadow"} {
		if _, err := sb.ReadFile(ctx, path); !errors.Is(err, dsec.ErrNotFound) && !errors.Is(err, dsec.ErrPermissionDenied) {
			t.Errorf("ReadFile(%s) = %v, want NotFound or PermissionDenied", path, err)
		}
	}
	for _, path := range []string{"/proc/kcore", "/proc/self/mem", "/proc/1/environ"} {
		if _, err := sb.ReadFile(ctx, path); !errors.Is(err, dsec.ErrPermissionDenied) && !errors.Is(err, dsec.ErrNotFound) {
			t.Errorf("ReadFile(%s) = %v, want PermissionDenied or NotFound", path, err)
		}
	}
	if _, err := sb.Exec(ctx, []string{"true"}, dsec.WithUser("nobody-here")); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("exec as an unknown user = %v, want InvalidArgument", err)
	}
	if _, err := sb.Exec(ctx, []string{"true"}, dsec.WithCwd("/no/such/dir")); !errors.Is(err, dsec.ErrFailedPrecondition) {
		t.Errorf("exec in a missing dir = %v, want FailedPrecondition", err)
	}
}

func testProjects(t *testing.T, p *platform, admin *dsec.Client) {
	ctx := ctxT(t)
	secretA, _, err := admin.CreateKey(ctx, dsec.KeyOptions{Name: "a", Project: "team-a"})
	if err != nil {
		t.Fatalf("CreateKey = %v", err)
	}
	secretB, _, err := admin.CreateKey(ctx, dsec.KeyOptions{Name: "b", Project: "team-b"})
	if err != nil {
		t.Fatal(err)
	}
	a, b := p.Client(t, secretA), p.Client(t, secretB)
	if _, _, err := a.CreateKey(ctx, dsec.KeyOptions{Name: "x"}); !errors.Is(err, dsec.ErrPermissionDenied) {
		t.Errorf("CreateKey with a non-admin key = %v, want PermissionDenied", err)
	}
	sb, err := a.Create(ctx, dsec.CreateOptions{Image: "busybox"})
	if err != nil {
		t.Fatalf("Create as team-a = %v", err)
	}
	defer sb.Delete(context.Background())
	if sb.Project != "team-a" {
		t.Errorf("project = %q, want team-a", sb.Project)
	}
	if _, err := b.Get(ctx, sb.ID); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("team-b Get of team-a's sandbox = %v, want NotFound", err)
	}
	if err := b.Delete(ctx, sb.ID); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("team-b Delete of team-a's sandbox = %v, want NotFound", err)
	}
	if l, _ := b.List(ctx, nil); len(l) != 0 {
		t.Errorf("team-b List = %d sandboxes, want 0", len(l))
	}
	if l, _ := admin.List(ctx, nil); len(l) != 1 {
		t.Errorf("admin List = %d sandboxes, want 1", len(l))
	}
	// The CLI's `key create` prints a working key.
	out, _, code := p.CLI(t, "", "key", "create", "--project", "team-a")
	if code != 0 || !strings.HasPrefix(out, "dsk_") {
		t.Fatalf("dsec key create = %q, exit %d", out, code)
	}
	if l, err := p.Client(t, strings.TrimSpace(out)).List(ctx, nil); err != nil || len(l) != 1 {
		t.Errorf("List with the CLI-made key = %v, %v; want team-a's sandbox", l, err)
	}
}

// TestKill9Restart kills dsec up while 20 sandboxes run and 5 execs
// stream, restarts it, and checks every exec can be attached and finishes
// with its whole output, every sandbox works, and `dsec rm -l` then leaves
// nothing behind.
func TestKill9Restart(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	before := p.Footprint()
	res, err := c.BatchCreate(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Labels: map[string]string{"job": "restart"}}, 20)
	if err != nil {
		t.Fatal(err)
	}
	var sbs []*dsec.Sandbox
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("create: %v", r.Err)
		}
		sbs = append(sbs, r.Sandbox)
	}
	for i, sb := range sbs {
		if _, err := sb.Shell(ctx, fmt.Sprintf("echo %d > /tmp/n; sleep 1000 &", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Five streaming execs, cut by the kill.
	const lines = 60
	script := fmt.Sprintf("for i in $(seq 1 %d); do echo line$i; sleep 0.05; done", lines)
	type stream struct {
		sb  *dsec.Sandbox
		out bytes.Buffer
		st  *dsec.ExitStatus
		err error
	}
	streams := make([]*stream, 5)
	var wg sync.WaitGroup
	for i := range streams {
		s := &stream{sb: sbs[i]}
		streams[i] = s
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.st, s.err = s.sb.ExecStream(ctx, dsec.ExecRequest{Shell: script}, &s.out, io.Discard)
		}()
	}
	time.Sleep(800 * time.Millisecond)
	p.Kill9(t)
	wg.Wait()
	p.Start(t)
	c2 := p.Client(t, p.AdminKey(t))
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line%d\n", i)
	}
	for i, s := range streams {
		if s.err == nil {
			t.Errorf("stream %d finished before the kill; the test is too slow to cut it", i)
			continue
		}
		if s.st == nil || s.st.ExecID == "" {
			t.Fatalf("stream %d broke without an exec ID: %v", i, s.err)
		}
		var rest bytes.Buffer
		end, err := c2.Sandbox(s.sb.ID).Attach(ctx, s.st.ExecID, int64(s.out.Len()), 0, &rest, io.Discard)
		if err != nil || end.ExitCode != 0 || end.Lost {
			t.Errorf("attach to exec %d after restart = %+v, %v", i, end, err)
			continue
		}
		if got := s.out.String() + rest.String(); got != want.String() {
			t.Errorf("exec %d output before+after = %d bytes, want %d exactly once", i, len(got), want.Len())
		}
	}
	list, err := c2.List(ctx, map[string]string{"job": "restart"})
	if err != nil || len(list) != 20 {
		t.Fatalf("after restart List = %d sandboxes, %v; want 20", len(list), err)
	}
	for _, sb := range list {
		if sb.State != dsec.StateRunning {
			t.Errorf("%s is %s (%s) after restart, want running", sb.ID, sb.State, sb.Reason)
		}
		r, err := sb.Shell(ctx, "cat /tmp/n && ps | grep -q '[s]leep 1000' && echo alive")
		if err != nil || !strings.HasSuffix(string(r.Stdout), "alive\n") {
			t.Errorf("exec in %s after restart = %q, %v", sb.ID, r.Stdout, err)
		}
	}
	out, _, code := p.CLI(t, "", "rm", "-l", "job=restart")
	if code != 0 || len(strings.Fields(out)) != 20 {
		t.Errorf("dsec rm -l job=restart = %q, exit %d; want 20 IDs", out, code)
	}
	after := p.Footprint()
	if d := cmp.Diff(before, after); d != "" {
		t.Errorf("after deleting the 20 sandboxes the host differs (-before +after):\n%s", d)
	}
}

// TestUpDetached checks `dsec up -d` returns once ready, and that a busy
// port fails start-up with a message naming the flag.
func TestUpDetached(t *testing.T) {
	p := newPlatform(t) // owns cleanup of a state dir; stopped and reused below
	p.Stop(t)
	cmd := exec.Command(p.Bin, "up", "-d", "--state-dir", p.StateDir, "--listen", p.Addr, "--cgroup-parent", p.CgroupParent, "--node", "e2e", "--sandboxfusion-listen=", "--ports-listen=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dsec is up at http://"+p.Addr) {
		t.Fatalf("dsec up -d = %q, %v", out, err)
	}
	resp, err := http.Get("http://" + p.Addr + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz after up -d = %v, %v", resp, err)
	}
	resp.Body.Close()
	// A second dsec up on the same port fails and says which flag.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	other, _ := os.MkdirTemp("", "dsec-e2e-busy-")
	defer os.RemoveAll(other)
	out, err = exec.Command(p.Bin, "up", "-d", "--state-dir", other, "--listen", ln.Addr().String(), "--cgroup-parent", p.CgroupParent+"x", "--sandboxfusion-listen=").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--listen") {
		t.Errorf("dsec up -d on a busy port = %q, %v; want a failure naming --listen", out, err)
	}
	// Stop the detached one with dsec down, which waits until it has exited.
	if b, err := exec.Command(p.Bin, "down", "--state-dir", p.StateDir).CombinedOutput(); err != nil || !strings.Contains(string(b), "stopped dsec up (pid ") {
		t.Errorf("dsec down after up -d = %q, %v", b, err)
	}
	if _, err := http.Get("http://" + p.Addr + "/healthz"); err == nil {
		t.Error("dsec up -d still answers after dsec down")
	}
}
