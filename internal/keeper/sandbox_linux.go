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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/diskquota"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/nsexec"
	"github.com/dsecproject/dsec/internal/oci"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// box is one sandbox in the keeper.
type box struct {
	// op serialises create, delete and exec starts on this sandbox.
	op sync.Mutex

	mu sync.Mutex
	// guarded by mu
	info    SandboxInfo
	layers  []string // digests acquired, lowest first
	mounted bool     // root overlay mounted in our namespace
	// layerFailed is set once a failed read of a lazy layer was reported.
	layerFailed bool
	deleting    bool
	execs       map[string]*execProc
	procs       []string // cgroup.procs files an exec joins, once known
	// initExit receives the init's wait status (set once it runs);
	// watched is set once watchInit reads it.
	initExit <-chan syscall.WaitStatus
	watched  bool

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

// paths of one sandbox's directory.
type boxPaths struct{ dir string }

func (p boxPaths) bundle() string { return filepath.Join(p.dir, "bundle") }
func (p boxPaths) rootfs() string { return filepath.Join(p.dir, "rootfs") }
func (p boxPaths) upper() string  { return filepath.Join(p.dir, "upper") }
func (p boxPaths) work() string   { return filepath.Join(p.dir, "work") }

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
	b := k.newBox(SandboxInfo{ID: req.ID, State: StateCreating, Created: time.Now().UTC()})
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
			k.destroy(context.WithoutCancel(ctx), b)
			k.mu.Lock()
			delete(k.boxes, req.ID)
			k.mu.Unlock()
		}
	}()

	if k.warm.size() > 0 {
		if k.claimWarm(ctx, b, req) {
			return b.snapshot(), nil
		}
		k.warm.want(req)
	}
	if err := k.start(ctx, b, req); err != nil {
		return info, err
	}
	return b.snapshot(), nil
}

