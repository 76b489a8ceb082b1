package edge

import (
	"context"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/metrics"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

// pauseNode is a fake node whose backend can pause (sandbox.Pauser), as
// the container backend does once the node side of issue 15 is in: a
// paused sandbox refuses everything that needs its processes (a frozen
// one would hang), so an operation the edge does not resume first fails.
// Like the FakeNode it wraps, it outlives the edges opened on it, so a
// test restarts the edge by opening a new one; the paused sandboxes stay
// paused.
type pauseNode struct {
	*sandboxtest.FakeNode

	mu sync.Mutex
	// guarded by mu
	paused    map[string]bool
	calls     map[string]int // "Pause", "Resume"
	byID      map[string]int // "Pause id", "Resume id"
	info      sandbox.PauseInfo
	pauseErr  error           // Pause fails (after stopping the sandbox when half)
	half      bool            // a failing Pause leaves the sandbox stopped
	resumeEr  error           // Resume fails
	block     chan struct{}   // Pause and Resume wait for it when set
	stuck     bool            // Pause stops the sandbox, then waits for its context to end
	entered   chan string     // told "Pause id" or "Resume id" as one starts, when set
	startHook func(id string) // called as an exec starts, before it is refused or run
}

func newPauseNode(t testing.TB) (*testNode, *pauseNode) {
	n := newTestNode(t)
	return n, &pauseNode{
		FakeNode: n.node, paused: map[string]bool{}, calls: map[string]int{}, byID: map[string]int{},
		info: sandbox.PauseInfo{Resident: 8 * testMiB, Swapped: 56 * testMiB},
	}
}

// open returns a backend on the node.
func (p *pauseNode) open() *pauseFake { return &pauseFake{Fake: p.FakeNode.Open(), p: p} }

func (p *pauseNode) set(fn func(p *pauseNode)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(p)
}

func (p *pauseNode) isPaused(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused[id]
}

func (p *pauseNode) count(call string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[call]
}

// pauseFake is the backend of a pauseNode.
type pauseFake struct {
	*sandboxtest.Fake
	p *pauseNode
}

var (
	_ sandbox.Pauser     = (*pauseFake)(nil)
	_ sandbox.PortDialer = (*pauseFake)(nil)
	_ sandbox.Sessioner  = (*pauseFake)(nil)
)

func (f *pauseFake) enter(call, id string) (block chan struct{}) {
	f.p.mu.Lock()
	f.p.calls[call]++
	f.p.byID[call+" "+id]++
	block, entered := f.p.block, f.p.entered
	f.p.mu.Unlock()
	if entered != nil {
		entered <- call + " " + id
	}
	return block
}

// wait waits for block (when set); a call whose context has ended fails,
// as a real backend's would.
func wait(ctx context.Context, block chan struct{}) error {
	if block == nil {
		return ctx.Err()
	}
	select {
	case <-block:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *pauseFake) Pause(ctx context.Context, id string) (sandbox.PauseInfo, error) {
	if err := wait(ctx, f.enter("Pause", id)); err != nil {
		return sandbox.PauseInfo{}, err
	}
	f.p.mu.Lock()
	stuck := f.p.stuck
	if stuck {
		f.p.paused[id] = true // stopped, and then nothing
	}
	f.p.mu.Unlock()
	if stuck {
		<-ctx.Done()
		return sandbox.PauseInfo{}, ctx.Err()
	}
	if _, err := f.Fake.Status(ctx, id); err != nil {
		return sandbox.PauseInfo{}, err
	}
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	if f.p.pauseErr != nil {
		if f.p.half {
			f.p.paused[id] = true
		}
		return sandbox.PauseInfo{}, f.p.pauseErr
	}
	f.p.paused[id] = true
	return f.p.info, nil
}

func (f *pauseFake) Resume(ctx context.Context, id string) (sandbox.PauseInfo, error) {
	if err := wait(ctx, f.enter("Resume", id)); err != nil {
		return sandbox.PauseInfo{}, err
	}
	if _, err := f.Fake.Status(ctx, id); err != nil {
		return sandbox.PauseInfo{}, err
	}
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	if f.p.resumeEr != nil {
		return sandbox.PauseInfo{}, f.p.resumeEr
	}
	delete(f.p.paused, id)
	return sandbox.PauseInfo{Resident: 32 * testMiB, Swapped: 32 * testMiB}, nil
}

func (f *pauseFake) Status(ctx context.Context, id string) (sandbox.Status, error) {
	st, err := f.Fake.Status(ctx, id)
	st.Paused = f.p.isPaused(id)
	return st, err
}

func (f *pauseFake) List(ctx context.Context) ([]sandbox.Status, error) {
	sts, err := f.Fake.List(ctx)
	for i := range sts {
		sts[i].Paused = f.p.isPaused(sts[i].ID)
	}
	return sts, err
}

// frozen refuses an operation on a paused sandbox.
func (f *pauseFake) frozen(id, what string) error {
	if f.p.isPaused(id) {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "fake: %s on paused sandbox %s (a frozen one would hang)", what, id)
	}
	return nil
}

func (f *pauseFake) StartExec(ctx context.Context, id string, spec sandbox.ExecSpec) error {
	f.p.mu.Lock()
	hook := f.p.startHook
	f.p.mu.Unlock()
	if hook != nil {
		hook(id)
	}
	if err := f.frozen(id, "exec"); err != nil {
		return err
	}
	return f.Fake.StartExec(ctx, id, spec)
}

func (f *pauseFake) OpenOutput(ctx context.Context, id, execID string, s sandbox.Stream) (sandbox.Output, error) {
	// Output files are the host's: readable while paused (attach does not
	// need it to run, but resumes it all the same).
	return f.Fake.OpenOutput(ctx, id, execID, s)
}

func (f *pauseFake) WriteStdin(ctx context.Context, id, execID string, data []byte, closeIt bool) error {
	if err := f.frozen(id, "write stdin"); err != nil {
		return err
	}
	return f.Fake.WriteStdin(ctx, id, execID, data, closeIt)
}

func (f *pauseFake) Signal(ctx context.Context, id, execID string, sig int) error {
	if err := f.frozen(id, "signal"); err != nil {
		return err
	}
	return f.Fake.Signal(ctx, id, execID, sig)
}

func (f *pauseFake) ResizeTTY(ctx context.Context, id, execID string, rows, cols uint16) error {
	if err := f.frozen(id, "resize"); err != nil {
		return err
	}
	return f.Fake.ResizeTTY(ctx, id, execID, rows, cols)
}

func (f *pauseFake) ReadFile(ctx context.Context, id, p string) (io.ReadCloser, sandbox.FileInfo, error) {
	if err := f.frozen(id, "read file"); err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	return f.Fake.ReadFile(ctx, id, p)
}

func (f *pauseFake) WriteFile(ctx context.Context, id, p string, opts sandbox.WriteOptions, r io.Reader) (sandbox.FileInfo, error) {
	if err := f.frozen(id, "write file"); err != nil {
		return sandbox.FileInfo{}, err
	}
	return f.Fake.WriteFile(ctx, id, p, opts, r)
}

func (f *pauseFake) Stat(ctx context.Context, id, p string) (sandbox.FileInfo, error) {
	if err := f.frozen(id, "stat"); err != nil {
		return sandbox.FileInfo{}, err
	}
	return f.Fake.Stat(ctx, id, p)
}

func (f *pauseFake) ReadDir(ctx context.Context, id, p string, limit int) ([]sandbox.FileInfo, bool, error) {
	if err := f.frozen(id, "list"); err != nil {
		return nil, false, err
	}
	return f.Fake.ReadDir(ctx, id, p, limit)
}

func (f *pauseFake) Mkdir(ctx context.Context, id, p string, mode fs.FileMode, parents bool, uid, gid uint32) (sandbox.FileInfo, error) {
	if err := f.frozen(id, "mkdir"); err != nil {
		return sandbox.FileInfo{}, err
	}
	return f.Fake.Mkdir(ctx, id, p, mode, parents, uid, gid)
}

func (f *pauseFake) Remove(ctx context.Context, id, p string, recursive bool) error {
	if err := f.frozen(id, "rm"); err != nil {
		return err
	}
	return f.Fake.Remove(ctx, id, p, recursive)
}

func (f *pauseFake) Rename(ctx context.Context, id, from, to string, overwrite bool) error {
	if err := f.frozen(id, "mv"); err != nil {
		return err
	}
	return f.Fake.Rename(ctx, id, from, to, overwrite)
}

func (f *pauseFake) DownloadTar(ctx context.Context, id, p string, w io.Writer) error {
	if err := f.frozen(id, "download tar"); err != nil {
		return err
	}
	return f.Fake.DownloadTar(ctx, id, p, w)
}

func (f *pauseFake) UploadTar(ctx context.Context, id, dir string, r io.Reader, opts sandbox.TarOptions) (sandbox.TarStats, error) {
	if err := f.frozen(id, "upload tar"); err != nil {
		return sandbox.TarStats{}, err
	}
	return f.Fake.UploadTar(ctx, id, dir, r, opts)
}

func (f *pauseFake) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if _, err := f.Fake.Status(ctx, id); err != nil {
		return nil, err
	}
	if err := f.frozen(id, "dial"); err != nil {
		return nil, err
	}
	c, other := net.Pipe()
	other.Close()
	return c, nil
}

