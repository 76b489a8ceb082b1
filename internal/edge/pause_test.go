package edge

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// Pause and resume on the pausing fake (pausefake_test.go): the state
// machine's every transition and crash point, admission, TTLs, the
// transparent resume of every operation, races and a hostile project.

func mustPause(t *testing.T, e *Edge, c Caller, id string) PauseResult {
	t.Helper()
	res, err := e.Pause(context.Background(), c, id, nil)
	if err != nil || len(res) != 1 {
		t.Fatalf("Pause(%s) = %+v, %v", id, res, err)
	}
	return res[0]
}

func mustResume(t *testing.T, e *Edge, c Caller, id string) PauseResult {
	t.Helper()
	res, err := e.Resume(context.Background(), c, id, nil)
	if err != nil || len(res) != 1 {
		t.Fatalf("Resume(%s) = %+v, %v", id, res, err)
	}
	return res[0]
}

// TestPauseResume: a pause stops the sandbox and records where its memory
// is (admission then holds only what stayed resident), a resume admits it
// again and makes it run; pausing a paused sandbox and resuming a running
// one report it as it is; watchers see paused and resumed.
func TestPauseResume(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	r := create(t, e, 64*testMiB)
	w := e.events.subscribe(admin, nil)
	defer e.events.unsubscribe(w)

	got := mustPause(t, e, admin, r.ID)
	want := PauseResult{ID: r.ID, State: StatePaused, Resident: 8 * testMiB, Swapped: 56 * testMiB}
	if diff := cmp.Diff(want, got, cmpTookSet); diff != "" {
		t.Errorf("Pause (-want +got):\n%s", diff)
	}
	if got.Took <= 0 {
		t.Errorf("Pause took %v, want the time it took", got.Took)
	}
	if !p.isPaused(r.ID) {
		t.Fatal("the backend has not paused the sandbox")
	}
	rec, _ := e.store.get(r.ID)
	if rec.State != StatePaused || rec.PausedAt.IsZero() || rec.TTLStopped.IsZero() {
		t.Errorf("record after pause: %s, paused at %v, TTL stopped %v", rec.State, rec.PausedAt, rec.TTLStopped)
	}
	wantHeld(t, e, 8*testMiB)

	again := mustPause(t, e, admin, r.ID)
	if again.State != StatePaused || again.Took != 0 || p.count("Pause") != 1 {
		t.Errorf("Pause of a paused sandbox = %+v (%d backend pauses), want it as it is, took 0, 1 pause", again, p.count("Pause"))
	}

	got = mustResume(t, e, admin, r.ID)
	if got.State != StateRunning || got.Took <= 0 || got.Resident != 32*testMiB {
		t.Errorf("Resume = %+v, want running, the time it took and where its memory is", got)
	}
	if p.isPaused(r.ID) {
		t.Error("the backend still has the sandbox paused")
	}
	wantHeld(t, e, 64*testMiB)
	rec, _ = e.store.get(r.ID)
	if rec.State != StateRunning || !rec.PausedAt.IsZero() || !rec.TTLStopped.IsZero() {
		t.Errorf("record after resume: %s, paused at %v, TTL stopped %v", rec.State, rec.PausedAt, rec.TTLStopped)
	}
	again = mustResume(t, e, admin, r.ID)
	if again.State != StateRunning || again.Took != 0 || p.count("Resume") != 1 {
		t.Errorf("Resume of a running sandbox = %+v (%d backend resumes), want it as it is", again, p.count("Resume"))
	}
	if got := drain(w); !slices.Equal(got, []string{"paused", "resumed"}) {
		t.Errorf("events = %v, want paused, resumed", got)
	}
	for _, name := range []string{"dsec_pause_duration_seconds", "dsec_resume_duration_seconds"} {
		if n := samples(t, e, name); n != 1 {
			t.Errorf("%s counts %d, want 1 (the no-ops are not latencies)", name, n)
		}
	}
}

// samples counts the observations of histogram name in e's metrics.
func samples(t *testing.T, e *Edge, name string) uint64 {
	t.Helper()
	mfs, err := e.cfg.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

var cmpTookSet = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Took" }, cmp.Ignore())

// TestPauseStates: what pause and resume do in each state; by selector,
// each sandbox's outcome is its own.
func TestPauseStates(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	mk := func(state string) *Record {
		r, err := e.Create(ctx, admin, CreateParams{Image: "busybox", Labels: map[string]string{"job": "j", "state": state}}, "")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	running, exited, paused := mk("running"), mk("exited"), mk("paused")
	n.node.Exit(exited.ID, "done")
	eventually(t, "exit recorded", func() bool { return state(e, exited.ID) == StateExited })
	mustPause(t, e, admin, paused.ID)

	if _, err := e.Pause(ctx, admin, exited.ID, nil); !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "exited (done)") {
		t.Errorf("Pause(exited) = %v, want FailedPrecondition saying it exited", err)
	}
	if _, err := e.Resume(ctx, admin, exited.ID, nil); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Resume(exited) = %v, want FailedPrecondition", err)
	}
	for _, tt := range []struct {
		what    string
		id      string
		sel     map[string]string
		wantErr error
	}{
		{"both", running.ID, map[string]string{"job": "j"}, errdefs.ErrInvalidArgument},
		{"neither", "", nil, errdefs.ErrInvalidArgument},
		{"unknown", "n-nosuchsandbx", nil, errdefs.ErrNotFound},
	} {
		if _, err := e.Pause(ctx, admin, tt.id, tt.sel); !errdefs.Is(err, tt.wantErr) {
			t.Errorf("Pause(%s) = %v, want %v", tt.what, err, tt.wantErr)
		}
		if _, err := e.Resume(ctx, admin, tt.id, tt.sel); !errdefs.Is(err, tt.wantErr) {
			t.Errorf("Resume(%s) = %v, want %v", tt.what, err, tt.wantErr)
		}
	}

	res, err := e.Pause(ctx, admin, "", map[string]string{"job": "j"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for i, r := range res {
		if i > 0 && res[i-1].ID >= r.ID {
			t.Errorf("results not in ID order: %s before %s", res[i-1].ID, r.ID)
		}
		switch {
		case r.Err != nil:
			got[r.ID] = "error: " + errdefs.Kind(r.Err).Error()
		default:
			got[r.ID] = string(r.State)
		}
	}
	want := map[string]string{running.ID: "paused", paused.ID: "paused", exited.ID: "error: " + errdefs.ErrFailedPrecondition.Error()}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Pause(job=j) (-want +got):\n%s", diff)
	}
	res, err = e.Resume(ctx, admin, "", map[string]string{"state": "paused"})
	if err != nil || len(res) != 1 || res[0].State != StateRunning {
		t.Errorf("Resume(state=paused) = %+v, %v, want the one sandbox running", res, err)
	}
}

// TestPauseLacksCapability: a backend without Pauser refuses pause (and
// the idle action that needs it) with FailedPrecondition naming both; a
// running sandbox there is resumed as it is.
func TestPauseLacksCapability(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	r := create(t, e, 64*testMiB)
	if _, err := e.Pause(ctx, admin, r.ID, nil); !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fake backend has no pause capability") {
		t.Errorf("Pause on a backend without pause = %v, want FailedPrecondition naming fake and pause", err)
	}
	if res, err := e.Resume(ctx, admin, r.ID, nil); err != nil || res[0].State != StateRunning {
		t.Errorf("Resume(running) on a backend without pause = %+v, %v, want it as it is", res, err)
	}
	if state(e, r.ID) != StateRunning {
		t.Errorf("state after a refused pause = %s, want running", state(e, r.ID))
	}
	_, err := e.Create(ctx, admin, CreateParams{Image: "busybox", IdleAction: IdlePause}, "")
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "pause capability") {
		t.Errorf("Create(idle_action pause) on a backend without pause = %v, want FailedPrecondition", err)
	}
	if _, err := e.SetTimeout(ctx, admin, r.ID, Timeouts{IdleAction: IdlePause}); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("SetTimeout(idle_action pause) on a backend without pause = %v, want FailedPrecondition", err)
	}
	for _, bad := range []string{"Pause", "sleep", "delete "} {
		if _, err := e.Create(ctx, admin, CreateParams{Image: "busybox", IdleAction: bad}, ""); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create(idle_action %q) = %v, want InvalidArgument", bad, err)
		}
		if _, err := e.SetTimeout(ctx, admin, r.ID, Timeouts{IdleAction: bad}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SetTimeout(idle_action %q) = %v, want InvalidArgument", bad, err)
		}
	}
	if _, err := e.Create(ctx, admin, CreateParams{Image: "busybox", PausedTTL: -time.Second}, ""); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Create(paused TTL -1s) = %v, want InvalidArgument", err)
	}
	wantHeld(t, e, 64*testMiB)
}

