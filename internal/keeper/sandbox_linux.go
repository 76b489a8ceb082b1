package keeper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// box is one sandbox in the keeper.
type box struct {
	// op serialises create, delete and exec starts on this sandbox.
	op sync.Mutex

	mu sync.Mutex
	// guarded by mu
	info     SandboxInfo
	deleting bool
	execs    map[string]*execProc
	sessions map[string]*session // shell sessions by name, made on first use
	// initExit receives the init's wait status (set by the driver's Start
	// when the init is the keeper's child); watched is set once watchInit
	// reads it.
	initExit <-chan syscall.WaitStatus
	watched  bool
	// ct is the container driver's state of the sandbox.
	ct containerBox
	// mover moves the sandbox's memory in the background (out after a
	// pause, back after a resume); nil when none runs. moveWarning is
	// what the last move out said of memory left in RAM.
	mover       *memMove
	moveWarning string
	// pausedSince is when the current pause began (zero while running);
	// pausedTotal adds up the pauses before it (pause_linux.go).
	pausedSince time.Time
	pausedTotal time.Duration

	exited     chan struct{} // closed when the init has ended
	exitedOnce sync.Once

	// outputLeft is what the sandbox may still keep of exec output.
	outputLeft atomic.Int64
	oomSeen    atomic.Int64 // OOM kills already reported as events
}

// takeOutput reserves up to n bytes of the output budget and returns how
// many it got.
func (b *box) takeOutput(n int64) int64 {
	for {
		left := b.outputLeft.Load()
		got := min(n, max(left, 0))
		if got == 0 || b.outputLeft.CompareAndSwap(left, left-got) {
			return got
		}
	}
}

func (b *box) markExited(reason string) {
	b.exitedOnce.Do(func() {
		b.mu.Lock()
		b.info.State = StateExited
		if b.info.Reason == "" {
			b.info.Reason = reason
		}
		b.mu.Unlock()
		close(b.exited)
	})
}

func (b *box) snapshot() SandboxInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	info := b.info
	for _, p := range b.execs {
		select {
		case <-p.done:
		default:
			info.RunningExecs++
		}
	}
	return info
}

// dir is the sandbox's directory: named by its ID, or by its slot while it
// is a warm sandbox nobody has claimed.
func (b *box) dir(l Layout) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.info.ID == "" {
		return l.SandboxDir(b.info.Slot)
	}
	return l.SandboxDir(b.info.ID)
}

func (k *Keeper) newBox(info SandboxInfo) *box {
	b := &box{info: info, exited: make(chan struct{}), execs: map[string]*execProc{}}
	b.outputLeft.Store(k.cfg.OutputQuota)
	return b
}

func (k *Keeper) lookup(id string) (*box, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	b, ok := k.boxes[id]
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s not found on this node", id)
	}
	return b, nil
}

func validID(id string) error {
	if !cgroup.ValidName(id) || len(id) > 63 || strings.ContainsAny(id, "._") {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "sandbox id %q is not a DNS label", id)
	}
	return nil
}

func (k *Keeper) create(ctx context.Context, req CreateRequest) (info SandboxInfo, err error) {
	if err := validID(req.ID); err != nil {
		return info, err
	}
	if len(req.Layers) == 0 {
		return info, errdefs.Newf(errdefs.ErrInvalidArgument, "sandbox %s: no layers", req.ID)
	}
	d, err := k.driver(req.Driver)
	if err != nil {
		return info, err
	}
	b := k.newBox(SandboxInfo{ID: req.ID, State: StateCreating, Created: time.Now().UTC(), Driver: d.Name()})
	b.op.Lock()
	defer b.op.Unlock()
	k.mu.Lock()
	if _, ok := k.boxes[req.ID]; ok {
		k.mu.Unlock()
		return info, errdefs.Newf(errdefs.ErrAlreadyExists, "sandbox %s exists", req.ID)
	}
	k.boxes[req.ID] = b
	k.mu.Unlock()
	defer func() {
		if err != nil {
			d.Destroy(context.WithoutCancel(ctx), b)
			k.mu.Lock()
			delete(k.boxes, req.ID)
			k.mu.Unlock()
		}
	}()
	if err := d.Start(ctx, b, req); err != nil {
		return info, err
	}
	// The record is what a restarted keeper adopts the sandbox from.
	b.mu.Lock()
	rec := b.info
	b.mu.Unlock()
	if err := writeJSON(filepath.Join(k.l.SandboxDir(req.ID), "keeper.json"), rec); err != nil {
		return info, fmt.Errorf("record sandbox %s: %w", req.ID, err)
	}
	crashPoint("create:record")
	k.watchInit(b)
	return b.snapshot(), nil
}

