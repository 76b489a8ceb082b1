package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// The pause tests need the node side of issue 15 (the container backend's
// sandbox.Pauser, the keeper's freeze and reclaim): until it is merged,
// the container backend refuses a pause with FailedPrecondition ("the
// container backend has no pause capability") and they fail at their
// first pause.

// TestPause drives pause and resume of real sandboxes through the Go SDK
// and the CLI: a paused sandbox's processes use no CPU and its state
// survives; every kind of request resumes it first (once, however many
// come together), Stats and Get do not; admission counts only what stayed
// resident; the paused TTL and idle_action pause; a key of another project
// can do nothing to it; deleting a paused sandbox leaves nothing.
func TestPause(t *testing.T) {
	portsAddr := freePort(t)
	p := newPlatform(t, func(p *platform) { p.PortsAddr = portsAddr })
	p.Busybox(t)
	admin := p.AdminKey(t)
	c := p.Client(t, admin)
	ctx := ctxT(t)
	before := p.Footprint()
	mk := func(t *testing.T, opts dsec.CreateOptions) *dsec.Sandbox {
		t.Helper()
		opts.Image = "busybox"
		if opts.Memory == 0 {
			opts.Memory = 64 << 20
		}
		sb, err := c.Create(ctx, opts)
		if err != nil {
			t.Fatalf("Create = %v", err)
		}
		t.Cleanup(func() { sb.Delete(context.Background()) })
		return sb
	}
	state := func(t *testing.T, id string) string {
		t.Helper()
		sb, err := c.Get(ctx, id)
		if err != nil {
			t.Fatalf("Get(%s) = %v", id, err)
		}
		return sb.State
	}

	t.Run("Frozen", func(t *testing.T) {
		sb := mk(t, dsec.CreateOptions{CPUs: 0.5})
		if _, err := sb.Shell(ctx, "echo kept > /tmp/state; echo 'while :; do :; done' > /tmp/spin.sh; sh /tmp/spin.sh >/dev/null 2>&1 &"); err != nil {
			t.Fatal(err)
		}
		res, err := sb.Pause(ctx)
		if err != nil {
			t.Fatalf("Pause = %v", err)
		}
		if res.State != dsec.StatePaused || res.Took <= 0 || sb.State != dsec.StatePaused {
			t.Errorf("Pause = %+v, want paused and the time it took", res)
		}
		got, err := c.Get(ctx, sb.ID)
		if err != nil || got.State != dsec.StatePaused || got.PausedAt.IsZero() || got.PausedExpiresAt.Sub(got.PausedAt) != 24*time.Hour || got.IdleExpiresAt != (time.Time{}) {
			t.Errorf("Get(paused) = %+v, %v; want paused, paused for 24h at most, no idle expiry", got, err)
		}
		// Its busy loop uses no CPU while paused; Stats does not resume it.
		st1, err := sb.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		st2, err := sb.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := st2.CPU - st1.CPU; d > 50*time.Millisecond {
			t.Errorf("a paused sandbox used %v of CPU in a second", d)
		}
		if s := state(t, sb.ID); s != dsec.StatePaused {
			t.Fatalf("after Stats and Get: %s, want paused", s)
		}
		again, err := sb.Pause(ctx)
		if err != nil || again.State != dsec.StatePaused || again.Took != 0 {
			t.Errorf("Pause of a paused sandbox = %+v, %v, want it as it is", again, err)
		}
		out, errOut, code := p.CLI(t, "", "ps")
		if code != 0 || !regexp.MustCompile(sb.ID+`\s+busybox:latest\s+paused\s+.*\s2[34]h paused\s`).MatchString(out) {
			t.Errorf("dsec ps: exit %d, %s %s; want %s paused with its paused TTL left", code, out, errOut, sb.ID)
		}
		// The next exec resumes it: state and processes are as they were.
		r, err := sb.Shell(ctx, "cat /tmp/state; ps | grep -c '[s]pin.sh'")
		if err != nil || string(r.Stdout) != "kept\n1\n" {
			t.Errorf("exec after the pause = %q, %v; want the file and the loop kept", r.Stdout, err)
		}
		st3, _ := sb.Stats(ctx)
		time.Sleep(500 * time.Millisecond)
		st4, _ := sb.Stats(ctx)
		if st4.CPU-st3.CPU < 50*time.Millisecond {
			t.Errorf("after its resume the loop used %v of CPU in half a second, want it running", st4.CPU-st3.CPU)
		}
	})

	t.Run("TransparentResume", func(t *testing.T) {
		sb := mk(t, dsec.CreateOptions{})
		if err := sb.WriteFile(ctx, "/www/index.html", []byte("page\n"), dsec.WithMakeParents()); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.ExecDetached(ctx, dsec.ExecRequest{Argv: []string{"busybox", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"}}); err != nil {
			t.Fatal(err)
		}
		long, err := sb.ExecDetached(ctx, dsec.ExecRequest{Shell: "for i in 1 2 3; do echo tick$i; sleep 0.2; done"})
		if err != nil {
			t.Fatal(err)
		}
		var tarball bytes.Buffer
		ops := []struct {
			name string
			do   func() error
		}{
			{"exec", func() error { _, err := sb.Shell(ctx, "true"); return err }},
			{"session", func() error { _, err := sb.Session("main").Run(ctx, "cd /tmp"); return err }},
			{"read", func() error { _, err := sb.ReadFile(ctx, "/www/index.html"); return err }},
			{"write", func() error { return sb.WriteFile(ctx, "/tmp/w", []byte("x")) }},
			{"stat", func() error { _, err := sb.Stat(ctx, "/tmp/w"); return err }},
			{"list", func() error { _, _, err := sb.ListDir(ctx, "/tmp"); return err }},
			{"mkdir", func() error { return sb.MakeDir(ctx, "/tmp/d") }},
			{"mv", func() error { return sb.Rename(ctx, "/tmp/w", "/tmp/d/w", false) }},
			{"tar out", func() error { tarball.Reset(); return sb.DownloadTar(ctx, "/tmp/d", &tarball) }},
			{"rm", func() error { return sb.Remove(ctx, "/tmp/d", true) }},
			{"tar in", func() error { _, err := sb.UploadTar(ctx, "/tmp", bytes.NewReader(tarball.Bytes())); return err }},
			{"attach", func() error {
				var out bytes.Buffer
				_, err := sb.Attach(ctx, long, 0, 0, &out, io.Discard)
				if err == nil && out.String() != "tick1\ntick2\ntick3\n" {
					err = fmt.Errorf("attach read %q", out.String())
				}
				return err
			}},
			{"port", func() error {
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+portsAddr+"/"+sb.ID+"/8080/index.html", nil)
				req.Header.Set("Authorization", "Bearer "+admin)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 200 || string(body) != "page\n" {
					return fmt.Errorf("GET through the ports proxy = %d %q", resp.StatusCode, body)
				}
				return nil
			}},
		}
		for _, op := range ops {
			if _, err := sb.Pause(ctx); err != nil {
				t.Fatalf("Pause before %s = %v", op.name, err)
			}
			resumes := metricValue(t, p, `dsec_resume_duration_seconds_count{backend="container"}`)
			start := time.Now()
			if err := op.do(); err != nil {
				t.Errorf("%s on a paused sandbox = %v, want it resumed and done", op.name, err)
			}
			if s := state(t, sb.ID); s != dsec.StateRunning {
				t.Errorf("after %s: %s, want running", op.name, s)
			}
			if n := metricValue(t, p, `dsec_resume_duration_seconds_count{backend="container"}`) - resumes; n != 1 {
				t.Errorf("%s resumed the sandbox %v times, want once", op.name, n)
			}
			t.Logf("%s on a paused sandbox took %v", op.name, time.Since(start).Round(time.Millisecond))
		}
	})

	t.Run("ConcurrentRequestsResumeOnce", func(t *testing.T) {
		sb := mk(t, dsec.CreateOptions{})
		if _, err := sb.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		resumes := metricValue(t, p, `dsec_resume_duration_seconds_count{backend="container"}`)
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := sb.Shell(ctx, fmt.Sprintf("echo %d", i))
				if err == nil && string(r.Stdout) != fmt.Sprintf("%d\n", i) {
					err = fmt.Errorf("exec %d printed %q", i, r.Stdout)
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		if n := metricValue(t, p, `dsec_resume_duration_seconds_count{backend="container"}`) - resumes; n != 1 {
			t.Errorf("16 execs at once resumed the sandbox %v times, want once", n)
		}
	})

	t.Run("SelectorAndAdmission", func(t *testing.T) {
		var ids []string
		for range 3 {
			ids = append(ids, mk(t, dsec.CreateOptions{Memory: 256 << 20, Labels: map[string]string{"job": "paused-job"}}).ID)
		}
		for _, id := range ids {
			// Something to push out.
			if _, err := c.Sandbox(id).Shell(ctx, "dd if=/dev/zero of=/tmp/x bs=1048576 count=64 2>/dev/null"); err != nil {
				t.Fatal(err)
			}
		}
		held := metricValue(t, p, "dsec_node_memory_committed_bytes")
		res, err := c.Pause(ctx, map[string]string{"job": "paused-job"})
		if err != nil || len(res) != 3 {
			t.Fatalf("Pause(job=paused-job) = %+v, %v", res, err)
		}
		var resident int64
		for _, r := range res {
			if r.Err != nil || r.State != dsec.StatePaused {
				t.Errorf("result %+v, want paused", r)
			}
			resident += r.Resident
		}
		if got, want := metricValue(t, p, "dsec_node_memory_committed_bytes"), held-3*(256<<20)+float64(resident); got != want {
			t.Errorf("admission holds %v after the pause, want %v (only what stayed resident: %d)", got, want, resident)
		}
		if got := metricValue(t, p, `dsec_sandboxes{backend="container",project="default",state="paused"}`); got < 3 {
			t.Errorf("dsec_sandboxes{state=paused} = %v, want at least 3", got)
		}
		out, _, code := p.CLI(t, "", "resume", "-l", "job=paused-job", "-o", "json")
		if code != 0 || strings.Count(out, `"STATE_RUNNING"`) != 3 {
			t.Errorf("dsec resume -l -o json: exit %d:\n%s", code, out)
		}
		if got := metricValue(t, p, "dsec_node_memory_committed_bytes"); got != held {
			t.Errorf("admission holds %v after the resume, want %v again", got, held)
		}
		for _, id := range ids {
			if r, err := c.Sandbox(id).Shell(ctx, "wc -c < /tmp/x"); err != nil || strings.TrimSpace(string(r.Stdout)) != "67108864" {
				t.Errorf("%s after pause and resume: %q, %v; want its 64 MiB kept", id, r.Stdout, err)
			}
		}
	})

	t.Run("HostileProject", func(t *testing.T) {
		sb := mk(t, dsec.CreateOptions{Labels: map[string]string{"job": "victim"}})
		if _, err := sb.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		mallory := p.Client(t, p.ProjectKey(t, "mallory"))
		forged := mallory.Sandbox(sb.ID)
		if _, err := forged.Resume(ctx); !errors.Is(err, dsec.ErrNotFound) {
			t.Errorf("mallory: Resume(admin's sandbox) = %v, want NotFound", err)
		}
		if _, err := forged.Shell(ctx, "true"); !errors.Is(err, dsec.ErrNotFound) {
			t.Errorf("mallory: exec in admin's paused sandbox = %v, want NotFound", err)
		}
		if res, err := mallory.Resume(ctx, map[string]string{"job": "victim"}); err != nil || len(res) != 0 {
			t.Errorf("mallory: Resume(job=victim) = %+v, %v, want nothing", res, err)
		}
		if s := state(t, sb.ID); s != dsec.StatePaused {
			t.Errorf("after mallory: %s, want paused", s)
		}
		if _, err := sb.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := forged.Pause(ctx); !errors.Is(err, dsec.ErrNotFound) {
			t.Errorf("mallory: Pause(admin's sandbox) = %v, want NotFound", err)
		}
		if res, err := mallory.Pause(ctx, map[string]string{"job": "victim"}); err != nil || len(res) != 0 {
			t.Errorf("mallory: Pause(job=victim) = %+v, %v, want nothing", res, err)
		}
		if s := state(t, sb.ID); s != dsec.StateRunning {
			t.Errorf("after mallory: %s, want running", s)
		}
	})

	t.Run("TTLs", func(t *testing.T) {
		w, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		events := make(chan dsec.Event, 64)
		go c.Watch(w, dsec.WatchOptions{Selector: map[string]string{"job": "ttl"}}, func(ev dsec.Event) error {
			events <- ev
			return nil
		})
		time.Sleep(200 * time.Millisecond)
		idle := mk(t, dsec.CreateOptions{IdleTTL: 2 * time.Second, IdleAction: dsec.IdlePause, Labels: map[string]string{"job": "ttl", "n": "idle"}})
		short := mk(t, dsec.CreateOptions{PausedTTL: 2 * time.Second, Labels: map[string]string{"job": "ttl", "n": "short"}})
		if _, err := short.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		seen := map[string][]string{}
		deadline := time.After(15 * time.Second)
		for len(seen[idle.ID]) < 1 || len(seen[short.ID]) < 2 {
			select {
			case ev := <-events:
				if ev.Type != dsec.EventCreated && ev.Sandbox != nil {
					seen[ev.Sandbox.ID] = append(seen[ev.Sandbox.ID], ev.Type)
				}
			case <-deadline:
				t.Fatalf("events after 15 s: %v; want the idle one paused, the short one paused and expired", seen)
			}
		}
		if got := seen[idle.ID]; got[0] != dsec.EventPaused {
			t.Errorf("events of the idle sandbox = %v, want paused (idle_action pause)", got)
		}
		if got := seen[short.ID]; got[0] != dsec.EventPaused || got[1] != dsec.EventTTLExpired {
			t.Errorf("events of the sandbox past its paused TTL = %v, want paused, ttl_expired", got)
		}
		if _, err := c.Get(ctx, short.ID); !errors.Is(err, dsec.ErrNotFound) {
			t.Errorf("Get(past its paused TTL) = %v, want NotFound", err)
		}
		if r, err := idle.Shell(ctx, "echo back"); err != nil || string(r.Stdout) != "back\n" {
			t.Errorf("exec in the idle-paused sandbox = %q, %v", r.Stdout, err)
		}
	})

	t.Run("DeletePaused", func(t *testing.T) {
		sb := mk(t, dsec.CreateOptions{})
		if _, err := sb.Shell(ctx, "sleep 1000 &"); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if out, errOut, code := p.CLI(t, "", "rm", sb.ID); code != 0 || strings.TrimSpace(out) != sb.ID {
			t.Errorf("dsec rm (paused) = %q %q, exit %d", out, errOut, code)
		}
	})

	t.Run("NothingLeft", func(t *testing.T) {
		// Every subtest's sandboxes were deleted when it ended.
		if list, err := c.List(ctx, nil); err != nil || len(list) != 0 {
			t.Errorf("sandboxes left: %d, %v", len(list), err)
		}
		if got := metricValue(t, p, "dsec_node_memory_committed_bytes"); got != 0 {
			t.Errorf("admission holds %v with no sandbox left", got)
		}
		if after := p.Footprint(); fmt.Sprint(before) != fmt.Sprint(after) {
			t.Errorf("the host differs after the paused sandboxes were deleted: before %v, after %v", before, after)
		}
	})
}

// TestPauseKill9Restart pauses 20 sandboxes, kills dsec up with SIGKILL,
// starts it again, then kills the keeper too: every sandbox is still
// paused, admission holds only what stayed resident, and each resumes on
// its next exec with its files and processes as they were.
func TestPauseKill9Restart(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	before := p.Footprint()
	sel := map[string]string{"job": "pause-restart"}
	res, err := c.BatchCreate(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Labels: sel}, 20)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("create: %v", r.Err)
		}
		if _, err := r.Sandbox.Shell(ctx, fmt.Sprintf("echo %d > /tmp/n; sleep 1000 &", i)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Sandbox.ID)
	}
	paused, err := c.Pause(ctx, sel)
	if err != nil || len(paused) != 20 {
		t.Fatalf("Pause(20) = %d results, %v", len(paused), err)
	}
	var resident int64
	for _, r := range paused {
		if r.Err != nil {
			t.Fatalf("pause %s: %v", r.ID, r.Err)
		}
		resident += r.Resident
	}
	check := func(when string) {
		t.Helper()
		list, err := c.List(ctx, sel)
		if err != nil || len(list) != 20 {
			t.Fatalf("%s: List = %d, %v; want 20", when, len(list), err)
		}
		for _, sb := range list {
			if sb.State != dsec.StatePaused {
				t.Errorf("%s: %s is %s (%s), want paused", when, sb.ID, sb.State, sb.Reason)
			}
		}
		if got := metricValue(t, p, "dsec_node_memory_committed_bytes"); got != float64(resident) {
			t.Errorf("%s: admission holds %v, want the %d resident", when, got, resident)
		}
	}

	p.Kill9(t)
	p.Start(t)
	c = p.Client(t, p.AdminKey(t))
	check("after kill -9 of dsec up")

	kc := keeper.NewClient(p.StateDir)
	v, err := kc.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Kill9(t)
	if err := syscall.Kill(v.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100 && syscall.Kill(v.Pid, 0) == nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	p.Start(t)
	c = p.Client(t, p.AdminKey(t))
	check("after kill -9 of dsec up and the keeper")

	for i, id := range ids {
		r, err := c.Sandbox(id).Shell(ctx, "cat /tmp/n && ps | grep -q '[s]leep 1000' && echo alive")
		if err != nil || string(r.Stdout) != fmt.Sprintf("%d\nalive\n", i) {
			t.Errorf("exec in %s after the restarts = %q, %v", id, r.Stdout, err)
		}
	}
	if got := metricValue(t, p, "dsec_node_memory_committed_bytes"); got != 20*(64<<20) {
		t.Errorf("after resuming all: admission holds %v, want 20 × 64 MiB", got)
	}
	if out, _, code := p.CLI(t, "", "rm", "-l", "job=pause-restart"); code != 0 || len(strings.Fields(out)) != 20 {
		t.Errorf("dsec rm -l = %q, exit %d", out, code)
	}
	// The killed keeper's processes are the host init's to reap.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && fmt.Sprint(p.Footprint()) != fmt.Sprint(before) {
		time.Sleep(200 * time.Millisecond)
	}
	if after := p.Footprint(); fmt.Sprint(before) != fmt.Sprint(after) {
		t.Errorf("the host differs after deleting: before %v, after %v", before, after)
	}
}

// metricValue reads one series of /metrics (its whole name with labels, as
// it is printed); a series that is not there is 0.
func metricValue(t *testing.T, p *platform, series string) float64 {
	t.Helper()
	resp, err := http.Get(p.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` ([0-9.e+-]+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	f, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatalf("%s %q: %v", series, m[1], err)
	}
	return f
}