func (f *pauseFake) ListSessions(ctx context.Context, id string) ([]sandbox.SessionInfo, error) {
	if _, err := f.Fake.Status(ctx, id); err != nil {
		return nil, err
	}
	return []sandbox.SessionInfo{{Name: "main", Shell: "/bin/sh"}}, nil
}

func (f *pauseFake) DeleteSession(ctx context.Context, id, name string) error {
	if err := f.frozen(id, "delete session"); err != nil {
		return err
	}
	_, err := f.Fake.Status(ctx, id)
	return err
}

// openPause starts an edge whose one backend is be: 1 GiB admitted once,
// the sandboxes' defaults of 64 MiB, with metrics, and no reconcile tick
// (tests call reconcileOnce).
func (n *testNode) openPause(be sandbox.Backend) *Edge {
	n.t.Helper()
	e, err := New(context.Background(), Config{
		Node: "n", StateDir: n.dir,
		Backends: map[string]sandbox.Backend{"fake": be},
		Images:   fakeImages{}, MemoryBytes: 1 << 30, MemoryOvercommit: 1, MemoryReserve: 1, CPUs: 2,
		Defaults:    Defaults{MemoryBytes: 64 * testMiB, DiskBytes: 16 * testMiB},
		OutputQuota: 16 * testMiB, ReconcileEvery: time.Hour,
		Logger: slog.New(slog.DiscardHandler), Metrics: metrics.New(),
	})
	if err != nil {
		n.t.Fatalf("New = %v", err)
	}
	e.diskSpace = func() (ceiling.Space, error) { return ceiling.Space{Free: 1 << 40, Size: 1 << 41}, nil }
	return e
}

func (f *pauseFake) Delete(ctx context.Context, id string) error {
	if err := f.Fake.Delete(ctx, id); err != nil {
		return err
	}
	f.p.mu.Lock()
	delete(f.p.paused, id)
	f.p.mu.Unlock()
	return nil
}
