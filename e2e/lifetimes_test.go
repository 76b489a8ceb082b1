package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestLifetimes covers TTLs, idle TTLs, SetTimeout, idempotent and batch
// creates, watch events, metrics and admission on one platform.
func TestLifetimes(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	t.Run("Watch", func(t *testing.T) { testWatch(t, c) })
	t.Run("TTLs", func(t *testing.T) { testTTLs(t, c) })
	t.Run("Idempotency", func(t *testing.T) { testIdempotency(t, c) })
	t.Run("Batch100", func(t *testing.T) { testBatch(t, c) })
	t.Run("Admission", func(t *testing.T) { testAdmission(t, c) })
	t.Run("Reattach", func(t *testing.T) { testReattach(t, c) })
	t.Run("Metrics", func(t *testing.T) { testMetrics(t, p) })
}

func testTTLs(t *testing.T, c *dsec.Client) {
	ctx := ctxT(t)
	hard, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", TTL: 2 * time.Second, Labels: map[string]string{"job": "ttl"}})
	if err != nil {
		t.Fatal(err)
	}
	extended, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", TTL: 2 * time.Second, Labels: map[string]string{"job": "ttl"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := extended.SetTimeout(ctx, time.Minute, 0); err != nil {
		t.Fatalf("SetTimeout = %v", err)
	}
	idle, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", IdleTTL: 2 * time.Second, Labels: map[string]string{"job": "ttl"}})
	if err != nil {
		t.Fatal(err)
	}
	busy, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", IdleTTL: 2 * time.Second, Labels: map[string]string{"job": "ttl"}})
	if err != nil {
		t.Fatal(err)
	}
	// A detached command keeps busy from idling while it runs.
	if _, err := busy.ExecDetached(ctx, dsec.ExecRequest{Argv: []string{"sleep", "6"}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4500 * time.Millisecond)
	if _, err := c.Get(ctx, hard.ID); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("a sandbox past its 2s hard TTL: Get = %v, want NotFound", err)
	}
	if _, err := c.Get(ctx, idle.ID); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("a sandbox idle past its 2s idle TTL: Get = %v, want NotFound", err)
	}
	if _, err := c.Get(ctx, extended.ID); err != nil {
		t.Errorf("a sandbox whose TTL was extended: Get = %v, want it alive", err)
	}
	if _, err := c.Get(ctx, busy.ID); err != nil {
		t.Errorf("an idle-TTL sandbox running a command: Get = %v, want it alive", err)
	}
	// Once the command ends, busy idles out.
	time.Sleep(5 * time.Second)
	if _, err := c.Get(ctx, busy.ID); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("busy after its command ended and 2s idle: Get = %v, want NotFound", err)
	}
	if err := extended.SetTimeout(ctx, -time.Second, 0); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("SetTimeout(negative) = %v, want InvalidArgument", err)
	}
	_, _ = c.DeleteSelector(ctx, map[string]string{"job": "ttl"})
}

func testIdempotency(t *testing.T, c *dsec.Client) {
	ctx := ctxT(t)
	opts := dsec.CreateOptions{Image: "busybox", IdempotencyKey: "job-7-rollout-" + randHex(4), Labels: map[string]string{"job": "idem"}, Memory: 64 << 20}
	// A client that gives up mid-request, many times, then retries.
	for _, d := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond} {
		cctx, cancel := context.WithTimeout(ctx, d)
		_, _ = c.Create(cctx, opts)
		cancel()
	}
	a, err := c.Create(ctx, opts)
	if err != nil {
		t.Fatalf("retried Create = %v", err)
	}
	b, err := c.Create(ctx, opts)
	if err != nil || b.ID != a.ID {
		t.Fatalf("second retry = %v, %v; want the same sandbox %s", b, err, a.ID)
	}
	time.Sleep(500 * time.Millisecond) // let any abandoned create finish
	if l, _ := c.List(ctx, map[string]string{"job": "idem"}); len(l) != 1 {
		t.Errorf("after abandoned and retried creates %d sandboxes exist, want 1", len(l))
	}
	other := opts
	other.Memory = 128 << 20
	if _, err := c.Create(ctx, other); !errors.Is(err, dsec.ErrFailedPrecondition) {
		t.Errorf("same key, other request = %v, want FailedPrecondition", err)
	}
	// The key survives deletion: a retry then tells the sandbox is gone.
	if err := a.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if again, err := c.Create(ctx, opts); err != nil || again.ID != a.ID || again.State == dsec.StateRunning {
		t.Errorf("retry after delete = %+v, %v; want the same, deleted sandbox", again, err)
	}
}

