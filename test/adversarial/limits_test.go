package adversarial

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/testenv/platform"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Attacks on what the API accepts and shows (finding 9): a huge request
// body parsed, held and echoed whole in its error; the layer store readable
// by any local user; /metrics, which needs no key on loopback, naming every
// tenant's sandboxes. Protection: internal/reqlimit bounds every body
// (dsec up --max-request-size, 1 MiB for calls that carry no data) before
// it is read, apierr clips every error message and validation quotes
// request values in short prefixes; the blob store is 0700/0400, fixed at
// start-up; the edge's collector exports aggregates by project, backend and
// state, and series by sandbox ID only with --metrics-per-sandbox.

// upPid returns the pid of p's dsec up.
func upPid(t *testing.T, p *platform.Platform) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range procs {
		b, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) < 4 || args[1] != "up" {
			continue
		}
		for i := range args[:len(args)-1] {
			if args[i] == "--state-dir" && args[i+1] == p.StateDir {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(c)))
				return pid
			}
		}
	}
	t.Fatalf("no dsec up process for state dir %s", p.StateDir)
	return 0
}

// procRSS returns the resident memory of pid in bytes.
func procRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

// rawPost sends body to p's procedure (Connect, JSON) with key; without its
// length when chunked. It returns the status, the start of the response
// body, the response's length and how long it took.
func rawPost(t *testing.T, p *platform.Platform, key, proc string, body []byte, chunked bool) (int, string, int, time.Duration) {
	t.Helper()
	var r io.Reader = bytes.NewReader(body)
	if chunked {
		r = io.MultiReader(r)
	}
	req, err := http.NewRequestWithContext(Ctx(t, time.Minute), http.MethodPost, p.URL()+proc, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s (%d bytes) = %v", proc, len(body), err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b[:min(len(b), 300)]), len(b), time.Since(start)
}

// createBody is a Create request whose image name is n bytes.
func createBody(n int) []byte {
	return []byte(`{"image":"` + strings.Repeat("a", n) + `","labels":{"` + LabelKey + `":"big-body"}}`)
}

// TestBigBodyRefused: a 50 MB Create is refused at once, with a short
// error, and dsec up's memory does not grow with it; a request under the
// cap whose value is invalid is refused without echoing the value. It does
// not run in parallel: it measures dsec up's memory.
func TestBigBodyRefused(t *testing.T) {
	p := Env(t)
	key := p.AdminKey(t)
	pid := upPid(t, p)
	before := procRSS(t, pid)
	const create = "/dsec.sandbox.v1.SandboxService/Create"
	for _, chunked := range []bool{false, true} {
		code, start, n, took := rawPost(t, p, key, create, createBody(50<<20), chunked)
		if code != http.StatusTooManyRequests && code != http.StatusBadRequest {
			t.Errorf("Create of 50 MB (chunked %v) = HTTP %d %q, want 429 (resource_exhausted) or 400", chunked, code, start)
		}
		if n > 2048 || strings.Contains(start, strings.Repeat("a", 100)) {
			t.Errorf("Create of 50 MB (chunked %v): a %d-byte error that echoes the request (%.120q…)", chunked, n, start)
		}
		if took > 10*time.Second {
			t.Errorf("Create of 50 MB (chunked %v) took %v to refuse", chunked, took)
		}
		t.Logf("Create of 50 MB (chunked %v): HTTP %d in %v: %s", chunked, code, took, start)
	}
	// Through the SDK (Connect's binary protocol), a 50 MB image name.
	_, err := Admin(t).Create(Ctx(t, time.Minute), dsec.CreateOptions{Image: strings.Repeat("b", 50<<20)})
	if err == nil || len(err.Error()) > 2048 || !errors.Is(err, dsec.ErrResourceExhausted) && !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("SDK Create with a 50 MB image name = %.200v (%d bytes), want a short ResourceExhausted or InvalidArgument", err, len(fmt.Sprint(err)))
	}
	// Under the cap: refused as invalid, the value not echoed whole.
	code, start, n, _ := rawPost(t, p, key, create, createBody(900<<10), false)
	if code != http.StatusBadRequest || n > 2048 {
		t.Errorf("Create with a 900 KB image name = HTTP %d, a %d-byte error (%.120q…); want 400 with a short error", code, n, start)
	}
	after := procRSS(t, pid)
	t.Logf("dsec up RSS: %d KiB before, %d KiB after three 50 MB Creates and one of 900 KB (%+d KiB)", before>>10, after>>10, (after-before)>>10)
	if after-before > 16<<20 {
		t.Errorf("dsec up's RSS grew by %d MiB over 50 MB requests, want a few MiB at most", (after-before)>>20)
	}
	HostAlive(t)
}

