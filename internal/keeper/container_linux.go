package keeper

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/diskquota"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/nsexec"
	"github.com/dsecproject/dsec/internal/oci"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/seccomp"
)

// containerDriverName is the container driver's name.
const containerDriverName = "container"

// containerDriver runs sandboxes as containers: an OCI runtime (crun or
// runc) starts the init (the dsec binary, non-dumpable, with its seccomp
// filter) in namespaces of its own and a user namespace made as the
// sandbox's own host id range, in a cgroup below CgroupParent, on an
// overlay root over read-only EROFS layers and a writable layer on a
// size-limited disk. Execs join the init's namespaces and cgroups through
// the exec zygote (or the helper binary). See driver_linux.go for what the
// core does around it.
type containerDriver struct {
	k   *Keeper // the core: reaper, process runner, events, sandboxes
	cfg *Config // the core's
	l   Layout
	log *slog.Logger

	self   *os.File // the dsec binary, passed to the runtime for the init
	cg     *cgroup.Manager
	layers *rootfs.Layers
	uids   *uidPool // the sandboxes' host id ranges
	zyg    *zygotes
	// seccomp is the filter every exec'd command gets.
	seccomp []byte
	// disk limits writable layers (nil when off); pool holds ready ones.
	disk *diskquota.FS
	pool *diskPool
	// warm keeps sandboxes of recent shapes started (size 0: none).
	warm *warmPool
	// lazy mounts layers from their lazy form (nil: no blob source).
	lazy *lazyLayers
	// ceiling is what all sandboxes together may use (ceiling_linux.go);
	// zero: unknown.
	ceiling ceiling.Sandboxes

	mu sync.Mutex
	// packing holds the sandboxes being packed (see pack_linux.go);
	// guarded by mu.
	packing map[string]bool
	// sealing holds the sandboxes running a sealed exec, with its id
	// (seal_linux.go); guarded by mu.
	sealing map[string]string
}

// containerBox is the container driver's state of one sandbox, guarded
// by the box's mu.
type containerBox struct {
	layers  []string // digests acquired, lowest first
	mounted bool     // root overlay mounted in the keeper's namespace
	// layerFailed is set once a failed read of a lazy layer was reported.
	layerFailed bool
	procs       []string // cgroup.procs files an exec joins, once known
}

var _ Driver = (*containerDriver)(nil)

// newContainerDriver sets the container driver up for the core k, whose
// reaper runs.
func newContainerDriver(k *Keeper) (_ *containerDriver, err error) {
	c := &containerDriver{k: k, cfg: &k.cfg, l: k.l, log: k.log}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := checkStatic(c.cfg.Self); err != nil {
		return nil, err
	}
	if c.self, err = os.Open(c.cfg.Self); err != nil {
		return nil, fmt.Errorf("open dsec binary: %w", err)
	}
	if err := hideCgroup2(c.l.RunDir()); err != nil {
		return nil, err
	}
	layout, err := cgroup.DetectLayout()
	if err != nil {
		return nil, fmt.Errorf("detect cgroups: %w", err)
	}
	if c.cg, err = c.newCgroups(layout); err != nil { // with the host ceilings (ceiling_linux.go)
		return nil, err
	}
	c.uids = newUIDPool(c.cfg.IDMap, c.cfg.UIDRanges)
	if c.layers, err = rootfs.NewLayers(filepath.Join(c.l.RunDir(), "layers"), c.log); err != nil {
		return nil, err
	}
	if c.cfg.BlobSource != "" {
		if c.lazy, err = newLazyLayers(*c.cfg, c.l.RunDir(), c.log, c.lazyFailed); err != nil {
			return nil, err
		}
	}
	// Every command agents run descends from an exec, which gets this filter.
	if c.seccomp, err = seccomp.Default().Compile(seccomp.NativeArch()); err != nil {
		return nil, fmt.Errorf("seccomp policy: %w", err)
	}
	c.zyg = &zygotes{c: c}
	// Started now, so the first exec does not pay for it.
	c.zyg.get()
	if err := c.openDisk(); err != nil {
		return nil, err
	}
	// Always there, so that a live settings change can turn it on.
	c.warm = newWarmPool(c, max(c.cfg.WarmPool, 0))
	return c, nil
}

