package keeper

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// fakeDriver is a hand-written Driver for the core's tests: a sandbox is a
// host process (sleep) standing for its init, and an exec is a host
// process of the argv. It needs no root, runtime or kernel feature, so the
// core (records, adoption, the exec journal, output, stdin, timeouts,
// signals, events, lost execs, the API) is tested on every machine.
type fakeDriver struct {
	k *Keeper

	mu sync.Mutex
	// guarded by mu
	started, destroyed, adopted []string
}

func (f *fakeDriver) Name() string { return "fake" }

func (f *fakeDriver) Start(ctx context.Context, b *box, req CreateRequest) error {
	if err := os.MkdirAll(filepath.Join(f.k.l.SandboxDir(req.ID), "execs"), 0o700); err != nil {
		return err
	}
	pid, ch, err := f.k.reaper.startProcess([]string{"/bin/sleep", "3600"}, nil, devNulls(), &syscall.SysProcAttr{Setsid: true}, "")
	if err != nil {
		return err
	}
	st, err := ProcStartTime(pid)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.info.Pid, b.info.StartTime, b.info.State = pid, st, StateRunning
	b.initExit = ch
	b.mu.Unlock()
	f.mu.Lock()
	f.started = append(f.started, req.ID)
	f.mu.Unlock()
	return nil
}

func (f *fakeDriver) Destroy(ctx context.Context, b *box) {
	b.mu.Lock()
	id, pid := b.info.ID, b.info.Pid
	b.mu.Unlock()
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		select {
		case <-b.exited:
		case <-time.After(5 * time.Second):
		}
	}
	_ = os.RemoveAll(f.k.l.SandboxDir(id))
	f.mu.Lock()
	f.destroyed = append(f.destroyed, id)
	f.mu.Unlock()
}

func (f *fakeDriver) Adopt(b *box) {
	f.mu.Lock()
	f.adopted = append(f.adopted, b.info.ID)
	f.mu.Unlock()
}

func (f *fakeDriver) Sweep(context.Context, map[string]bool) {}

func (f *fakeDriver) Exec(ctx context.Context, b *box, spec ExecSpec, stdio [3]*os.File) (int, error) {
	argv := slices.Clone(spec.Argv)
	if !strings.HasPrefix(argv[0], "/") {
		argv[0] = "/bin/" + argv[0]
	}
	// Not through the reaper's startProcess, which would register a
	// waiter of its own: the core watches the pid, as it does the pids a
	// real driver's helpers report.
	files := []uintptr{stdio[0].Fd(), stdio[1].Fd(), stdio[2].Fd()}
	return syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Env: spec.Env, Files: files, Sys: &syscall.SysProcAttr{Setsid: true}})
}

func (f *fakeDriver) Terminal(*box, ExecSpec) (*os.File, *os.File, error) {
	return nil, nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "the fake driver has no terminals")
}

func (f *fakeDriver) OOMKills(*box) (int64, error) { return 0, nil }

func (f *fakeDriver) Stats(*box) (Stats, error) { return Stats{Pids: 1}, nil }

func (f *fakeDriver) Run(ctx context.Context) { <-ctx.Done() }

func (f *fakeDriver) Close() {}

var _ Driver = (*fakeDriver)(nil)

func devNulls() []uintptr {
	n, _ := os.Open(os.DevNull)
	return []uintptr{n.Fd(), n.Fd(), n.Fd()}
}

// newFakeKeeper returns a keeper core on dir with the fake driver as its
// default, served on its socket, and a client of it.
func newFakeKeeper(t *testing.T, dir string) (*Keeper, *fakeDriver, *Client) {
	t.Helper()
	return newFakeKeeperWith(t, dir, func(f *fakeDriver) Driver { return f })
}