// TestPauseFailures: a pause the backend fails is undone (the sandbox runs
// on, and the backend was asked to make it run: it may have stopped part of
// it); one whose undoing fails too leaves the sandbox failed, never
// half-frozen; a resume the backend fails leaves it failed with the reason.
func TestPauseFailures(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	w := e.events.subscribe(admin, nil)
	defer e.events.unsubscribe(w)

	undone := create(t, e, 64*testMiB)
	p.set(func(p *pauseNode) { p.pauseErr, p.half = errdefs.Newf(errdefs.ErrInternal, "reclaim: EBUSY"), true })
	if _, err := e.Pause(ctx, admin, undone.ID, nil); err == nil || !strings.Contains(err.Error(), "EBUSY") || !strings.Contains(err.Error(), "runs on") {
		t.Errorf("Pause on a failing backend = %v, want its error and that the sandbox runs on", err)
	}
	if state(e, undone.ID) != StateRunning || p.isPaused(undone.ID) || p.count("Resume") != 1 {
		t.Errorf("after a failed pause: %s, backend paused %v, %d resumes; want running, not paused, 1 resume (the undo)",
			state(e, undone.ID), p.isPaused(undone.ID), p.count("Resume"))
	}

	broken := create(t, e, 64*testMiB)
	p.set(func(p *pauseNode) { p.resumeEr = errdefs.Newf(errdefs.ErrFailedPrecondition, "cgroup gone") })
	if _, err := e.Pause(ctx, admin, broken.ID, nil); err == nil || !strings.Contains(err.Error(), "failed now") {
		t.Errorf("Pause whose undo fails = %v, want the sandbox failed", err)
	}
	if r, _ := e.store.get(broken.ID); r.State != StateFailed || !strings.Contains(r.Reason, "cgroup gone") {
		t.Errorf("after a pause and its undo failed: %s (%s), want failed with the backend's reason", r.State, r.Reason)
	}

	p.set(func(p *pauseNode) { p.pauseErr, p.half = nil, false })
	resumeFails := create(t, e, 64*testMiB)
	mustPause(t, e, admin, resumeFails.ID)
	_, err := e.Resume(ctx, admin, resumeFails.ID, nil)
	if err == nil || !strings.Contains(err.Error(), "cgroup gone") {
		t.Errorf("Resume on a failing backend = %v, want its error", err)
	}
	if r, _ := e.store.get(resumeFails.ID); r.State != StateFailed || r.Reason != "its resume failed: cgroup gone" {
		t.Errorf("after a failed resume: %s (%s), want failed: its resume failed: cgroup gone", r.State, r.Reason)
	}
	// Failed sandboxes hold their limits until deleted; the failures are
	// events.
	wantHeld(t, e, 3*64*testMiB)
	if got := drain(w); !slices.Equal(got, []string{"created", "created", "failed", "created", "paused", "failed"}) {
		t.Errorf("events = %v", got)
	}
	for _, id := range []string{undone.ID, broken.ID, resumeFails.ID} {
		if err := e.Delete(ctx, admin, id); err != nil {
			t.Errorf("Delete = %v", err)
		}
	}
	wantHeld(t, e, 0)
}

// TestResumeAdmission: a paused sandbox's memory out of RAM is free for
// others; its resume admits it again or is refused (ResourceExhausted
// with a retry hint) and it stays paused, for an explicit resume and for
// a request that would resume it alike.
func TestResumeAdmission(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	big := create(t, e, 768*testMiB)
	if _, err := e.Create(ctx, admin, CreateParams{Image: "busybox", Resources: sandbox.Resources{MemoryBytes: 512 * testMiB}}, ""); !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("Create beyond capacity = %v, want ResourceExhausted", err)
	}
	mustPause(t, e, admin, big.ID) // 8 MiB stays resident
	wantHeld(t, e, 8*testMiB)
	other := create(t, e, 512*testMiB)

	_, err := e.Resume(ctx, admin, big.ID, nil)
	if d, ok := errdefs.RetryHint(err); !errdefs.Is(err, errdefs.ErrResourceExhausted) || !ok || d <= 0 || !strings.Contains(err.Error(), "stays paused") {
		t.Errorf("Resume without room = %v, want ResourceExhausted with a retry hint", err)
	}
	err = e.Exec(ctx, admin, ExecParams{Sandbox: big.ID, Argv: []string{"true"}}, func(ExecEvent) error { return nil })
	if !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("Exec on a paused sandbox without room = %v, want ResourceExhausted", err)
	}
	res, err := e.Resume(ctx, admin, "", map[string]string{})
	if !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Resume(empty selector) = %+v, %v, want InvalidArgument", res, err)
	}
	if state(e, big.ID) != StatePaused || !p.isPaused(big.ID) || p.count("Resume") != 0 {
		t.Errorf("after refused resumes: %s, backend paused %v, %d resumes; want paused and untouched", state(e, big.ID), p.isPaused(big.ID), p.count("Resume"))
	}
	wantHeld(t, e, (8+512)*testMiB)

	if err := e.Delete(ctx, admin, other.ID); err != nil {
		t.Fatal(err)
	}
	if got := mustResume(t, e, admin, big.ID); got.State != StateRunning {
		t.Errorf("Resume with room = %+v", got)
	}
	wantHeld(t, e, 768*testMiB)
}