// Name implements Driver.
func (c *containerDriver) Name() string { return containerDriverName }

// Close implements Driver.
func (c *containerDriver) Close() {
	if c.zyg != nil {
		c.zyg.close()
	}
	if c.lazy != nil {
		c.lazy.close()
	}
	if c.self != nil {
		c.self.Close()
	}
}

// Run implements Driver: the OOM watcher and the pools of ready disks and
// warm sandboxes.
func (c *containerDriver) Run(ctx context.Context) {
	var wg sync.WaitGroup
	run := func(f func(context.Context)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx)
		}()
	}
	run(c.watchOOM)
	if c.pool != nil {
		run(c.pool.run)
	}
	run(c.warm.run)
	wg.Wait()
}

// Start implements Driver: a warm sandbox of req's shape is claimed when
// one is ready, else one is started.
func (c *containerDriver) Start(ctx context.Context, b *box, req CreateRequest) error {
	if err := c.checkCeiling(req.Resources); err != nil {
		return err
	}
	if c.warm.size() > 0 {
		if c.claimWarm(ctx, b, req) {
			return nil
		}
		c.warm.want(req)
	}
	return c.start(ctx, b, req)
}

// Adopt implements Driver: the sandbox's id range is held again.
func (c *containerDriver) Adopt(b *box) {
	b.mu.Lock()
	ids, slot, id, paused := b.info.IDs(c.cfg.IDMap), b.info.slot(), b.info.ID, b.info.Paused
	b.mu.Unlock()
	c.uids.hold(ids)
	tctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if paused {
		// A paused sandbox stays paused across keepers, whatever state
		// its group was left in (a keeper that ended between recording
		// the pause and freezing, or between thawing and recording the
		// resume): frozen, and allowed to swap.
		if err := c.cg.Freeze(tctx, slot); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			c.log.Warn("freeze adopted paused sandbox", "sandbox", id, "err", err)
		}
		if err := c.cg.AllowSwap(slot, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			c.log.Warn("let adopted paused sandbox swap", "sandbox", id, "err", err)
		}
		return
	}
	// Nothing else freezes a sandbox across keepers: one found frozen was
	// left so by a keeper that ended during a pack or a sealed exec (whose
	// cgroup Sweep removes).
	if err := c.cg.Thaw(tctx, slot); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		c.log.Warn("thaw adopted sandbox", "sandbox", id, "err", err)
	}
	// Made by a keeper that let running sandboxes swap: this one does not.
	if err := c.cg.AllowSwap(slot, false); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		c.log.Warn("keep adopted sandbox from swapping", "sandbox", id, "err", err)
	}
}

// Sweep implements Driver: disks and cgroups of no sandbox are removed.
func (c *containerDriver) Sweep(ctx context.Context, used map[string]bool) {
	if c.disk != nil {
		dirs, err := c.disk.List()
		if err != nil {
			c.log.Warn("list sandbox disks", "err", err)
		}
		for _, d := range dirs {
			if !used[d.Name] {
				c.log.Info("removing orphaned sandbox disk", "name", d.Name)
				_ = c.disk.Remove(ctx, d.Name)
			}
		}
	}
	groups, err := c.cg.List()
	if err != nil {
		c.log.Warn("list cgroups", "err", err)
		return
	}
	for _, g := range groups {
		if used[g] {
			continue
		}
		if strings.HasSuffix(g, ".seal") {
			// A sealed exec's, whose keeper ended: what it ran is lost.
			c.log.Info("removing the cgroup of a lost sealed exec", "name", g)
			c.removeSealGroup(ctx, g)
			continue
		}
		c.log.Info("removing orphaned cgroup", "name", g)
		if err := c.cg.Delete(ctx, g); err != nil {
			c.log.Warn("remove orphaned cgroup", "name", g, "err", err)
		}
	}
}