// start starts the sandbox req asks for as b, whose info names it: a user's
// sandbox by its ID, a warm one by its Slot. On failure the caller destroys
// b. The init's end is watched once b is a user's sandbox (see watchInit).
func (k *Keeper) start(ctx context.Context, b *box, req CreateRequest) error {
	slot, dir := b.info.slot(), b.dir(k.l)
	tm := newPhases("create")
	defer func() { k.log.Debug("create phases", "sandbox", slot, "ms", tm.String()) }()
	p := boxPaths{dir: dir}
	for _, d := range []string{p.bundle(), p.rootfs(), p.upper(), p.work(), filepath.Join(p.dir, "execs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("sandbox dir: %w", err)
		}
	}
	tm.mark("dirs")
	upper, work := p.upper(), p.work()
	if k.disk != nil {
		// The writable layer lives on its own size-limited file system: a
		// ready one from the pool, or a new one.
		name := k.pool.take(req.Resources.DiskBytes)
		if name == "" {
			name = slot
			if _, err := k.disk.Create(ctx, name, req.Resources.DiskBytes, 0); err != nil {
				return fmt.Errorf("sandbox disk: %w", err)
			}
		}
		b.mu.Lock()
		b.info.DiskLimit = req.Resources.DiskBytes
		b.info.Disk = name
		b.mu.Unlock()
		d := k.disk.Dir(name)
		upper, work = d.Upper, d.Work
	}
	// The sandbox's own host ids, held until destroy gives them back.
	ids, err := k.uids.take()
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.info.IDBase, b.info.IDSize = ids.HostID, ids.Size
	b.mu.Unlock()
	root := int(ids.HostID)
	if err := os.Chown(upper, root, root); err != nil {
		return fmt.Errorf("sandbox dir: %w", err)
	}
	if err := os.Chmod(upper, 0o755); err != nil {
		return fmt.Errorf("sandbox dir: %w", err)
	}
	if err := os.Chmod(p.dir, 0o711); err != nil {
		return fmt.Errorf("sandbox dir: %w", err)
	}
	tm.mark("disk")

	// The user namespace is made by a helper running as the sandbox's host
	// root, so the kernel charges the sandbox's counts to that uid and not
	// to the host's root; the runtime joins it.
	userns, err := nsexec.NewUserNS(k.self, ids.HostID, ids.Size, usernsLimits, k.startHelper)
	if err != nil {
		return fmt.Errorf("sandbox user namespace: %w", err)
	}
	defer userns.Close()
	tm.mark("userns")

	views := make([]*os.File, 0, len(req.Layers))
	defer func() {
		for _, v := range views {
			v.Close()
		}
	}()
	for i := len(req.Layers) - 1; i >= 0; i-- { // overlay wants the top first
		l := req.Layers[i]
		var raw string
		var err error
		switch {
		case l.Lazy == nil:
			raw, err = k.layers.Acquire(l.Digest, l.Path)
		case k.lazy == nil:
			err = errdefs.Newf(errdefs.ErrFailedPrecondition,
				"layer %s is stored for lazy loading only, and this node has no blob source: start it with --blob-source", l.Digest)
		default:
			raw, err = k.layers.AcquireLazy(l.Digest, k.lazy.opener(ctx, l))
			b.mu.Lock()
			b.info.Lazy = true
			b.mu.Unlock()
		}
		if err != nil {
			return err
		}
		b.mu.Lock()
		b.layers = append(b.layers, l.Digest)
		b.mu.Unlock()
		view, err := rootfs.IDMapped(raw, userns.File())
		if err != nil {
			return err
		}
		views = append(views, view)
	}
	tm.mark("layers")
	if err := rootfs.Overlay(p.rootfs(), upper, work, views); err != nil {
		return err
	}
	b.mu.Lock()
	b.mounted = true
	b.mu.Unlock()

	tm.mark("overlay")
	res := cgroup.Resources{MemoryBytes: req.Resources.MemoryBytes, CPUs: req.Resources.CPUs, Pids: req.Resources.Pids}
	if err := k.cg.Create(slot, res); err != nil {
		return fmt.Errorf("sandbox cgroup: %w", err)
	}
	spec := oci.New(oci.Options{
		Rootfs:      p.rootfs(),
		Hostname:    slot,
		Args:        []string{"/proc/self/fd/3"},
		Env:         nsexec.InitEnv(),
		HostUID:     ids.HostID,
		HostGID:     ids.HostID,
		Size:        ids.Size,
		UserNS:      userns.Path(),
		CgroupsPath: "/" + k.cfg.CgroupParent + "/" + slot,
		Caps:        nsexec.CapNames(nsexec.DefaultCaps),
	})
	tm.mark("cgroup")
	if err := oci.WriteBundle(p.bundle(), spec); err != nil {
		return err
	}
	tm.mark("bundle")
	ran := time.Now()
	pid, err := k.runtimeRun(ctx, slot, p)
	tm.mark("runtime")
	if err != nil {
		return err
	}
	userns.Close() // the init holds the namespace now
	exitCh := k.reaper.watch(pid, ran)
	st, err := ProcStartTime(pid)
	if err != nil {
		return fmt.Errorf("sandbox init ended at start: %w", err)
	}
	k.detachMounts(b, p)
	if err := k.cg.Add(slot, pid); err != nil {
		// crun and runc put the init in the v1 groups; this adds the
		// cgroup2 group of hybrid hosts.
		return fmt.Errorf("sandbox cgroup: %w", err)
	}
	ns, err := namespacesOf(pid)
	if err != nil {
		return fmt.Errorf("sandbox init ended at start: %w", err)
	}
	b.mu.Lock()
	b.info.Pid = pid
	b.info.StartTime = st
	b.info.NS = ns
	b.info.State = StateRunning
	b.initExit = exitCh
	info := b.info
	b.mu.Unlock()
	if err := writeJSON(filepath.Join(p.dir, "keeper.json"), info); err != nil {
		return err
	}
	tm.mark("record")
	if info.ID != "" {
		k.watchInit(b)
	}
	return nil
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

// detachMounts drops the sandbox's root and writable-layer mounts from the
// keeper's mount namespace once the sandbox has its own copies: every new
// sandbox's mount namespace starts as a copy of the keeper's, so keeping
// them would make each create cost more with every sandbox on the node.
// The file systems live on through the sandbox's mounts; the keeper reaches
// them through /proc/<init>/root.
func (k *Keeper) detachMounts(b *box, p boxPaths) {
	if err := rootfs.Unmount(p.rootfs()); err != nil {
		k.log.Warn("detach sandbox root", "err", err)
	}
	b.mu.Lock()
	b.mounted = false
	disk := b.info.Disk
	b.mu.Unlock()
	if k.disk != nil && disk != "" && k.disk.Mode() == diskquota.ModeImage {
		if err := rootfs.Unmount(k.disk.Dir(disk).Path); err != nil {
			k.log.Warn("detach sandbox disk", "err", err)
		}
	}
}

// runtimeRun runs the OCI runtime's `run --detach` and returns the init's
// pid. The init is the dsec binary (fd 3) and reads its seccomp filter from
// fd 4 (nsexec.InitFilterFD), both kept open for it with --preserve-fds.
func (k *Keeper) runtimeRun(ctx context.Context, id string, p boxPaths) (int, error) {
	filter, err := filterPipe(k.seccomp)
	if err != nil {
		return 0, fmt.Errorf("start sandbox %s: %w", id, err)
	}
	defer filter.Close()
	// The runtime starts inside the sandbox's cgroup2 group, so the cgroup
	// namespace it makes has that group as its root and /proc/self/cgroup
	// inside names no group of the host (v1 groups the runtime joins
	// itself before it makes the namespace).
	sys := &syscall.SysProcAttr{}
	if dir := k.cg.V2Dir(id); dir != "" {
		cg, err := os.Open(dir)
		if err != nil {
			return 0, fmt.Errorf("start sandbox %s: open its cgroup: %w", id, err)
		}
		defer cg.Close()
		sys.UseCgroupFD, sys.CgroupFD = true, int(cg.Fd())
	}
	pidFile := filepath.Join(p.bundle(), "init.pid")
	out, err := k.runtimeIn(ctx, sys, []uintptr{k.self.Fd(), filter.Fd()},
		"run", "--detach", "--preserve-fds", "2", "--pid-file", pidFile, "--bundle", p.bundle(), id)
	if err != nil {
		return 0, fmt.Errorf("start sandbox %s: %w: %s", id, err, out)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, fmt.Errorf("start sandbox %s: read init pid: %w", id, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("start sandbox %s: bad init pid %q", id, b)
	}
	return pid, nil
}

// runtimeRoot is the OCI runtime's state directory (--root): one directory
// per container, named by its ID.
func (k *Keeper) runtimeRoot() string {
	return filepath.Join(k.l.RunDir(), filepath.Base(k.cfg.Runtime))
}

// runtime runs the OCI runtime with extra fds from 3 on and returns its
// combined output.
func (k *Keeper) runtime(ctx context.Context, extra []uintptr, args ...string) (string, error) {
	return k.runtimeIn(ctx, &syscall.SysProcAttr{}, extra, args...)
}

// runtimeIn is runtime with the process attributes sys.
func (k *Keeper) runtimeIn(ctx context.Context, sys *syscall.SysProcAttr, extra []uintptr, args ...string) (string, error) {
	argv := append([]string{k.cfg.Runtime, "--root", k.runtimeRoot()}, args...)
	out, err := k.runIn(ctx, sys, argv, extra)
	msg := strings.TrimSpace(string(bytes.ToValidUTF8(out, nil)))
	if err != nil {
		return msg, fmt.Errorf("%s %s: %w", filepath.Base(k.cfg.Runtime), args[0], err)
	}
	return msg, nil
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
		// Nothing in memory: remove whatever is left on disk.
		k.destroy(ctx, &box{info: SandboxInfo{ID: id}, exited: closedChan()})
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
	k.destroy(ctx, b)
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

// destroy removes everything of a sandbox, in reverse order of creation;
// every step is idempotent so that a half-made sandbox is removed too.
func (k *Keeper) destroy(ctx context.Context, b *box) {
	b.mu.Lock()
	id, slot := b.info.ID, b.info.slot()
	b.mu.Unlock()
	dir := b.dir(k.l)
	log := k.log.With("sandbox", id, "slot", slot)
	tm := newPhases("delete")
	defer func() { log.Debug("delete phases", "ms", tm.String()) }()
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := k.cg.Kill(kctx, slot); err != nil {
		log.Warn("kill sandbox processes", "err", err)
	}
	b.mu.Lock()
	started := b.info.Pid > 0
	var ended <-chan struct{} = b.exited
	if b.initExit != nil && !b.watched {
		// Nothing reads the init's end but us (a warm sandbox).
		ended = waitAny(b.initExit)
	}
	b.mu.Unlock()
	tm.mark("kill")
	initEnded := false
	if started {
		select {
		case <-ended:
			initEnded = true
		case <-time.After(5 * time.Second):
			log.Warn("sandbox init did not end after kill")
		}
	}
	tm.mark("ended")
	if initEnded {
		// Of a container whose init has ended, the runtime keeps nothing
		// but its state directory (the cgroups are ours): removing it is
		// what `delete` would do, without starting the runtime (~40 ms).
		if err := os.RemoveAll(filepath.Join(k.runtimeRoot(), slot)); err != nil {
			log.Warn("remove runtime state", "err", err)
		}
	} else if out, err := k.runtime(kctx, nil, "delete", "--force", slot); err != nil && !strings.Contains(out, "not exist") && !strings.Contains(out, "not found") {
		log.Warn("runtime delete", "err", err, "output", out)
	}
	tm.mark("runtime")
	p := boxPaths{dir: dir}
	if err := rootfs.Unmount(p.rootfs()); err != nil {
		log.Warn("unmount sandbox root", "err", err)
	}
	b.mu.Lock()
	layers := b.layers
	b.layers = nil
	b.mounted = false
	b.mu.Unlock()
	for _, d := range layers {
		k.layers.Release(d)
	}
	tm.mark("unmount")
	if k.disk != nil {
		b.mu.Lock()
		disk := b.info.Disk
		b.mu.Unlock()
		names := []string{slot} // a disk made before it was recorded
		if disk != "" && disk != slot {
			names = append(names, disk)
		}
		for _, name := range names {
			if err := k.disk.Remove(kctx, name); err != nil {
				log.Warn("remove sandbox disk", "disk", name, "err", err)
			}
		}
	}
	tm.mark("disk")
	if err := k.cg.Delete(kctx, slot); err != nil {
		log.Warn("remove sandbox cgroup", "err", err)
	}
	// What the runtime made for the same path where the manager does not
	// look (`delete` removed it when it ran): groups in the other v1
	// hierarchies (devices, blkio, ...), empty by now, and directories in
	// the place of the cgroup2 mount, which the keeper's namespace hides.
	more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", k.cfg.CgroupParent, slot))
	for _, d := range more {
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err != nil {
			continue
		}
		var err error
		switch st.Type {
		case unix.CGROUP_SUPER_MAGIC:
			err = unix.Rmdir(d)
		case unix.TMPFS_MAGIC:
			err = os.RemoveAll(d)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			log.Warn("remove sandbox cgroup", "dir", d, "err", err)
		}
	}
	tm.mark("cgroup")
	if err := os.RemoveAll(p.dir); err != nil {
		log.Warn("remove sandbox dir", "err", err)
	}
	tm.mark("dir")
	// Last: nothing of the sandbox runs or is left with its ids.
	b.mu.Lock()
	ids, held := b.info.IDs(k.cfg.IDMap), b.info.IDBase != 0 || b.info.Adopted
	b.info.IDBase, b.info.IDSize = 0, 0
	b.info.Adopted = false
	b.mu.Unlock()
	if held {
		k.uids.put(ids)
	}
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
	s, err := k.cg.Stats(b.snapshot().slot())
	if err != nil {
		return Stats{}, err
	}
	st := Stats{
		MemoryBytes: s.MemoryBytes, MemoryLimit: s.MemoryLimit, CPUUsage: s.CPUUsage,
		Pids: s.Pids, PidsLimit: s.PidsLimit, OOMKills: uint64(s.OOMKills),
		OutputLimit: k.cfg.OutputQuota, OutputBytes: k.cfg.OutputQuota - b.outputLeft.Load(),
	}
	st.DiskBytes, st.DiskLimit = k.diskUsage(id)
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

// boxProcs returns the cgroup.procs files of a sandbox, computed once.
func (k *Keeper) boxProcs(b *box) ([]string, error) {
	b.mu.Lock()
	procs, slot := b.procs, b.info.slot()
	b.mu.Unlock()
	if procs != nil {
		return procs, nil
	}
	procs, err := k.procsFiles(slot)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.procs = procs
	b.mu.Unlock()
	return procs, nil
}

// procsFiles lists the cgroup.procs files an exec joins: the groups the
// cgroup manager made, and those the runtime added for the same path in the
// other v1 hierarchies (devices, blkio, name=systemd), so that a command
// sits in exactly the init's groups.
func (k *Keeper) procsFiles(id string) ([]string, error) {
	files, err := k.cg.ProcsFiles(id)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, f := range files {
		if real, err := filepath.EvalSymlinks(f); err == nil {
			seen[real] = true
		}
		seen[f] = true
	}
	more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", k.cfg.CgroupParent, id, "cgroup.procs"))
	for _, f := range more {
		real, err := filepath.EvalSymlinks(f)
		if err != nil || seen[real] || seen[f] {
			continue
		}
		seen[real] = true
		files = append(files, f)
	}
	return files, nil
}

// diskUsage reports a sandbox's writable layer use and limit (0, 0 when
// no disk limits are set up).
func (k *Keeper) diskUsage(id string) (used, limit int64) {
	if k.disk == nil {
		return 0, 0
	}
	b, err := k.lookup(id)
	if err != nil {
		return 0, 0
	}
	info := b.snapshot()
	if k.disk.Mode() == diskquota.ModeImage {
		// The disk is mounted in the sandbox only; its root's statfs is
		// the writable layer's (overlayfs reports its upper file system).
		var st unix.Statfs_t
		if info.Pid <= 0 || unix.Statfs(fmt.Sprintf("/proc/%d/root", info.Pid), &st) != nil {
			return 0, info.DiskLimit
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize, info.DiskLimit
	}
	used, _, err = k.disk.Usage(info.Disk)
	if err != nil {
		return 0, 0
	}
	return used, info.DiskLimit
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