// TestMetricsNoSandboxIDs: /metrics, open to every local user, shows
// aggregates but no sandbox's ID.
func TestMetricsNoSandboxIDs(t *testing.T) {
	p := Env(t)
	t.Parallel()
	sb := Shared(t)
	other := newSandbox(t, Intruder(t), dsec.CreateOptions{}, true) // another tenant's
	body := scrapeMetrics(t, p)
	for _, id := range []string{sb.ID, other.ID} {
		if strings.Contains(body, id) {
			t.Errorf("/metrics without a key names sandbox %s", id)
		}
	}
	if strings.Contains(body, `sandbox="`) {
		t.Errorf("/metrics has series labelled by sandbox")
	}
	for _, want := range []string{`dsec_sandboxes{backend="container",project="default",state="running"}`, `dsec_sandboxes_memory_limit_bytes{`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// scrapeMetrics returns p's /metrics, fetched without a key from loopback.
func scrapeMetrics(t *testing.T, p *platform.Platform) string {
	t.Helper()
	resp, err := http.Get(p.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// asNobody runs name args as the user nobody and returns its output and
// error.
func asNobody(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// storeReadable lists what of p's layer store the user nobody can list or
// read.
func storeReadable(t *testing.T, p *platform.Platform) []string {
	t.Helper()
	store := filepath.Join(p.StateDir, "store")
	var blobs []string
	filepath.WalkDir(store, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			blobs = append(blobs, path)
		}
		return nil
	})
	if len(blobs) == 0 {
		t.Fatalf("no blobs under %s", store)
	}
	var readable []string
	for _, d := range []string{store, filepath.Join(store, "sha256")} {
		if out, err := asNobody(t, "ls", d); err == nil {
			readable = append(readable, fmt.Sprintf("ls %s: %q", d, out))
		}
	}
	for _, b := range blobs {
		if _, err := asNobody(t, "head", "-c", "16", b); err == nil {
			readable = append(readable, "read "+b)
		}
	}
	return readable
}

// TestStoreRootOnly: a local user (nobody) can neither list the layer
// store nor read a layer, though it knows the digests and the state dir
// lets it pass.
func TestStoreRootOnly(t *testing.T) {
	p := Env(t)
	t.Parallel()
	if out, err := asNobody(t, "true"); err != nil {
		t.Skipf("cannot run commands as nobody: %v %s", err, out)
	}
	if r := storeReadable(t, p); len(r) != 0 {
		t.Errorf("the user nobody can reach the layer store: %v", r)
	}
}

// TestLimitsFlags runs a platform of its own with --metrics-per-sandbox and
// --max-request-size 4M: /metrics then names sandboxes, a 5 MB body to a
// call that carries data is refused naming the flag, and a store that an
// older dsec left readable is made root's only at start-up.
func TestLimitsFlags(t *testing.T) {
	Env(t) // skips without root, like the rest
	t.Parallel()
	p := platform.New(t, "advlim", func(p *platform.Platform) {
		p.Extra = append(p.Extra, "--metrics-per-sandbox", "--max-request-size", "4M", "--warm-pool", "0")
	})
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	sb, err := c.Create(Ctx(t, time.Minute), dsec.CreateOptions{Image: "busybox", Memory: 64 << 20})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	defer func() {
		if err := sb.Delete(Ctx(t, time.Minute)); err != nil {
			t.Errorf("Delete = %v", err)
		}
	}()

	t.Run("MetricsPerSandbox", func(t *testing.T) {
		body := scrapeMetrics(t, p)
		if !strings.Contains(body, `sandbox="`+sb.ID+`"`) {
			t.Errorf("/metrics with --metrics-per-sandbox does not name sandbox %s", sb.ID)
		}
	})

	t.Run("MaxRequestSize", func(t *testing.T) {
		const stdin = "/dsec.sandbox.v1.SandboxService/WriteStdin"
		body := []byte(`{"sandboxId":"` + sb.ID + `","execId":"x","data":"` + strings.Repeat("QUFB", 5<<20/4) + `"}`)
		code, start, n, _ := rawPost(t, p, p.AdminKey(t), stdin, body, false)
		if code != http.StatusTooManyRequests || !strings.Contains(start, "--max-request-size") || n > 2048 {
			t.Errorf("WriteStdin of 5 MB under --max-request-size 4M = HTTP %d %q (%d bytes), want 429 naming the flag", code, start, n)
		}
	})

	t.Run("StoreFixedAtStart", func(t *testing.T) {
		if out, err := asNobody(t, "true"); err != nil {
			t.Skipf("cannot run commands as nobody: %v %s", err, out)
		}
		// What an older dsec made: everyone may list and read.
		p.Stop(t)
		store := filepath.Join(p.StateDir, "store")
		filepath.WalkDir(store, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() {
				os.Chmod(path, 0o755)
			} else {
				os.Chmod(path, 0o444)
			}
			return nil
		})
		if r := storeReadable(t, p); len(r) == 0 {
			t.Fatalf("the loosened store is not readable by nobody: the test cannot tell")
		}
		p.Start(t)
		if r := storeReadable(t, p); len(r) != 0 {
			t.Errorf("after a restart, the user nobody can still reach the layer store: %v", r)
		}
		// And the sandbox made before still answers.
		if _, err := sb.Shell(Ctx(t, time.Minute), "true"); err != nil {
			t.Errorf("the sandbox after the restart: %v", err)
		}
	})
}