// newFakeKeeperWith is newFakeKeeper with the driver wrap makes of the
// fake one.
func newFakeKeeperWith(t *testing.T, dir string, wrap func(*fakeDriver) Driver) (*Keeper, *fakeDriver, *Client) {
	t.Helper()
	cfg := Config{StateDir: dir, Version: "test", Runtime: "/usr/bin/crun", OutputQuota: 1 << 20, OutputLimit: 1 << 20}
	k := &Keeper{cfg: cfg, l: Layout{StateDir: dir}, log: discardLogger(), boxes: map[string]*box{}, events: newEventLog(), vault: newVault(), settings: cfg.Settings()}
	k.reaper = newReaper()
	f := &fakeDriver{k: k}
	k.drivers, k.defaultDriver = map[string]Driver{"fake": wrap(f)}, "fake"
	if err := os.MkdirAll(k.l.SandboxesDir(), 0o711); err != nil {
		t.Fatal(err)
	}
	k.takeOver()
	k.adopt()
	serveOn(t, dir, k.handler(func() {}))
	c := NewClient(dir)
	t.Cleanup(func() {
		c.Close()
		k.stopMoves()
		for _, b := range k.allBoxes() {
			if b.info.Pid > 0 {
				_ = syscall.Kill(b.info.Pid, syscall.SIGKILL)
			}
		}
		if k.reaper != nil {
			k.reaper.close()
		}
	})
	return k, f, c
}

func execWait(t *testing.T, c *Client, id string, spec ExecSpec) ExitStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if spec.Env == nil {
		spec.Env = []string{"PATH=/usr/bin:/bin"}
	}
	if err := c.StartExec(ctx, ExecRequest{Sandbox: id, Spec: spec}); err != nil {
		t.Fatalf("StartExec(%v) = %v", spec.Argv, err)
	}
	st, err := c.WaitExec(ctx, id, spec.ID)
	if err != nil {
		t.Fatalf("WaitExec(%s) = %v", spec.ID, err)
	}
	return st
}