// Exec implements Driver: the command joins the init's namespaces (only
// those it was started in, never ones an agent got it into) and cgroups,
// with the sandbox's capabilities and the seccomp filter.
func (c *containerDriver) Exec(ctx context.Context, b *box, spec ExecSpec, stdio [3]*os.File) (int, error) {
	info := b.snapshot()
	if err := CheckNamespaces(info.Pid, info.NS); err != nil {
		return 0, fmt.Errorf("sandbox %s: %w", info.ID, err)
	}
	procs, err := c.boxProcs(b)
	if err != nil {
		return 0, err
	}
	cfg := nsexec.ExecConfig{
		Pid:         info.Pid,
		CgroupProcs: procs,
		UID:         spec.UID,
		GID:         spec.GID,
		Groups:      spec.Groups,
		Cwd:         spec.Cwd,
		Argv:        spec.Argv,
		Env:         spec.Env,
		KeepCaps:    nsexec.DefaultCaps,
		Seccomp:     c.seccomp,
		Setsid:      true,
		TTY:         spec.TTY,
	}
	if cfg.Cwd == "" {
		cfg.Cwd = "/"
	}
	return c.spawn(cfg, stdio)
}

// Terminal implements Driver: a terminal of the sandbox's own devpts,
// owned by the exec's user and the sandbox's tty group (5).
func (c *containerDriver) Terminal(b *box, spec ExecSpec) (master, slave *os.File, err error) {
	info := b.snapshot()
	ids := info.IDs(c.cfg.IDMap)
	return openPTY(info.Pid, ids.HostID+spec.UID, ids.HostID+5, spec.Rows, spec.Cols)
}

// OOMKills implements Driver: one file, not a full Stats, as it is on
// every exec's path.
func (c *containerDriver) OOMKills(b *box) (int64, error) {
	return c.cg.OOMKills(b.snapshot().slot())
}

// Stats implements Driver.
func (c *containerDriver) Stats(b *box) (Stats, error) {
	info := b.snapshot()
	s, err := c.cg.Stats(info.slot())
	if err != nil {
		return Stats{}, err
	}
	st := Stats{
		MemoryBytes: s.MemoryBytes, MemoryLimit: s.MemoryLimit, CPUUsage: s.CPUUsage,
		Pids: s.Pids, PidsLimit: s.PidsLimit, OOMKills: uint64(s.OOMKills),
	}
	st.DiskBytes, st.DiskLimit = c.diskUsage(info)
	if m, err := c.cg.Memory(info.slot()); err == nil {
		st.SwappedBytes = m.Swapped
	}
	return st, nil
}

// setWarmPool changes how many warm sandboxes are kept per shape (a live
// setting; 0 or less: none).
func (c *containerDriver) setWarmPool(n int) { c.warm.resize(max(n, 0)) }

// openDisk sets up the limits of writable layers.
func (c *containerDriver) openDisk() error {
	mode := c.cfg.DiskQuota
	if mode == "off" {
		c.log.Warn("writable layers are not size-limited (--disk-quota off)")
		return nil
	}
	if mode == "auto" {
		mode = ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fs, err := diskquota.Open(ctx, diskquota.Config{
		Mode:       diskquota.Mode(mode),
		Image:      filepath.Join(c.cfg.StateDir, "disk", "layers.xfs"),
		Size:       c.cfg.DiskSize,
		MountPoint: filepath.Join(c.l.RunDir(), "disks"),
		Logger:     c.log,
		Run: func(ctx context.Context, path string, args []string) ([]byte, error) {
			return c.k.run(ctx, append([]string{path}, args...), nil)
		},
	})
	if err != nil {
		return fmt.Errorf("disk limits: %w (run `dsec doctor`; --disk-quota off runs without them)", err)
	}
	c.disk = fs
	if c.cfg.DiskPool > 0 {
		c.pool = newDiskPool(c, c.cfg.DiskPoolBytes, c.cfg.DiskPool)
	}
	c.log.Info("writable layers are size-limited", "mode", fs.Mode(), "pool", c.cfg.DiskPool)
	return nil
}

// checkStatic refuses a dynamically linked dsec binary: it must also run
// as the init inside root file systems that have no C library.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("read dsec binary %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errdefs.Newf(errdefs.ErrFailedPrecondition,
				"%s is dynamically linked; the keeper needs the static build (`make build`)", path)
		}
	}
	return nil
}