// watchInit reports the end of a user's sandbox's init.
func (k *Keeper) watchInit(b *box) {
	b.mu.Lock()
	ch := b.initExit
	b.watched = true
	b.mu.Unlock()
	go func() {
		ws := <-ch
		k.exited(b, describeWait(ws, "init"))
	}()
}

// maxRunOutput bounds what run keeps of a program's output.
const maxRunOutput = 64 << 10

// run runs a program as a child the reaper waits for (never os/exec: the
// reaper would steal its exit) and returns its combined output; a failure
// says how the program ended.
//
// Its stdio are pipes, never a file or device of the host: an OCI runtime
// chowns its stdio to the container's root and hands them to the
// sandbox's init, so a host /dev/null or output file given here would be
// the sandbox's to chmod or to fill. stdin is at end of file; output is
// read until the program has ended (a detached init may hold the pipe for
// longer: what it writes later is not waited for).
func (k *Keeper) run(ctx context.Context, argv []string, extra []uintptr) ([]byte, error) {
	return k.runIn(ctx, &syscall.SysProcAttr{}, argv, extra)
}

// runIn is run with the process attributes sys.
func (k *Keeper) runIn(ctx context.Context, sys *syscall.SysProcAttr, argv []string, extra []uintptr) ([]byte, error) {
	stdin, closeStdin, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	closeStdin.Close()
	defer stdin.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer outR.Close()
	out := newBoundedBuffer(maxRunOutput)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(out, outR)
	}()
	files := append([]uintptr{stdin.Fd(), outW.Fd(), outW.Fd()}, extra...)
	t0 := time.Now()
	pid, ch, err := k.reaper.startProcess(argv, []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, files, sys, "")
	outW.Close()
	t1 := time.Now()
	defer func() {
		k.log.Debug("run", "argv0", argv[0], "fork_ms", t1.Sub(t0).Seconds()*1000, "total_ms", time.Since(t0).Seconds()*1000)
	}()
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", argv[0], err)
	}
	var ws syscall.WaitStatus
	select {
	case ws = <-ch:
	case <-ctx.Done():
		_ = syscall.Kill(pid, syscall.SIGKILL)
		ws = <-ch
	}
	// What the program wrote is in the pipe by now; stop at its end
	// rather than wait for another holder of the write end.
	_ = outR.SetReadDeadline(time.Now().Add(runDrain))
	<-copied
	if ws.Exited() && ws.ExitStatus() == 0 {
		return out.Bytes(), nil
	}
	return out.Bytes(), errors.New(describeWait(ws, filepath.Base(argv[0])))
}

// runDrain is how long run reads output still in the pipe after the
// program ended.
const runDrain = 20 * time.Millisecond

// startHelper starts a helper process as a child the reaper reaps
// (nsexec.StartFunc).
func (k *Keeper) startHelper(argv, env []string, files []uintptr, sys *syscall.SysProcAttr) (int, error) {
	pid, _, err := k.reaper.startProcess(argv, env, files, sys, "")
	return pid, err
}

// namespaceNames are the namespaces recorded of a sandbox's init.
var namespaceNames = []string{"cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts"}

// namespacesOf returns the namespaces of process pid (those this kernel
// has).
func namespacesOf(pid int) (map[string]NSID, error) {
	out := make(map[string]NSID, len(namespaceNames))
	for _, n := range namespaceNames {
		var st unix.Stat_t
		err := unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, n), &st)
		if errors.Is(err, unix.ENOENT) && n == "time" {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("namespace %s of process %d: %w", n, pid, err)
		}
		out[n] = NSID{Dev: st.Dev, Ino: st.Ino}
	}
	return out, nil
}