func testBatch(t *testing.T, c *dsec.Client) {
	ctx := ctxT(t)
	start := time.Now()
	// 1 GiB disks: 100 of the default 10 GiB would need 32 GiB free on the
	// state dir's file system (disk overcommit 32), which a busy test
	// machine may not have.
	res, err := c.BatchCreate(ctx, dsec.CreateOptions{Image: "busybox", Memory: 16 << 20, Disk: 1 << 30, Labels: map[string]string{"job": "batch"}}, 100)
	if err != nil {
		t.Fatalf("BatchCreate = %v", err)
	}
	took := time.Since(start)
	ok := 0
	for i, r := range res {
		if r.Index != i {
			t.Errorf("result %d has index %d", i, r.Index)
		}
		if r.Err != nil {
			t.Errorf("item %d: %v", i, r.Err)
			continue
		}
		ok++
	}
	t.Logf("BatchCreate of 100 took %v", took)
	if ok != 100 {
		t.Fatalf("%d of 100 created", ok)
	}
	if r, err := res[57].Sandbox.Shell(ctx, "echo alive"); err != nil || string(r.Stdout) != "alive\n" {
		t.Errorf("exec in a batch sandbox = %v, %v", r, err)
	}
	deleted, err := c.DeleteSelector(ctx, map[string]string{"job": "batch"})
	if err != nil || len(deleted) != 100 {
		t.Errorf("DeleteSelector = %d, %v; want 100", len(deleted), err)
	}
	if _, err := c.BatchCreate(ctx, dsec.CreateOptions{Image: "busybox"}, 1001); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("BatchCreate(1001) = %v, want InvalidArgument", err)
	}
}

func testAdmission(t *testing.T, c *dsec.Client) {
	ctx := ctxT(t)
	// No node could ever give 1 PiB: no wait helps, none is hinted.
	_, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 1 << 50})
	var de *dsec.Error
	if !errors.Is(err, dsec.ErrInvalidArgument) || !errors.As(err, &de) || de.RetryAfter != 0 {
		t.Errorf("Create(1 PiB) = %v, want InvalidArgument without a retry hint", err)
	}
}

func testWatch(t *testing.T, c *dsec.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type seen struct{ typ, id string }
	var mu sync.Mutex
	var got []seen
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		once := sync.Once{}
		done <- c.Watch(ctx, dsec.WatchOptions{Selector: map[string]string{"job": "watch"}, Initial: true}, func(ev dsec.Event) error {
			once.Do(func() { close(ready) })
			mu.Lock()
			got = append(got, seen{ev.Type, ev.Sandbox.ID})
			mu.Unlock()
			return nil
		})
	}()
	// An existing sandbox is reported first (Initial), which tells the
	// watch is in place.
	first, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Labels: map[string]string{"job": "watch"}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 32 << 20, Labels: map[string]string{"job": "watch"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = sb.UpdateLabels(ctx, map[string]string{"phase": "2"})
	_, _ = sb.Shell(ctx, `x=$(head -c 100000000 /dev/zero | tr '\0' a)`) // OOM
	_ = sb.Delete(ctx)
	_ = first.Delete(ctx)
	want := []seen{{"created", sb.ID}, {"updated", sb.ID}, {"oom", sb.ID}, {"deleted", sb.ID}, {"deleted", first.ID}}
	deadline := time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		missing := []seen{}
		for _, w := range want {
			found := false
			for _, g := range got {
				found = found || g == w
			}
			if !found {
				missing = append(missing, w)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("events %v missing; got %v", missing, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Watch ended with %v", err)
	}
}

// testReattach kills a client mid-stream and attaches again from the
// offsets it had: the whole output arrives exactly once.
func testReattach(t *testing.T, c *dsec.Client) {
	ctx := ctxT(t)
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(context.Background())
	script := `for i in $(seq 1 40); do echo out$i; echo err$i >&2; sleep 0.05; done`
	var want, wantErr strings.Builder
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&want, "out%d\n", i)
		fmt.Fprintf(&wantErr, "err%d\n", i)
	}
	cctx, cancel := context.WithCancel(ctx)
	var out1, err1 cutWriter
	out1.after, out1.cancel = 30, cancel
	st, err := sb.ExecStream(cctx, dsec.ExecRequest{Shell: script}, &out1, &err1)
	if err == nil || st == nil || st.ExecID == "" {
		t.Fatalf("cut stream = %+v, %v; want an error with the exec ID", st, err)
	}
	var out2, err2 bytes.Buffer
	end, err := sb.Attach(ctx, st.ExecID, int64(out1.buf.Len()), int64(err1.buf.Len()), &out2, &err2)
	if err != nil || end.ExitCode != 0 {
		t.Fatalf("Attach = %+v, %v", end, err)
	}
	if got := out1.buf.String() + out2.String(); got != want.String() {
		t.Errorf("stdout before+after reattach = %q, want %q", got, want.String())
	}
	if got := err1.buf.String() + err2.String(); got != wantErr.String() {
		t.Errorf("stderr before+after reattach = %q", got)
	}
	if _, err := sb.Attach(ctx, "x-no-such-exec", 0, 0, io.Discard, io.Discard); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("Attach(unknown exec) = %v, want NotFound", err)
	}
	if _, err := sb.Attach(ctx, st.ExecID, 1<<30, 0, io.Discard, io.Discard); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("Attach past the end = %v, want InvalidArgument", err)
	}
}