// hideCgroup2 moves a hybrid host's cgroup2 mount (/sys/fs/cgroup/unified)
// out of the way inside the keeper's mount namespace: crun refuses hybrid
// hosts, and the keeper still reaches cgroup2 (for kill, freeze and events)
// at its new place. The host's own mounts are not touched.
func hideCgroup2(runDir string) error {
	const unified = "/sys/fs/cgroup/unified"
	var st unix.Statfs_t
	if err := unix.Statfs(unified, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil
	}
	dst := filepath.Join(runDir, "cgroup2")
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	if err := unix.Mount(unified, dst, "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move cgroup2 mount in the keeper's namespace: %w", err)
	}
	return nil
}

// paths of one sandbox's directory.
type boxPaths struct{ dir string }

func (p boxPaths) bundle() string { return filepath.Join(p.dir, "bundle") }
func (p boxPaths) rootfs() string { return filepath.Join(p.dir, "rootfs") }
func (p boxPaths) upper() string  { return filepath.Join(p.dir, "upper") }
func (p boxPaths) work() string   { return filepath.Join(p.dir, "work") }

// start starts the sandbox req asks for as b, whose info names it: a user's
// sandbox by its ID, a warm one by its Slot. On failure the caller destroys
// b. The core records a user's sandbox and watches its init's end.
func (c *containerDriver) start(ctx context.Context, b *box, req CreateRequest) error {
	slot, dir := b.info.slot(), b.dir(c.l)
	tm := newPhases("create")
	defer func() { c.log.Debug("create phases", "sandbox", slot, "ms", tm.String()) }()
	p := boxPaths{dir: dir}
	for _, d := range []string{p.bundle(), p.rootfs(), p.upper(), p.work(), filepath.Join(p.dir, "execs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("sandbox dir: %w", err)
		}
	}
	tm.mark("dirs")
	upper, work := p.upper(), p.work()
	if c.disk != nil {
		// The writable layer lives on its own size-limited file system: a
		// ready one from the pool, or a new one.
		name := c.pool.take(req.Resources.DiskBytes)
		if name == "" {
			name = slot
			if _, err := c.disk.Create(ctx, name, req.Resources.DiskBytes, 0); err != nil {
				return fmt.Errorf("sandbox disk: %w", err)
			}
		}
		b.mu.Lock()
		b.info.DiskLimit = req.Resources.DiskBytes
		b.info.Disk = name
		b.mu.Unlock()
		d := c.disk.Dir(name)
		upper, work = d.Upper, d.Work
	}
	// The sandbox's own host ids, held until destroy gives them back.
	ids, err := c.uids.take()
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
	userns, err := nsexec.NewUserNS(c.self, ids.HostID, ids.Size, usernsLimits, c.k.startHelper)
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
			raw, err = c.layers.Acquire(l.Digest, l.Path)
		case c.lazy == nil:
			err = errdefs.Newf(errdefs.ErrFailedPrecondition,
				"layer %s is stored for lazy loading only, and this node has no blob source: start it with --blob-source", l.Digest)
		default:
			raw, err = c.layers.AcquireLazy(l.Digest, c.lazy.opener(ctx, l))
			b.mu.Lock()
			b.info.Lazy = true
			b.mu.Unlock()
		}
		if err != nil {
			return err
		}
		b.mu.Lock()
		b.ct.layers = append(b.ct.layers, l.Digest)
		b.mu.Unlock()
		view, err := rootfs.IDMapped(raw, userns.File())
		if err != nil {
			return err
		}
		views = append(views, view)
	}
	tm.mark("layers")
	if err := writeLayerRecord(dir, req.Layers); err != nil {
		return err
	}
	if err := rootfs.Overlay(p.rootfs(), upper, work, views); err != nil {
		return err
	}
	b.mu.Lock()
	b.ct.mounted = true
	b.mu.Unlock()

	tm.mark("overlay")
	res := cgroup.Resources{MemoryBytes: req.Resources.MemoryBytes, CPUs: req.Resources.CPUs, Pids: req.Resources.Pids}
	if err := c.cg.Create(slot, res); err != nil {
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
		CgroupsPath: "/" + c.cfg.CgroupParent + "/" + slot,
		Caps:        nsexec.CapNames(nsexec.DefaultCaps),
	})
	tm.mark("cgroup")
	if err := oci.WriteBundle(p.bundle(), spec); err != nil {
		return err
	}
	tm.mark("bundle")
	ran := time.Now()
	pid, err := c.runtimeRun(ctx, slot, p)
	tm.mark("runtime")
	if err != nil {
		return err
	}
	userns.Close() // the init holds the namespace now
	exitCh := c.k.reaper.watch(pid, ran)
	st, err := ProcStartTime(pid)
	if err != nil {
		return fmt.Errorf("sandbox init ended at start: %w", err)
	}
	c.detachMounts(b, p)
	if err := c.cg.Add(slot, pid); err != nil {
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
	b.mu.Unlock()
	return nil
}

