package keeper

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// fakePauser is the fake driver with pause: a sandbox's init (sleep) is
// stopped with SIGSTOP and let go with SIGCONT, and the moves of its
// memory are only logged.
type fakePauser struct {
	*fakeDriver
	failFreeze bool

	mu sync.Mutex
	// guarded by mu
	log []string
}

func (f *fakePauser) note(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, s)
}

func (f *fakePauser) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

func (f *fakePauser) pauseBusy(*box) error { return nil }

func (f *fakePauser) freeze(_ context.Context, b *box) error {
	f.note("freeze")
	if f.failFreeze {
		return errors.New("the fake cannot freeze")
	}
	return syscall.Kill(b.snapshot().Pid, syscall.SIGSTOP)
}

func (f *fakePauser) thaw(_ context.Context, b *box) error {
	f.note("thaw")
	return syscall.Kill(b.snapshot().Pid, syscall.SIGCONT)
}

func (f *fakePauser) moveOut(context.Context, *box) (string, error) {
	f.note("out")
	return "", nil
}

func (f *fakePauser) moveBack(context.Context, *box) error {
	f.note("back")
	return nil
}

func (f *fakePauser) allowSwap(_ *box, allow bool) error {
	if !allow {
		f.note("noswap")
	}
	return nil
}

func (f *fakePauser) memory(*box) (PauseInfo, error) { return PauseInfo{Resident: 1, Swapped: 2}, nil }