// TestTransparentResume: every operation that needs a sandbox running
// resumes a paused one first, and succeeds; those that do not need it
// leave it paused.
func TestTransparentResume(t *testing.T) {
	n, p := newPauseNode(t)
	be := p.open()
	e := n.openPause(be)
	defer e.Close()
	ctx := context.Background()
	r := create(t, e, 64*testMiB)
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	tw.WriteHeader(&tar.Header{Name: "up.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("up"))
	tw.Close()
	// A running command for the calls on an exec.
	p.Run = func(spec sandbox.ExecSpec) (string, sandbox.ExitStatus, bool) {
		return "", sandbox.ExitStatus{}, spec.Argv[0] == "sleep"
	}
	var execID string
	if err := e.Exec(ctx, admin, ExecParams{Sandbox: r.ID, Argv: []string{"sleep"}, Detach: true}, func(ev ExecEvent) error {
		execID = ev.Started
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.WriteFile(ctx, admin, WriteParams{Sandbox: r.ID, Path: "/tmp/f", MakeParents: true}, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	noSend := func(ExecEvent) error { return nil }
	ops := []struct {
		name string
		do   func() error
	}{
		{"exec", func() error {
			return e.Exec(ctx, admin, ExecParams{Sandbox: r.ID, Argv: []string{"echo", "hi"}}, noSend)
		}},
		{"session command", func() error {
			return e.Exec(ctx, admin, ExecParams{Sandbox: r.ID, Shell: "cd /tmp", Session: "main"}, noSend)
		}},
		{"attach", func() error {
			actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			if err := e.Attach(actx, admin, r.ID, execID, 0, 0, noSend); !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			return nil
		}},
		{"write stdin", func() error { return e.WriteStdin(ctx, admin, r.ID, execID, []byte("x"), false) }},
		{"resize", func() error { return e.ResizeTTY(ctx, admin, r.ID, execID, 24, 80) }},
		{"read file", func() error {
			return e.ReadFile(ctx, admin, r.ID, "/tmp/f", 0, 0, func(*sandbox.FileInfo, []byte) error { return nil })
		}},
		{"write file", func() error {
			_, err := e.WriteFile(ctx, admin, WriteParams{Sandbox: r.ID, Path: "/tmp/g"}, strings.NewReader("y"))
			return err
		}},
		{"stat", func() error { _, err := e.Stat(ctx, admin, r.ID, "/tmp/f"); return err }},
		{"list", func() error { _, _, err := e.ListDir(ctx, admin, r.ID, "/tmp", 0); return err }},
		{"mkdir", func() error { _, err := e.MakeDir(ctx, admin, r.ID, "/tmp/d", 0, false, ""); return err }},
		{"mv", func() error { return e.Rename(ctx, admin, r.ID, "/tmp/g", "/tmp/h", false) }},
		{"rm", func() error { return e.Remove(ctx, admin, r.ID, "/tmp/h", false) }},
		{"tar out", func() error { return e.DownloadTar(ctx, admin, r.ID, "/tmp", io.Discard) }},
		{"tar in", func() error {
			_, err := e.UploadTar(ctx, admin, r.ID, "/tmp", false, "", bytes.NewReader(tarball.Bytes()))
			return err
		}},
		{"port", func() error {
			c, done, err := e.DialPort(ctx, admin, r.ID, 8080)
			if err == nil {
				c.Close()
				done()
			}
			return err
		}},
		{"delete session", func() error { return e.DeleteSession(ctx, admin, r.ID, "main") }},
		{"signal", func() error { return e.Signal(ctx, admin, r.ID, execID, 9) }},
	}
	for _, op := range ops {
		mustPause(t, e, admin, r.ID)
		before := p.count("Resume")
		if err := op.do(); err != nil {
			t.Errorf("%s on a paused sandbox = %v, want it resumed and done", op.name, err)
		}
		if state(e, r.ID) != StateRunning || p.isPaused(r.ID) || p.count("Resume") != before+1 {
			t.Errorf("%s on a paused sandbox: %s, backend paused %v, %d resumes; want it resumed once", op.name, state(e, r.ID), p.isPaused(r.ID), p.count("Resume")-before)
		}
	}

	// These do not need it running.
	mustPause(t, e, admin, r.ID)
	if got, err := e.Get(ctx, admin, r.ID); err != nil || got.State != StatePaused {
		t.Errorf("Get(paused) = %+v, %v", got, err)
	}
	if l, err := e.List(ctx, admin, nil); err != nil || len(l) != 1 || l[0].State != StatePaused {
		t.Errorf("List = %+v, %v", l, err)
	}
	if _, _, err := e.Stats(ctx, admin, r.ID); err != nil {
		t.Errorf("Stats(paused) = %v", err)
	}
	if _, err := e.ListExecs(ctx, admin, r.ID); err != nil {
		t.Errorf("ListExecs(paused) = %v", err)
	}
	if _, err := e.ListSessions(ctx, admin, r.ID); err != nil {
		t.Errorf("ListSessions(paused) = %v", err)
	}
	hour := time.Hour
	if _, err := e.SetTimeout(ctx, admin, r.ID, Timeouts{IdleTTL: &hour}); err != nil {
		t.Errorf("SetTimeout(paused) = %v", err)
	}
	if _, err := e.UpdateLabels(ctx, admin, r.ID, map[string]string{"a": "b"}, nil); err != nil {
		t.Errorf("UpdateLabels(paused) = %v", err)
	}
	if _, err := e.GetNetwork(ctx, admin, r.ID); err != nil {
		t.Errorf("GetNetwork(paused) = %v", err)
	}
	if state(e, r.ID) != StatePaused || !p.isPaused(r.ID) {
		t.Errorf("after Get, List, Stats, ListExecs, ListSessions, SetTimeout, UpdateLabels, GetNetwork: %s, want still paused", state(e, r.ID))
	}
}

// TestConcurrentRequestsResumeOnce: requests that come together to a
// paused sandbox resume it once, and all succeed.
func TestConcurrentRequestsResumeOnce(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	r := create(t, e, 64*testMiB)
	mustPause(t, e, admin, r.ID)
	block := make(chan struct{})
	entered := make(chan string, 64)
	p.set(func(p *pauseNode) { p.block, p.entered = block, entered })
	const reqs = 20
	errs := make(chan error, reqs)
	for i := range reqs {
		go func() {
			if i%2 == 0 {
				errs <- e.Exec(ctx, admin, ExecParams{Sandbox: r.ID, Argv: []string{"echo", fmt.Sprint(i)}}, func(ExecEvent) error { return nil })
				return
			}
			_, err := e.Stat(ctx, admin, r.ID, "/etc/passwd")
			errs <- err
		}()
	}
	if got := <-entered; got != "Resume "+r.ID {
		t.Fatalf("backend call = %s, want the resume", got)
	}
	time.Sleep(50 * time.Millisecond) // the others wait
	close(block)
	for range reqs {
		if err := <-errs; err != nil {
			t.Errorf("a request to the paused sandbox = %v", err)
		}
	}
	if c := p.count("Resume"); c != 1 {
		t.Errorf("backend resumes = %d, want 1", c)
	}
}

// TestPauseRacesRequests: a pause waits for the operations being started
// on its sandbox; a request that comes during a pause waits for it and
// then resumes the sandbox; a request never reaches a paused backend.
func TestPauseRacesRequests(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	r := create(t, e, 64*testMiB)

	// An exec being started holds the pause back until it has started.
	inStart, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.set(func(p *pauseNode) {
		p.startHook = func(string) {
			once.Do(func() {
				close(inStart)
				<-release
			})
		}
	})
	execDone := make(chan error, 1)
	go func() {
		execDone <- e.Exec(ctx, admin, ExecParams{Sandbox: r.ID, Argv: []string{"true"}}, func(ExecEvent) error { return nil })
	}()
	<-inStart
	pauseDone := make(chan error, 1)
	go func() {
		_, err := e.Pause(ctx, admin, r.ID, nil)
		pauseDone <- err
	}()
	select {
	case err := <-pauseDone:
		t.Fatalf("Pause returned (%v) while an exec was being started", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-execDone; err != nil {
		t.Errorf("the exec started before the pause = %v", err)
	}
	if err := <-pauseDone; err != nil {
		t.Errorf("Pause after the exec started = %v", err)
	}

	// A request during a pause waits for it, then resumes.
	mustResume(t, e, admin, r.ID)
	block := make(chan struct{})
	entered := make(chan string, 4)
	p.set(func(p *pauseNode) { p.block, p.entered, p.startHook = block, entered, nil })
	go func() {
		_, err := e.Pause(ctx, admin, r.ID, nil)
		pauseDone <- err
	}()
	<-entered // the pause is in the backend
	go func() {
		execDone <- e.Exec(ctx, admin, ExecParams{Sandbox: r.ID, Argv: []string{"true"}}, func(ExecEvent) error { return nil })
	}()
	time.Sleep(30 * time.Millisecond)
	close(block)
	if err := <-pauseDone; err != nil {
		t.Errorf("Pause = %v", err)
	}
	<-entered // the exec's resume
	if err := <-execDone; err != nil {
		t.Errorf("an exec that came during a pause = %v, want it to resume the sandbox and run", err)
	}
	if state(e, r.ID) != StateRunning {
		t.Errorf("after the exec: %s, want running", state(e, r.ID))
	}
}

// TestDeletePaused: a paused sandbox is deleted as it is (not resumed) and
// gives back all it held; a delete during a pause waits for it; a resume
// of a sandbox being deleted finds it gone.
func TestDeletePaused(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	w := e.events.subscribe(admin, nil)
	defer e.events.unsubscribe(w)
	a := create(t, e, 64*testMiB)
	mustPause(t, e, admin, a.ID)
	if err := e.Delete(ctx, admin, a.ID); err != nil {
		t.Fatalf("Delete(paused) = %v", err)
	}
	if p.count("Resume") != 0 || len(n.node.IDs()) != 0 {
		t.Errorf("after deleting a paused sandbox: %d resumes, backend has %v; want none", p.count("Resume"), n.node.IDs())
	}
	wantHeld(t, e, 0)
	if got := drain(w); !slices.Equal(got, []string{"created", "paused", "deleted"}) {
		t.Errorf("events = %v", got)
	}

	b := create(t, e, 64*testMiB)
	block := make(chan struct{})
	entered := make(chan string, 4)
	p.set(func(p *pauseNode) { p.block, p.entered = block, entered })
	pauseDone := make(chan error, 1)
	go func() {
		_, err := e.Pause(ctx, admin, b.ID, nil)
		pauseDone <- err
	}()
	<-entered
	delDone := make(chan error, 1)
	go func() { delDone <- e.Delete(ctx, admin, b.ID) }()
	select {
	case err := <-delDone:
		t.Fatalf("Delete returned (%v) during a pause", err)
	case <-time.After(30 * time.Millisecond):
	}
	// A resume queued behind the delete finds the sandbox gone.
	resDone := make(chan error, 1)
	go func() {
		time.Sleep(10 * time.Millisecond)
		_, err := e.Resume(ctx, admin, b.ID, nil)
		resDone <- err
	}()
	close(block)
	if err := <-pauseDone; err != nil {
		t.Errorf("Pause = %v", err)
	}
	if err := <-delDone; err != nil {
		t.Errorf("Delete after the pause = %v", err)
	}
	if err := <-resDone; !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Resume of a sandbox being deleted = %v, want NotFound", err)
	}
	if p.count("Resume") != 0 {
		t.Errorf("%d resumes, want none", p.count("Resume"))
	}
	wantHeld(t, e, 0)
}

// TestPausedTTLs: paused time counts against neither the hard nor the
// idle TTL; the paused TTL deletes a sandbox paused too long
// (ttl_expired); SetTimeout's paused TTL counts from the pause and its
// hard TTL, while paused, from the resume.
func TestPausedTTLs(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	w := e.events.subscribe(admin, nil)
	defer e.events.unsubscribe(w)
	r, err := e.Create(ctx, admin, CreateParams{Image: "busybox", TTL: time.Hour, IdleTTL: time.Minute, PausedTTL: 3 * time.Hour}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustPause(t, e, admin, r.ID)
	now := time.Now()
	e.reap(now.Add(2 * time.Hour)) // past the hard and idle TTLs
	if state(e, r.ID) != StatePaused {
		t.Fatalf("a sandbox paused past its hard and idle TTLs: %s, want paused", state(e, r.ID))
	}
	rec, _ := e.store.get(r.ID)
	pb := e.toProto(rec)
	if pb.GetState() != sandboxv1.State_STATE_PAUSED || pb.GetPausedAt() == nil || pb.GetIdleExpiresAt() != nil ||
		!pb.GetPausedExpiresAt().AsTime().Equal(rec.PausedAt.Add(3*time.Hour)) || pb.GetPausedTtl().AsDuration() != 3*time.Hour || pb.GetIdleAction() != "delete" {
		t.Errorf("paused sandbox in the API = %v", pb)
	}
	// While paused, a new hard TTL counts from the resume.
	ttl, paused := 2*time.Hour, time.Hour
	if _, err := e.SetTimeout(ctx, admin, r.ID, Timeouts{TTL: &ttl, PausedTTL: &paused}); err != nil {
		t.Fatal(err)
	}
	rec, _ = e.store.get(r.ID)
	if got := pausedExpiry(rec, 0); !got.Equal(rec.PausedAt.Add(time.Hour)) {
		t.Errorf("paused expiry after SetTimeout = %v, want the pause + 1h", got)
	}
	time.Sleep(20 * time.Millisecond)
	mustResume(t, e, admin, r.ID)
	rec, _ = e.store.get(r.ID)
	if left := time.Until(rec.ExpiresAt); left < 2*time.Hour-time.Second || left > 2*time.Hour {
		t.Errorf("hard TTL left after the resume = %v, want 2h", left)
	}

	// The paused TTL ends a sandbox paused too long.
	mustPause(t, e, admin, r.ID)
	e.reap(time.Now().Add(59 * time.Minute))
	if state(e, r.ID) != StatePaused {
		t.Fatalf("59 min into a paused TTL of 1h: %s", state(e, r.ID))
	}
	e.reap(time.Now().Add(61 * time.Minute))
	if state(e, r.ID) != StateDeleted || len(n.node.IDs()) != 0 {
		t.Errorf("past its paused TTL: %s, backend %v; want deleted", state(e, r.ID), n.node.IDs())
	}
	if got := drain(w); !slices.Equal(got, []string{"created", "paused", "updated", "resumed", "paused", "ttl_expired"}) {
		t.Errorf("events = %v", got)
	}
	wantHeld(t, e, 0)
}

// TestIdleActionPause: with idle_action pause, an idle TTL that runs out
// pauses the sandbox instead of deleting it; the next request resumes it
// and the idle TTL counts from there. SetTimeout switches the action.
func TestIdleActionPause(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	keep, err := e.Create(ctx, admin, CreateParams{Image: "busybox", IdleTTL: time.Minute, IdleAction: IdlePause}, "")
	if err != nil {
		t.Fatal(err)
	}
	drop, err := e.Create(ctx, admin, CreateParams{Image: "busybox", IdleTTL: time.Minute, IdleAction: IdleDelete}, "")
	if err != nil {
		t.Fatal(err)
	}
	if keep.IdleAction != IdlePause || drop.IdleAction != "" {
		t.Errorf("idle actions stored: %q, %q", keep.IdleAction, drop.IdleAction)
	}
	e.reap(time.Now().Add(2 * time.Minute))
	if state(e, keep.ID) != StatePaused || state(e, drop.ID) != StateDeleted {
		t.Fatalf("after the idle TTL: %s and %s, want paused and deleted", state(e, keep.ID), state(e, drop.ID))
	}
	e.reap(time.Now().Add(4 * time.Minute)) // paused: the idle TTL does not run
	if state(e, keep.ID) != StatePaused {
		t.Fatalf("paused and idle: %s", state(e, keep.ID))
	}
	if err := e.Exec(ctx, admin, ExecParams{Sandbox: keep.ID, Argv: []string{"true"}}, func(ExecEvent) error { return nil }); err != nil {
		t.Fatalf("Exec on the idle-paused sandbox = %v", err)
	}
	e.reap(time.Now().Add(30 * time.Second))
	if state(e, keep.ID) != StateRunning {
		t.Errorf("30 s after its resume: %s, want running", state(e, keep.ID))
	}
	if _, err := e.SetTimeout(ctx, admin, keep.ID, Timeouts{IdleAction: IdleDelete}); err != nil {
		t.Fatal(err)
	}
	e.reap(time.Now().Add(2 * time.Minute))
	if state(e, keep.ID) != StateDeleted {
		t.Errorf("idle with idle_action delete: %s, want deleted", state(e, keep.ID))
	}
}

// TestPauseHostileProject: a key of another project can neither pause nor
// resume a sandbox, by ID (NotFound) or by selector (nothing matches), nor
// resume it by using it.
func TestPauseHostileProject(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	alice := Caller{Project: "alice", KeyID: "ka"}
	mallory := Caller{Project: "mallory", KeyID: "km"}
	victim, err := e.Create(ctx, alice, CreateParams{Image: "busybox", Labels: map[string]string{"job": "train"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	paused, err := e.Create(ctx, alice, CreateParams{Image: "busybox", Labels: map[string]string{"job": "train"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustPause(t, e, alice, paused.ID)
	for _, id := range []string{victim.ID, paused.ID} {
		if _, err := e.Pause(ctx, mallory, id, nil); !errdefs.Is(err, errdefs.ErrNotFound) {
			t.Errorf("mallory: Pause(alice's %s) = %v, want NotFound", id, err)
		}
		if _, err := e.Resume(ctx, mallory, id, nil); !errdefs.Is(err, errdefs.ErrNotFound) {
			t.Errorf("mallory: Resume(alice's %s) = %v, want NotFound", id, err)
		}
	}
	for _, sel := range []map[string]string{{"job": "train"}, {"dsec.io/project": "alice"}} {
		if res, err := e.Pause(ctx, mallory, "", sel); err != nil || len(res) != 0 {
			t.Errorf("mallory: Pause(%v) = %+v, %v, want nothing", sel, res, err)
		}
		if res, err := e.Resume(ctx, mallory, "", sel); err != nil || len(res) != 0 {
			t.Errorf("mallory: Resume(%v) = %+v, %v, want nothing", sel, res, err)
		}
	}
	if err := e.Exec(ctx, mallory, ExecParams{Sandbox: paused.ID, Argv: []string{"true"}}, func(ExecEvent) error { return nil }); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("mallory: Exec(alice's paused sandbox) = %v, want NotFound", err)
	}
	if _, _, err := e.DialPort(ctx, mallory, paused.ID, 80); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("mallory: DialPort(alice's paused sandbox) = %v, want NotFound", err)
	}
	if p.count("Pause") != 1 || p.count("Resume") != 0 || state(e, victim.ID) != StateRunning || state(e, paused.ID) != StatePaused {
		t.Errorf("after mallory: %d pauses, %d resumes, %s, %s; want alice's one pause only", p.count("Pause"), p.count("Resume"), state(e, victim.ID), state(e, paused.ID))
	}
	// The platform's reserved projects are not an admin's to pause.
	if res, err := e.Pause(ctx, admin, "", map[string]string{"job": "train"}); err != nil || len(res) != 2 {
		t.Errorf("admin: Pause(job=train) = %+v, %v, want alice's two", res, err)
	}
}

// TestPauseFlood: many pauses, resumes, requests and deletes of the same
// sandboxes at once leave every record as its backend is, and admission
// exactly what the records hold.
func TestPauseFlood(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	var ids []string
	for range 4 {
		ids = append(ids, create(t, e, 64*testMiB).ID)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				id := ids[(g+i)%len(ids)]
				switch (g + i) % 5 {
				case 0, 1:
					e.Pause(ctx, admin, id, nil)
				case 2:
					e.Resume(ctx, admin, "", map[string]string{})
					e.Resume(ctx, admin, id, nil)
				case 3:
					e.Exec(ctx, admin, ExecParams{Sandbox: id, Argv: []string{"true"}}, func(ExecEvent) error { return nil })
				case 4:
					e.Stat(ctx, admin, id, "/etc")
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(5 * time.Millisecond)
		e.Delete(ctx, admin, ids[0])
	}()
	wg.Wait()
	checkConsistent(t, e, p)
}

// checkConsistent checks that every record's state is what its backend
// says and admission holds what the records hold.
func checkConsistent(t *testing.T, e *Edge, p *pauseNode) {
	t.Helper()
	recs, err := e.store.list()
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	for _, r := range recs {
		held += memHeld(r)
		switch r.State {
		case StatePaused:
			if !p.isPaused(r.ID) {
				t.Errorf("%s is paused, its backend has it running", r.ID)
			}
		case StateRunning:
			if p.isPaused(r.ID) {
				t.Errorf("%s is running, its backend has it paused", r.ID)
			}
		default:
			t.Errorf("%s is %s after everything ended", r.ID, r.State)
		}
	}
	if got := e.admission().MemoryCommitted; got != held {
		t.Errorf("admission holds %d MiB, the records %d MiB", got/testMiB, held/testMiB)
	}
}

// TestPauseSurvivesRestart: pause state is the edge's bbolt record and the
// backend's: a restart of the edge finds paused sandboxes paused, holding
// what stayed resident, and resumes them on request.
func TestPauseSurvivesRestart(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	var ids []string
	for range 20 {
		r := create(t, e, 32*testMiB)
		mustPause(t, e, admin, r.ID)
		ids = append(ids, r.ID)
	}
	wantHeld(t, e, 20*8*testMiB)
	e.Close()

	e = n.openPause(p.open())
	defer e.Close()
	wantHeld(t, e, 20*8*testMiB)
	for _, id := range ids {
		if state(e, id) != StatePaused || !p.isPaused(id) {
			t.Fatalf("after a restart: %s is %s (backend paused %v), want paused", id, state(e, id), p.isPaused(id))
		}
	}
	if p.count("Pause") != 20 || p.count("Resume") != 0 {
		t.Errorf("the restart paused %d and resumed %d times, want nothing", p.count("Pause")-20, p.count("Resume"))
	}
	if err := e.Exec(context.Background(), admin, ExecParams{Sandbox: ids[3], Argv: []string{"true"}}, func(ExecEvent) error { return nil }); err != nil {
		t.Errorf("Exec after a restart = %v", err)
	}
	wantHeld(t, e, 19*8*testMiB+32*testMiB)
}

// TestSettleCrashPoints starts an edge on the records a crash leaves at
// each step of a pause and a resume, with the backend in each state it can
// be in then: every one is finished or undone from what the backend says
// (never left half-frozen), and admission holds what the survivors hold.
func TestSettleCrashPoints(t *testing.T) {
	type backendState int
	const (
		running backendState = iota
		paused
		gone
		exited
	)
	for _, tt := range []struct {
		name      string
		rec       State
		be        backendState
		resumeErr error
		want      State
		wantCalls []string // backend calls of the settle
		wantPause bool     // the backend has it paused after
		reason    string
	}{
		// A crash after running → pausing, before the backend stopped it
		// (edge:pause:marked), or after it failed part way.
		{name: "pausing, not paused", rec: StatePausing, be: running, want: StateRunning, wantCalls: []string{"Resume"}},
		// A crash after the backend paused it (edge:pause:stopped).
		{name: "pausing, paused", rec: StatePausing, be: paused, want: StatePaused, wantCalls: []string{"Pause"}, wantPause: true},
		{name: "pausing, undo fails", rec: StatePausing, be: running, resumeErr: errdefs.Newf(errdefs.ErrInternal, "thaw: EIO"), want: StateFailed, wantCalls: []string{"Resume"}, reason: "its pause failed and it could not be made to run again: internal error"},
		{name: "pausing, gone", rec: StatePausing, be: gone, want: StateFailed, reason: reasonLost},
		// After edge:pause:paused: nothing to do.
		{name: "paused, paused", rec: StatePaused, be: paused, want: StatePaused, wantPause: true},
		// The backend's processes restarted and let it run.
		{name: "paused, running", rec: StatePaused, be: running, want: StatePaused, wantCalls: []string{"Pause"}, wantPause: true},
		{name: "paused, gone", rec: StatePaused, be: gone, want: StateFailed, reason: reasonLost},
		{name: "paused, exited", rec: StatePaused, be: exited, want: StateFailed, wantPause: true, reason: "its init ended while it was paused: killed"},
		// A crash after paused → resuming (edge:resume:marked) or after the
		// backend resumed it (edge:resume:started).
		{name: "resuming, paused", rec: StateResuming, be: paused, want: StateRunning, wantCalls: []string{"Resume"}},
		{name: "resuming, running", rec: StateResuming, be: running, want: StateRunning, wantCalls: []string{"Resume"}},
		{name: "resuming, resume fails", rec: StateResuming, be: paused, resumeErr: errdefs.Newf(errdefs.ErrFailedPrecondition, "cgroup gone"), want: StateFailed, wantCalls: []string{"Resume"}, wantPause: true, reason: "its resume failed: cgroup gone"},
		{name: "resuming, gone", rec: StateResuming, be: gone, want: StateFailed, reason: reasonLost},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n, p := newPauseNode(t)
			st, err := openStore(n.dir+"/edge.db", 0)
			if err != nil {
				t.Fatal(err)
			}
			id := "n-settlesettle"
			now := time.Now().UTC()
			r := &Record{ID: id, Backend: "fake", Project: "default", State: tt.rec, Resources: sandbox.Resources{MemoryBytes: 64 * testMiB, DiskBytes: 16 * testMiB},
				CreatedAt: now, ExpiresAt: now.Add(time.Hour), IdleTTL: time.Hour, Resident: 8 * testMiB, Swapped: 56 * testMiB}
			if tt.rec == StatePaused || tt.rec == StateResuming {
				r.PausedAt, r.TTLStopped = now, now
			}
			if err := st.insert(r); err != nil {
				t.Fatal(err)
			}
			st.close()
			if tt.be != gone {
				if _, err := n.node.Open().Create(context.Background(), sandbox.Spec{ID: id}); err != nil {
					t.Fatal(err)
				}
			}
			switch tt.be {
			case paused:
				p.paused[id] = true
			case exited:
				p.paused[id] = true
				n.node.Exit(id, "killed")
			}
			p.resumeEr = tt.resumeErr

			e := n.openPause(p.open())
			defer e.Close()
			got, err := e.store.get(id)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != tt.want || tt.reason != "" && !strings.HasPrefix(got.Reason, tt.reason) {
				t.Errorf("after start: %s (%s), want %s (%s)", got.State, got.Reason, tt.want, tt.reason)
			}
			var calls []string
			for _, c := range []string{"Pause", "Resume"} {
				for range p.count(c) {
					calls = append(calls, c)
				}
			}
			if !slices.Equal(calls, tt.wantCalls) {
				t.Errorf("backend calls = %v, want %v", calls, tt.wantCalls)
			}
			if p.isPaused(id) != tt.wantPause {
				t.Errorf("backend paused = %v, want %v", p.isPaused(id), tt.wantPause)
			}
			if tt.want == StateRunning && (!got.PausedAt.IsZero() || !got.TTLStopped.IsZero()) {
				t.Errorf("a running record keeps paused at %v, TTL stopped %v", got.PausedAt, got.TTLStopped)
			}
			wantHeld(t, e, memHeld(got))
			// Whatever it became, it can be deleted, and nothing is left.
			if err := e.Delete(context.Background(), admin, id); err != nil {
				t.Errorf("Delete after settling = %v", err)
			}
			wantHeld(t, e, 0)
			if ids := n.node.IDs(); len(ids) != 0 {
				t.Errorf("backend keeps %v", ids)
			}
		})
	}
}

// TestSettleLeavesOperationsInFlight: the reconcile tick does not touch a
// sandbox whose pause is in flight.
func TestSettleLeavesOperationsInFlight(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	r := create(t, e, 64*testMiB)
	block := make(chan struct{})
	entered := make(chan string, 4)
	p.set(func(p *pauseNode) { p.block, p.entered = block, entered })
	done := make(chan error, 1)
	go func() {
		_, err := e.Pause(context.Background(), admin, r.ID, nil)
		done <- err
	}()
	<-entered
	if err := e.reconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if state(e, r.ID) != StatePausing || p.count("Resume") != 0 {
		t.Errorf("the tick during a pause: %s, %d resumes; want it left pausing", state(e, r.ID), p.count("Resume"))
	}
	close(block)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if state(e, r.ID) != StatePaused {
		t.Errorf("after the pause: %s", state(e, r.ID))
	}
}

// TestPauseMetrics: /metrics counts paused sandboxes and where their
// memory is, by project and backend.
func TestPauseMetrics(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	r := create(t, e, 64*testMiB)
	create(t, e, 64*testMiB)
	mustPause(t, e, admin, r.ID)
	out := gather(t, e)
	for _, want := range []string{
		"dsec_sandboxes backend=fake project=default state=paused 1\n",
		"dsec_sandboxes backend=fake project=default state=running 1\n",
		"dsec_sandboxes_paused_resident_bytes backend=fake project=default 8388608\n",
		"dsec_sandboxes_paused_swapped_bytes backend=fake project=default 58720256\n",
		"dsec_node_memory_committed_bytes 75497472\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, r.ID) {
		t.Errorf("/metrics names sandbox %s", r.ID)
	}
}

// TestPauseAPI: the API's forms of results (state, memory, took, per-item
// errors in the code table) and of a paused sandbox.
func TestPauseAPI(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	ctx := context.Background()
	a := create(t, e, 64*testMiB)
	b := create(t, e, 64*testMiB)
	n.node.Exit(b.ID, "done")
	eventually(t, "exit recorded", func() bool { return state(e, b.ID) == StateExited })
	res, err := e.Pause(ctx, admin, "", map[string]string{})
	if err == nil {
		t.Fatalf("Pause(empty selector) = %+v", res)
	}
	res = []PauseResult{{ID: a.ID, State: StatePaused, Resident: 1, Swapped: 2, Took: time.Second}, {ID: b.ID, Err: notNow(&Record{ID: b.ID, State: StateExited}, "paused")}, {ID: a.ID, State: StateRunning}}
	got := e.pauseResultsProto(ctx, "pause", res)
	if got[0].GetState() != sandboxv1.State_STATE_PAUSED || got[0].GetResidentBytes() != 1 || got[0].GetSwappedBytes() != 2 || got[0].GetTook().AsDuration() != time.Second {
		t.Errorf("result of a pause = %v", got[0])
	}
	if got[1].GetError().GetCode() != "failed_precondition" || !strings.Contains(got[1].GetError().GetMessage(), "exited") || got[1].GetState() != sandboxv1.State_STATE_UNSPECIFIED {
		t.Errorf("result of a refused pause = %v", got[1])
	}
	if got[2].GetState() != sandboxv1.State_STATE_RUNNING || got[2].GetResidentBytes() != 16*testMiB {
		t.Errorf("result of a resume of a running sandbox = %v, want its memory now (the fake's stats: a quarter of its limit)", got[2])
	}
}

// TestPausedSandboxEnds: a paused sandbox whose init is killed, or that
// its backend loses, is failed (it cannot exit on its own while stopped),
// and gives back what it held once deleted.
func TestPausedSandboxEnds(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	killed, lost := create(t, e, 64*testMiB), create(t, e, 64*testMiB)
	mustPause(t, e, admin, killed.ID)
	mustPause(t, e, admin, lost.ID)
	n.node.Exit(killed.ID, "killed by signal 9")
	eventually(t, "the end recorded", func() bool { return state(e, killed.ID) == StateFailed })
	if r, _ := e.store.get(killed.ID); r.Reason != "its init ended while it was paused: killed by signal 9" {
		t.Errorf("reason = %q", r.Reason)
	}
	n.node.Forget(lost.ID)
	if err := e.reconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r, _ := e.store.get(lost.ID); r.State != StateFailed || r.Reason != reasonLost {
		t.Errorf("a paused sandbox its backend lost: %s (%s), want failed: lost", r.State, r.Reason)
	}
	wantHeld(t, e, 2*64*testMiB)
	for _, id := range []string{killed.ID, lost.ID} {
		if err := e.Delete(context.Background(), admin, id); err != nil {
			t.Error(err)
		}
	}
	wantHeld(t, e, 0)
}

// TestDeleteDoesNotWaitForOperations: a delete waits for a pause or resume
// of its sandbox, not for the operations being started on it (a long file
// transfer would hold it up).
func TestDeleteDoesNotWaitForOperations(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	r := create(t, e, 64*testMiB)
	inStart, release := make(chan struct{}), make(chan struct{})
	p.set(func(p *pauseNode) {
		p.startHook = func(string) {
			close(inStart)
			<-release
		}
	})
	execDone := make(chan error, 1)
	go func() {
		execDone <- e.Exec(context.Background(), admin, ExecParams{Sandbox: r.ID, Argv: []string{"true"}}, func(ExecEvent) error { return nil })
	}()
	<-inStart
	delDone := make(chan error, 1)
	go func() { delDone <- e.Delete(context.Background(), admin, r.ID) }()
	select {
	case err := <-delDone:
		if err != nil {
			t.Errorf("Delete while an exec starts = %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Error("Delete waited for an exec being started")
	}
	close(release)
	<-execDone // gone under it: any answer will do
	wantHeld(t, e, 0)
}

// TestMoveAccountsEveryTransition takes a record through every transition
// of the table: each persists the state, leaves admission holding what
// the new state holds (the resident memory while paused, nothing once
// deleted), stops or restarts the hard TTL clock as the states say, and
// publishes the transition's event.
func TestMoveAccountsEveryTransition(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	w := e.events.subscribe(admin, nil)
	defer e.events.unsubscribe(w)
	i := 0
	for from, info := range states {
		for _, to := range info.next {
			i++
			id := fmt.Sprintf("n-move%08d", i)
			now := time.Now().UTC()
			r := &Record{ID: id, Backend: "fake", Project: "default", State: from, EndEvent: EventDeleted,
				Resources: sandbox.Resources{MemoryBytes: 64 * testMiB, DiskBytes: 16 * testMiB},
				CreatedAt: now, ExpiresAt: now.Add(time.Hour), Resident: 8 * testMiB}
			if !states[from].ttl {
				r.TTLStopped = now.Add(-time.Minute)
			}
			if err := e.store.insert(r); err != nil {
				t.Fatal(err)
			}
			e.hold(r)
			before := e.admission().MemoryCommitted
			got, err := e.transition(id, from, to, "", nil)
			if err != nil {
				t.Errorf("%s → %s = %v", from, to, err)
				continue
			}
			if got.State != to || state(e, id) != to {
				t.Errorf("%s → %s: record is %s, stored %s", from, to, got.State, state(e, id))
			}
			wantHeld := int64(0)
			if to != StateDeleted {
				wantHeld = memHeld(got)
			}
			if d := e.admission().MemoryCommitted - before; d != wantHeld-memHeld(r) {
				t.Errorf("%s → %s: admission moved by %d MiB, want %d MiB", from, to, d/testMiB, (wantHeld-memHeld(r))/testMiB)
			}
			if to != StateDeleted {
				if stopped := !got.TTLStopped.IsZero(); stopped == states[to].ttl {
					t.Errorf("%s → %s: TTL clock stopped %v, want stopped %v", from, to, stopped, !states[to].ttl)
				}
				if !states[from].ttl && states[to].ttl && !got.ExpiresAt.After(r.ExpiresAt) {
					t.Errorf("%s → %s: the stopped time was not added to the hard TTL", from, to)
				}
			}
			want := transitionEvent(from, to)
			if to == StateDeleted {
				want = EventDeleted
			}
			if evs := drainNow(w); want == "" && len(evs) != 0 || want != "" && !slices.Equal(evs, []string{want}) {
				t.Errorf("%s → %s: events %v, want %q", from, to, evs, want)
			}
			if to != StateDeleted {
				// Leave nothing: finish through the table.
				for _, s := range []State{StateDeleting, StateDeleted} {
					if allowed(state(e, id), s) {
						e.transition(id, "", s, "", nil)
					}
				}
				drainNow(w)
			}
		}
	}
	if i != 19 {
		t.Errorf("%d transitions, want the table's 19", i)
	}
}

// drainNow returns the types of the events already on w (a transition
// publishes before it returns).
func drainNow(w *watcher) []string {
	var out []string
	for {
		select {
		case ev := <-w.ch:
			out = append(out, ev.Type)
		default:
			return out
		}
	}
}

// TestPauseTimeoutUndone: a pause the backend does not finish in time is
// undone with time of its own (the sandbox runs on, never half-frozen).
func TestPauseTimeoutUndone(t *testing.T) {
	n, p := newPauseNode(t)
	e := n.openPause(p.open())
	defer e.Close()
	r := create(t, e, 64*testMiB)
	defer func(d time.Duration) { pauseTimeout = d }(pauseTimeout)
	pauseTimeout = 50 * time.Millisecond
	p.set(func(p *pauseNode) { p.stuck = true })
	if _, err := e.Pause(context.Background(), admin, r.ID, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Pause that timed out = %v, want the deadline", err)
	}
	if state(e, r.ID) != StateRunning || p.isPaused(r.ID) {
		t.Errorf("after a pause timed out: %s, backend paused %v; want running, undone", state(e, r.ID), p.isPaused(r.ID))
	}
	wantHeld(t, e, 64*testMiB)
}