// detachMounts drops the sandbox's root and writable-layer mounts from the
// keeper's mount namespace once the sandbox has its own copies: every new
// sandbox's mount namespace starts as a copy of the keeper's, so keeping
// them would make each create cost more with every sandbox on the node.
// The file systems live on through the sandbox's mounts; the keeper reaches
// them through /proc/<init>/root.
func (c *containerDriver) detachMounts(b *box, p boxPaths) {
	if err := rootfs.Unmount(p.rootfs()); err != nil {
		c.log.Warn("detach sandbox root", "err", err)
	}
	b.mu.Lock()
	b.ct.mounted = false
	disk := b.info.Disk
	b.mu.Unlock()
	if c.disk != nil && disk != "" && c.disk.Mode() == diskquota.ModeImage {
		if err := rootfs.Unmount(c.disk.Dir(disk).Path); err != nil {
			c.log.Warn("detach sandbox disk", "err", err)
		}
	}
}

// runtimeRun runs the OCI runtime's `run --detach` and returns the init's
// pid. The init is the dsec binary (fd 3) and reads its seccomp filter from
// fd 4 (nsexec.InitFilterFD), both kept open for it with --preserve-fds.
func (c *containerDriver) runtimeRun(ctx context.Context, id string, p boxPaths) (int, error) {
	filter, err := filterPipe(c.seccomp)
	if err != nil {
		return 0, fmt.Errorf("start sandbox %s: %w", id, err)
	}
	defer filter.Close()
	// The runtime starts inside the sandbox's cgroup2 group, so the cgroup
	// namespace it makes has that group as its root and /proc/self/cgroup
	// inside names no group of the host (v1 groups the runtime joins
	// itself before it makes the namespace).
	sys := &syscall.SysProcAttr{}
	if dir := c.cg.V2Dir(id); dir != "" {
		cg, err := os.Open(dir)
		if err != nil {
			return 0, fmt.Errorf("start sandbox %s: open its cgroup: %w", id, err)
		}
		defer cg.Close()
		sys.UseCgroupFD, sys.CgroupFD = true, int(cg.Fd())
	}
	pidFile := filepath.Join(p.bundle(), "init.pid")
	out, err := c.runtimeIn(ctx, sys, []uintptr{c.self.Fd(), filter.Fd()},
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
func (c *containerDriver) runtimeRoot() string {
	return filepath.Join(c.l.RunDir(), filepath.Base(c.cfg.Runtime))
}

// runtime runs the OCI runtime with extra fds from 3 on and returns its
// combined output.
func (c *containerDriver) runtime(ctx context.Context, extra []uintptr, args ...string) (string, error) {
	return c.runtimeIn(ctx, &syscall.SysProcAttr{}, extra, args...)
}

// runtimeIn is runtime with the process attributes sys.
func (c *containerDriver) runtimeIn(ctx context.Context, sys *syscall.SysProcAttr, extra []uintptr, args ...string) (string, error) {
	argv := append([]string{c.cfg.Runtime, "--root", c.runtimeRoot()}, args...)
	out, err := c.k.runIn(ctx, sys, argv, extra)
	msg := strings.TrimSpace(string(bytes.ToValidUTF8(out, nil)))
	if err != nil {
		return msg, fmt.Errorf("%s %s: %w", filepath.Base(c.cfg.Runtime), args[0], err)
	}
	return msg, nil
}

// destroy removes everything of a sandbox, in reverse order of creation;
// every step is idempotent so that a half-made sandbox is removed too.
func (c *containerDriver) Destroy(ctx context.Context, b *box) {
	b.mu.Lock()
	id, slot := b.info.ID, b.info.slot()
	b.mu.Unlock()
	dir := b.dir(c.l)
	log := c.log.With("sandbox", id, "slot", slot)
	tm := newPhases("delete")
	defer func() { log.Debug("delete phases", "ms", tm.String()) }()
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.cg.Kill(kctx, slot); err != nil {
		log.Warn("kill sandbox processes", "err", err)
	}
	c.removeSealGroup(kctx, sealGroup(slot))
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
		if err := os.RemoveAll(filepath.Join(c.runtimeRoot(), slot)); err != nil {
			log.Warn("remove runtime state", "err", err)
		}
	} else if out, err := c.runtime(kctx, nil, "delete", "--force", slot); err != nil && !strings.Contains(out, "not exist") && !strings.Contains(out, "not found") {
		log.Warn("runtime delete", "err", err, "output", out)
	}
	tm.mark("runtime")
	p := boxPaths{dir: dir}
	if err := rootfs.Unmount(p.rootfs()); err != nil {
		log.Warn("unmount sandbox root", "err", err)
	}
	b.mu.Lock()
	layers := b.ct.layers
	b.ct.layers = nil
	b.ct.mounted = false
	b.mu.Unlock()
	for _, d := range layers {
		c.layers.Release(d)
	}
	tm.mark("unmount")
	if c.disk != nil {
		b.mu.Lock()
		disk := b.info.Disk
		b.mu.Unlock()
		names := []string{slot} // a disk made before it was recorded
		if disk != "" && disk != slot {
			names = append(names, disk)
		}
		for _, name := range names {
			if err := c.disk.Remove(kctx, name); err != nil {
				log.Warn("remove sandbox disk", "disk", name, "err", err)
			}
		}
	}
	tm.mark("disk")
	if err := c.cg.Delete(kctx, slot); err != nil {
		log.Warn("remove sandbox cgroup", "err", err)
	}
	// What the runtime made for the same path where the manager does not
	// look (`delete` removed it when it ran): groups in the other v1
	// hierarchies (devices, blkio, ...), empty by now, and directories in
	// the place of the cgroup2 mount, which the keeper's namespace hides.
	more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", c.cfg.CgroupParent, slot))
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
	ids, held := b.info.IDs(c.cfg.IDMap), b.info.IDBase != 0 || b.info.Adopted
	b.info.IDBase, b.info.IDSize = 0, 0
	b.info.Adopted = false
	b.mu.Unlock()
	if held {
		c.uids.put(ids)
	}
}

// boxProcs returns the cgroup.procs files of a sandbox, computed once.
func (c *containerDriver) boxProcs(b *box) ([]string, error) {
	b.mu.Lock()
	procs, slot := b.ct.procs, b.info.slot()
	b.mu.Unlock()
	if procs != nil {
		return procs, nil
	}
	procs, err := c.procsFiles(slot)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.ct.procs = procs
	b.mu.Unlock()
	return procs, nil
}

// procsFiles lists the cgroup.procs files an exec joins: the groups the
// cgroup manager made, and those the runtime added for the same path in the
// other v1 hierarchies (devices, blkio, name=systemd), so that a command
// sits in exactly the init's groups.
func (c *containerDriver) procsFiles(id string) ([]string, error) {
	files, err := c.cg.ProcsFiles(id)
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
	more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", c.cfg.CgroupParent, id, "cgroup.procs"))
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
func (c *containerDriver) diskUsage(info SandboxInfo) (used, limit int64) {
	if c.disk == nil {
		return 0, 0
	}
	if c.disk.Mode() == diskquota.ModeImage {
		// The disk is mounted in the sandbox only; its root's statfs is
		// the writable layer's (overlayfs reports its upper file system).
		var st unix.Statfs_t
		if info.Pid <= 0 || unix.Statfs(fmt.Sprintf("/proc/%d/root", info.Pid), &st) != nil {
			return 0, info.DiskLimit
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize, info.DiskLimit
	}
	used, _, err := c.disk.Usage(info.Disk)
	if err != nil {
		return 0, 0
	}
	return used, info.DiskLimit
}