// The fake's record of a pause is a file in the sandbox's directory.
func (f *fakePauser) setPaused(b *box, paused bool) error {
	path := filepath.Join(b.dir(f.k.l), "fake-paused")
	if paused {
		return os.WriteFile(path, nil, 0o600)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

func (f *fakePauser) recordedPaused(info SandboxInfo) bool {
	_, err := os.Stat(filepath.Join(f.k.l.SandboxDir(info.ID), "fake-paused"))
	return err == nil
}

var _ pauser = (*fakePauser)(nil)

// stopped reports whether process pid is stopped (state T).
func stopped(t *testing.T, pid int) bool {
	t.Helper()
	for range 100 {
		_, st, err := ProcStat(pid)
		if err != nil {
			t.Fatal(err)
		}
		if st == 'T' {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// recordOf is what the fake driver's record says of sandbox id.
func recordOf(t *testing.T, c *Client, id string) SandboxInfo {
	t.Helper()
	_, err := os.Stat(filepath.Join(c.SandboxDir(id), "fake-paused"))
	return SandboxInfo{ID: id, Paused: err == nil}
}

// TestCorePauseResume runs the core's pause semantics on the fake
// driver: recorded before the freeze, a no-op when repeated, execs
// refused while paused, the memory moved out and back, and a driver that
// cannot pause refused.
func TestCorePauseResume(t *testing.T) {
	var fp *fakePauser
	_, _, c := newFakeKeeperWith(t, shortTempDir(t), func(f *fakeDriver) Driver {
		fp = &fakePauser{fakeDriver: f}
		return fp
	})
	ctx := context.Background()
	const id = "n-pause"
	info, err := c.Create(ctx, CreateRequest{ID: id, Layers: []Layer{{Digest: "sha256:aa"}}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Pause(ctx, id, true)
	if err != nil || !p.Paused || p.Moving || p.Resident != 1 || p.Swapped != 2 || p.Stopped <= 0 {
		t.Fatalf("Pause(wait) = %+v, %v; want paused, moved, the driver's figures, the time to stop it", p, err)
	}
	if !stopped(t, info.Pid) {
		t.Errorf("init %d is not stopped after Pause", info.Pid)
	}
	if rec := recordOf(t, c, id); !rec.Paused {
		t.Errorf("record after Pause = %+v, want paused", rec)
	}
	if s, err := c.Status(ctx, id); err != nil || !s.Paused {
		t.Errorf("Status after Pause = %+v, %v; want paused", s, err)
	}
	if p, err := c.Pause(ctx, id, false); err != nil || !p.Paused || p.Stopped != 0 {
		t.Errorf("Pause of a paused sandbox = %+v, %v; want it as it is, no time to stop it", p, err)
	}
	err = c.StartExec(ctx, ExecRequest{Sandbox: id, Spec: ExecSpec{ID: "no", Argv: []string{"true"}}})
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("StartExec while paused = %v, want FailedPrecondition", err)
	}
	err = c.StartExec(ctx, ExecRequest{Sandbox: id, Spec: ExecSpec{ID: "no2", Argv: []string{"true"}, Session: "s"}})
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("session exec while paused = %v, want FailedPrecondition", err)
	}
	r, err := c.Resume(ctx, id, true)
	if err != nil || r.Paused || r.Moving {
		t.Fatalf("Resume(wait) = %+v, %v", r, err)
	}
	if stopped(t, info.Pid) {
		t.Errorf("init %d is still stopped after Resume", info.Pid)
	}
	if rec := recordOf(t, c, id); rec.Paused {
		t.Errorf("record after Resume = %+v, want running", rec)
	}
	if r, err := c.Resume(ctx, id, false); err != nil || r.Paused {
		t.Errorf("Resume of a running sandbox = %+v, %v", r, err)
	}
	// The read-back runs beside the thaw: their order is the scheduler's.
	got := fp.calls()
	want := []string{"freeze", "out", "noswap", "back", "thaw"}
	slices.Sort(got[3:])
	if !slices.Equal(got, want) {
		t.Errorf("driver calls = %v, want %v", got, want)
	}

	// A freeze that fails leaves it running, and recorded so.
	fp.failFreeze = true
	if _, err := c.Pause(ctx, id, false); err == nil {
		t.Errorf("Pause with a failing freeze = nil error")
	}
	if s, _ := c.Status(ctx, id); s.Paused || recordOf(t, c, id).Paused {
		t.Errorf("after a failed pause the sandbox reads paused")
	}
	fp.failFreeze = false

	for _, bad := range []string{"nosuch", "../x"} {
		if _, err := c.Pause(ctx, bad, false); err == nil {
			t.Errorf("Pause(%q) = nil error", bad)
		}
	}
}

// TestCorePauseNeedsPauser: the plain fake driver cannot pause, which is
// refused as FailedPrecondition.
func TestCorePauseNeedsPauser(t *testing.T) {
	_, _, c := newFakeKeeper(t, shortTempDir(t))
	ctx := context.Background()
	if _, err := c.Create(ctx, CreateRequest{ID: "n-nopause", Layers: []Layer{{Digest: "sha256:aa"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, "n-nopause", false); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Pause on a driver without pause = %v, want FailedPrecondition", err)
	}
}

// TestCorePauseSurvivesRestart: a keeper that finds a sandbox recorded
// paused keeps it paused (its driver's Adopt is told) and moves its
// memory out again; resuming it then works.
func TestCorePauseSurvivesRestart(t *testing.T) {
	dir := shortTempDir(t)
	k1, _, c1 := newFakeKeeperWith(t, dir, func(f *fakeDriver) Driver { return &fakePauser{fakeDriver: f} })
	ctx := context.Background()
	const id = "n-paused-restart"
	info, err := c1.Create(ctx, CreateRequest{ID: id, Layers: []Layer{{Digest: "sha256:aa"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	c1.Close()
	k1.stopMoves()
	k1.mu.Lock()
	k1.boxes = map[string]*box{}
	k1.mu.Unlock()
	k1.reaper.close()
	k1.reaper = nil
	_ = os.Remove(Layout{StateDir: dir}.Socket())

	var fp *fakePauser
	_, _, c2 := newFakeKeeperWith(t, dir, func(f *fakeDriver) Driver {
		fp = &fakePauser{fakeDriver: f}
		return fp
	})
	s, err := c2.Status(ctx, id)
	if err != nil || !s.Paused || !s.Adopted {
		t.Fatalf("Status after a restart = %+v, %v; want adopted and paused", s, err)
	}
	if !stopped(t, info.Pid) {
		t.Errorf("the paused init %d runs after the keeper restarted", info.Pid)
	}
	if p, err := c2.PauseState(ctx, id); err != nil || !p.Paused {
		t.Errorf("PauseState = %+v, %v", p, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(fp.calls(), "out") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !slices.Contains(fp.calls(), "out") {
		t.Errorf("the new keeper did not move the paused sandbox's memory out (calls %v)", fp.calls())
	}
	if _, err := c2.Resume(ctx, id, true); err != nil {
		t.Fatalf("Resume after a restart = %v", err)
	}
	if stopped(t, info.Pid) {
		t.Errorf("init %d still stopped after Resume", info.Pid)
	}
}