// cutWriter cancels its stream once it has taken after bytes.
type cutWriter struct {
	buf    bytes.Buffer
	after  int
	cancel func()
}

func (w *cutWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	if w.cancel != nil && w.buf.Len() >= w.after {
		w.cancel()
		w.cancel = nil
	}
	return len(p), nil
}

func testMetrics(t *testing.T, p *platform) {
	resp, err := http.Get("http://" + p.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"dsec_sandboxes{", "dsec_create_duration_seconds_bucket", "dsec_api_errors_total{", "dsec_exec_start_duration_seconds"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestPurge checks dsec purge leaves nothing of a node with sandboxes.
func TestPurge(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	for range 3 {
		sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Shell(ctx, "sleep 1000 & echo x > /tmp/f"); err != nil {
			t.Fatal(err)
		}
	}
	if len(p.Footprint()) == 0 {
		t.Fatal("no footprint with 3 sandboxes: the check cannot fail")
	}
	out, err := exec.Command(p.Bin, "purge", "--yes", "--state-dir", p.StateDir).CombinedOutput()
	if err != nil {
		t.Fatalf("dsec purge = %v\n%s", err, out)
	}
	_ = p.Wait(t, 30*time.Second) // purge stopped it
	if left := p.FullFootprint(); len(left) > 0 {
		t.Errorf("after purge: %v", left)
	}
	if _, err := os.Stat(p.StateDir); !os.IsNotExist(err) {
		t.Errorf("state dir still exists after purge: %v", err)
	}
	if _, err := http.Get("http://" + p.Addr + "/healthz"); err == nil {
		t.Errorf("dsec up still answers after purge")
	}
	_ = os.MkdirAll(filepath.Dir(p.StateDir), 0o755)
}

// TestDoctor runs `dsec doctor` on this node: everything required passes.
func TestDoctor(t *testing.T) {
	p := newPlatform(t)
	out, err := exec.Command(p.Bin, "doctor", "--json", "--state-dir", p.StateDir, "--listen", p.Addr).Output()
	if err != nil {
		t.Fatalf("dsec doctor = %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"ok": true`) && !strings.Contains(string(out), `"OK": true`) && !strings.Contains(string(out), `"ok":true`) {
		t.Errorf("dsec doctor --json reports a failure:\n%s", out)
	}
}

// TestSigtermKeepsSandboxes stops dsec up with SIGTERM (as Ctrl-C would)
// and checks the sandbox and a running command survive the restart.
func TestSigtermKeepsSandboxes(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	x, err := sb.ExecDetached(ctx, dsec.ExecRequest{Shell: "sleep 2; echo finished"})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Signal(os.Interrupt)
	if err := p.Wait(t, time.Minute); err != nil {
		t.Errorf("dsec up after SIGINT exited with %v, want 0", err)
	}
	p.Start(t)
	c2 := p.Client(t, p.AdminKey(t))
	var out bytes.Buffer
	end, err := c2.Sandbox(sb.ID).Attach(ctx, x, 0, 0, &out, io.Discard)
	if err != nil || end.ExitCode != 0 || out.String() != "finished\n" {
		t.Errorf("after a clean restart the exec = %+v, %q, %v", end, out.String(), err)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Errorf("Delete after restart = %v", err)
	}
}