func readOutput(t *testing.T, c *Client, id, exec string, s Stream) string {
	t.Helper()
	b, err := os.ReadFile(c.OutputPath(id, exec, s))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCoreExecs runs the core's exec semantics on the fake driver.
func TestCoreExecs(t *testing.T) {
	_, f, c := newFakeKeeper(t, shortTempDir(t))
	ctx := context.Background()
	const id = "n-core"
	info, err := c.Create(ctx, CreateRequest{ID: id, Layers: []Layer{{Digest: "sha256:aa", Path: "/x"}}})
	if err != nil || info.State != StateRunning || info.Driver != "fake" {
		t.Fatalf("Create = %+v, %v; want running on the fake driver", info, err)
	}
	if _, err := c.Create(ctx, CreateRequest{ID: id, Layers: []Layer{{Digest: "sha256:aa"}}}); !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Create(same id) = %v, want AlreadyExists", err)
	}
	if _, err := c.Create(ctx, CreateRequest{ID: "n-other", Driver: "qemu", Layers: []Layer{{Digest: "sha256:aa"}}}); !errdefs.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "qemu") {
		t.Errorf("Create(driver qemu) = %v, want InvalidArgument naming it", err)
	}
	var rec SandboxInfo
	if b, err := os.ReadFile(filepath.Join(c.SandboxDir(id), "keeper.json")); err != nil || json.Unmarshal(b, &rec) != nil || rec.Pid != info.Pid || rec.Driver != "fake" {
		t.Errorf("keeper.json = %+v, %v; want the sandbox's record", rec, err)
	}

	st := execWait(t, c, id, ExecSpec{ID: "e1", Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if st.Code != 3 || st.Lost || st.Started.IsZero() || st.Ended.Before(st.Started) {
		t.Errorf("exit of `exit 3` = %+v, want code 3 with times", st)
	}
	if o, e := readOutput(t, c, id, "e1", Stdout), readOutput(t, c, id, "e1", Stderr); o != "out\n" || e != "err\n" {
		t.Errorf("output = %q, %q; want out, err", o, e)
	}
	st = execWait(t, c, id, ExecSpec{ID: "e2", Argv: []string{"sleep", "30"}, Timeout: 100 * time.Millisecond})
	if !st.TimedOut || st.Signal != 9 || st.Code != 0 {
		t.Errorf("exit of a timed-out exec = %+v, want timed out by signal 9", st)
	}
	st = execWait(t, c, id, ExecSpec{ID: "e3", Argv: []string{"sh", "-c", "yes | head -c 100000"}, OutputLimit: 10})
	if !st.StdoutTruncated || len(readOutput(t, c, id, "e3", Stdout)) != 10 {
		t.Errorf("exit of an exec past its output limit = %+v with %d bytes, want truncated at 10", st, len(readOutput(t, c, id, "e3", Stdout)))
	}

	// stdin kept open, written later, then closed.
	if err := c.StartExec(ctx, ExecRequest{Sandbox: id, Spec: ExecSpec{ID: "e4", Argv: []string{"cat"}, Stdin: []byte("one "), StdinOpen: true}}); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, StdinRequest{Sandbox: id, Exec: "e4", Data: []byte("two"), Close: true}); err != nil {
		t.Fatalf("WriteStdin = %v", err)
	}
	if st, err := c.WaitExec(ctx, id, "e4"); err != nil || st.Code != 0 || readOutput(t, c, id, "e4", Stdout) != "one two" {
		t.Errorf("cat with stdin = %+v, %v, %q; want one two", st, err, readOutput(t, c, id, "e4", Stdout))
	}

	// A signal reaches the command's process group.
	if err := c.StartExec(ctx, ExecRequest{Sandbox: id, Spec: ExecSpec{ID: "e5", Argv: []string{"sleep", "30"}}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, SignalRequest{Sandbox: id, Exec: "e5", Signal: 15}); err != nil {
		t.Fatalf("Signal = %v", err)
	}
	if st, err := c.WaitExec(ctx, id, "e5"); err != nil || st.Signal != 15 {
		t.Errorf("exit of a signalled exec = %+v, %v; want signal 15", st, err)
	}
	if err := c.StartExec(ctx, ExecRequest{Sandbox: id, Spec: ExecSpec{ID: "e1", Argv: []string{"true"}}}); !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("StartExec(used id) = %v, want AlreadyExists", err)
	}
	if err := c.StartExec(ctx, ExecRequest{Sandbox: id, Spec: ExecSpec{ID: "tty", Argv: []string{"true"}, TTY: true}}); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("StartExec(TTY) on a driver without terminals = %v, want its FailedPrecondition", err)
	}
	execs, err := c.ListExecs(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range execs {
		ids = append(ids, e.ID)
	}
	if want := []string{"e1", "e2", "e3", "e4", "e5"}; !slices.Equal(ids, want) {
		t.Errorf("ListExecs = %v, want %v, oldest first", ids, want)
	}

	// The init's end is an event, and the sandbox is exited.
	_ = syscall.Kill(info.Pid, syscall.SIGKILL)
	evs, _, err := c.Events(ctx, "")
	for err == nil && len(evs) == 0 {
		evs, _, err = c.Events(ctx, "")
	}
	if err != nil || evs[0].Type != EventExited || evs[0].Sandbox != id || !strings.Contains(evs[0].Reason, "signal 9") {
		t.Errorf("Events after the init was killed = %+v, %v; want it exited by signal 9", evs, err)
	}
	if s, err := c.Status(ctx, id); err != nil || s.State != StateExited {
		t.Errorf("Status after the init ended = %+v, %v; want exited", s, err)
	}
	if err := c.StartExec(ctx, ExecRequest{Sandbox: id, Spec: ExecSpec{ID: "late", Argv: []string{"true"}}}); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("StartExec in an exited sandbox = %v, want FailedPrecondition", err)
	}
	if err := c.Delete(ctx, id); err != nil {
		t.Fatalf("Delete = %v", err)
	}
	if _, err := c.Status(ctx, id); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after Delete = %v, want NotFound", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.started, []string{id}) || !slices.Contains(f.destroyed, id) {
		t.Errorf("the driver started %v and destroyed %v, want %s both", f.started, f.destroyed, id)
	}
}