// CheckNamespaces fails with FailedPrecondition when process pid is not in
// the namespaces recorded of it (want; nil checks nothing). A sandbox's
// init never changes its namespaces; one that did was taken over, and
// what it sees is not what the platform set up.
func CheckNamespaces(pid int, want map[string]NSID) error {
	if want == nil {
		return nil
	}
	got, err := namespacesOf(pid)
	if err != nil {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "the sandbox's init is gone: %v", err)
	}
	for n, w := range want {
		if got[n] != w {
			return errdefs.Newf(errdefs.ErrFailedPrecondition,
				"the sandbox's init is no longer in the %s namespace it was started in: the sandbox was tampered with; delete it", n)
		}
	}
	return nil
}

// filterPipe returns the read end of a pipe that holds filter and is
// closed for writing: the init reads it to its end.
func filterPipe(filter []byte) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer w.Close()
	if len(filter) > 64<<10 {
		r.Close()
		return nil, fmt.Errorf("seccomp filter of %d bytes does not fit a pipe", len(filter))
	}
	if _, err := w.Write(filter); err != nil {
		r.Close()
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	return r, nil
}

// boundedBuffer keeps the first max bytes written to it and drops the rest.
type boundedBuffer struct {
	mu  sync.Mutex
	buf []byte // guarded by mu
	max int
}

func newBoundedBuffer(max int) *boundedBuffer { return &boundedBuffer{max: max} }

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (b *boundedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf)
}

func describeWait(ws syscall.WaitStatus, what string) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("%s exited with code %d", what, ws.ExitStatus())
	case ws.Signaled():
		return fmt.Sprintf("%s killed by signal %d (%s)", what, int(ws.Signal()), ws.Signal())
	}
	return fmt.Sprintf("%s ended (status %#x)", what, int(ws))
}

func (k *Keeper) delete(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	b, err := k.lookup(id)
	if errdefs.Is(err, errdefs.ErrNotFound) {
		// Nothing in memory: every driver removes whatever is left.
		for _, d := range k.drivers {
			d.Destroy(ctx, &box{info: SandboxInfo{ID: id}, exited: closedChan()})
		}
		k.dropNetwork(id)
		return nil
	}
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.deleting = true
	b.mu.Unlock()
	b.op.Lock()
	defer b.op.Unlock()
	k.stopMove(b) // of a paused or resumed sandbox's memory
	k.dropNetwork(id)
	k.driverOf(b).Destroy(ctx, b)
	k.vault.drop(id)
	k.mu.Lock()
	if k.boxes[id] == b {
		delete(k.boxes, id)
	}
	k.mu.Unlock()
	return nil
}

// waitAny returns a channel closed once ch has delivered.
func waitAny[T any](ch <-chan T) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		<-ch
		close(done)
	}()
	return done
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

func (k *Keeper) list() []SandboxInfo {
	k.mu.Lock()
	boxes := make([]*box, 0, len(k.boxes))
	for _, b := range k.boxes {
		boxes = append(boxes, b)
	}
	k.mu.Unlock()
	out := make([]SandboxInfo, 0, len(boxes))
	for _, b := range boxes {
		out = append(out, b.snapshot())
	}
	return out
}

func (k *Keeper) stats(id string) (Stats, error) {
	b, err := k.lookup(id)
	if err != nil {
		return Stats{}, err
	}
	st, err := k.driverOf(b).Stats(b)
	if err != nil {
		return Stats{}, err
	}
	st.OutputLimit, st.OutputBytes = k.cfg.OutputQuota, k.cfg.OutputQuota-b.outputLeft.Load()
	return st, nil
}

// shutdown optionally deletes every sandbox before the keeper exits.
func (k *Keeper) shutdown(ctx context.Context, kill bool) {
	if !kill {
		return
	}
	for _, info := range k.list() {
		if err := k.delete(ctx, info.ID); err != nil {
			k.log.Warn("delete sandbox at shutdown", "sandbox", info.ID, "err", err)
		}
	}
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// phases times the steps of an operation for debug logs. The end of each
// step is a crash point of test builds (crash_on.go): op:name.
type phases struct {
	op   string
	last time.Time
	out  []string
}

func newPhases(op string) *phases { return &phases{op: op, last: time.Now()} }

func (p *phases) mark(name string) {
	crashPoint(p.op + ":" + name)
	now := time.Now()
	p.out = append(p.out, fmt.Sprintf("%s=%.1f", name, float64(now.Sub(p.last).Microseconds())/1000))
	p.last = now
}

func (p *phases) String() string { return strings.Join(p.out, " ") }