// TestCoreRestart: a new keeper on the same state dir adopts the sandbox
// from its record, its running exec is lost (said so, never dropped or
// given an exit code) and ended ones keep their status, and it runs new
// execs.
func TestCoreRestart(t *testing.T) {
	dir := shortTempDir(t)
	k1, _, c1 := newFakeKeeper(t, dir)
	ctx := context.Background()
	const id = "n-restart"
	info, err := c1.Create(ctx, CreateRequest{ID: id, Layers: []Layer{{Digest: "sha256:aa"}}})
	if err != nil {
		t.Fatal(err)
	}
	execWait(t, c1, id, ExecSpec{ID: "done", Argv: []string{"sh", "-c", "exit 7"}})
	if err := c1.StartExec(ctx, ExecRequest{Sandbox: id, Spec: ExecSpec{ID: "running", Argv: []string{"sleep", "30"}, Env: []string{"PATH=/bin"}}}); err != nil {
		t.Fatal(err)
	}
	// The first keeper goes; its processes stay (a keeper that died). One
	// reaper per process, as in a real keeper.
	c1.Close()
	k1.mu.Lock()
	k1.boxes = map[string]*box{}
	k1.mu.Unlock()
	k1.reaper.close()
	k1.reaper = nil
	_ = os.Remove(Layout{StateDir: dir}.Socket())

	_, f2, c2 := newFakeKeeper(t, dir)
	if !slices.Equal(f2.adopted, []string{id}) {
		t.Fatalf("the new keeper's driver adopted %v, want [%s]", f2.adopted, id)
	}
	s, err := c2.Status(ctx, id)
	if err != nil || !s.Adopted || s.State != StateRunning || s.Pid != info.Pid {
		t.Errorf("Status after a restart = %+v, %v; want the same init, adopted, running", s, err)
	}
	if st, err := c2.WaitExec(ctx, id, "running"); err != nil || !st.Lost {
		t.Errorf("WaitExec(an exec running across the restart) = %+v, %v; want lost", st, err)
	}
	if st, err := c2.WaitExec(ctx, id, "done"); err != nil || st.Code != 7 || st.Lost {
		t.Errorf("WaitExec(an exec that ended before) = %+v, %v; want code 7", st, err)
	}
	if st := execWait(t, c2, id, ExecSpec{ID: "after", Argv: []string{"sh", "-c", "exit 5"}}); st.Code != 5 {
		t.Errorf("an exec after the restart = %+v, want code 5", st)
	}
	_ = syscall.Kill(info.Pid, syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s, err := c2.Status(ctx, id); err == nil && s.State == StateExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the adopted init's end was not seen (pidfd watch)")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestV2ClientCreatesAndExecs: a protocol 2 client's create and exec run
// on today's keeper.
func TestV2ClientCreatesAndExecs(t *testing.T) {
	dir := shortTempDir(t)
	newFakeKeeper(t, dir)
	sock := Layout{StateDir: dir}.Socket()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer hc.CloseIdleConnections()
	body, _ := json.Marshal(v2CreateRequest{ID: "n-v2", Layers: []v2Layer{{Digest: "sha256:aa", Path: "/x"}}, Resources: v2Resources{MemoryBytes: 64 << 20}})
	var info v2SandboxInfo
	if _, err := v2Call(t, hc, "POST", "/v1/sandbox/create", body, &info); err != nil || info.State != "running" || info.Pid == 0 {
		t.Fatalf("create from a protocol 2 client = %+v, %v", info, err)
	}
	body, _ = json.Marshal(v2ExecRequest{Sandbox: "n-v2", Spec: v2ExecSpec{ID: "x1", Argv: []string{"sh", "-c", "echo v2; exit 4"}, Env: []string{"PATH=/bin"}}})
	if code, err := v2Call(t, hc, "POST", "/v1/exec/start", body, nil); err != nil || code != http.StatusNoContent {
		t.Fatalf("exec start from a protocol 2 client = %d, %v", code, err)
	}
	var exit v2ExitRecord
	for {
		code, err := v2Call(t, hc, "GET", "/v1/exec/wait?sandbox=n-v2&exec=x1&timeout=5s", nil, &exit)
		if err != nil {
			t.Fatal(err)
		}
		if code != http.StatusAccepted {
			break
		}
	}
	if exit.Code != 4 || exit.StdoutBytes != 3 {
		t.Errorf("wait from a protocol 2 client = %+v, want code 4 and 3 bytes", exit)
	}
	var st v2Stats
	if _, err := v2Call(t, hc, "GET", "/v1/sandbox/stats?id=n-v2", nil, &st); err != nil || st.Pids != 1 || st.OutputBytes != 3 || st.OutputLimit != 1<<20 {
		t.Errorf("stats from a protocol 2 client = %+v, %v; want the driver's pids and the exec's output", st, err)
	}
	if code, err := v2Call(t, hc, "POST", "/v1/sandbox/delete?id=n-v2", nil, nil); err != nil || code != http.StatusNoContent {
		t.Errorf("delete from a protocol 2 client = %d, %v", code, err)
	}
}
