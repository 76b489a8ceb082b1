package keeper

import (
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/diskquota"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/seccomp"
)

// Keeper is a running keeper.
type Keeper struct {
	cfg    Config
	l      Layout
	log    *slog.Logger
	reaper *reaper
	zyg    *zygotes
	cg     *cgroup.Manager
	layers *rootfs.Layers
	uids   *uidPool // the sandboxes' host id ranges
	self   *os.File // the dsec binary, passed to the runtime for the init
	lock   *os.File
	// seccomp is the filter every exec'd command gets (nil: none).
	seccomp []byte
	// disk limits writable layers (nil when off); pool holds ready ones.
	disk *diskquota.FS
	pool *diskPool
	// warm keeps sandboxes of recent shapes started (nil: none).
	warm   *warmPool
	events *eventLog
	// lazy mounts layers from their lazy form (nil: no blob source).
	lazy *lazyLayers

	mu sync.Mutex
	// guarded by mu
	boxes map[string]*box
	// settings are the keeper's settings, normalized; Live ones change.
	settings Settings
	// packing holds the sandboxes being packed (see pack_linux.go).
	packing map[string]bool
}

// Run runs the keeper until ctx ends or a client asks it to shut down. It
// must be started in a mount namespace of its own (Start does that).
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	k := &Keeper{cfg: cfg, l: Layout{StateDir: cfg.StateDir}, log: cfg.Logger, boxes: map[string]*box{}, events: newEventLog(), settings: cfg.Settings()}
	if err := k.setup(); err != nil {
		k.teardown()
		return err
	}
	defer k.teardown()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		k.watchOOM(ctx)
	}()
	if k.pool != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k.pool.run(ctx)
		}()
	}
	{
		wg.Add(1)
		go func() {
			defer wg.Done()
			k.warm.run(ctx)
		}()
	}
	defer wg.Wait()
	return k.serve(ctx, stop)
}

func (k *Keeper) setup() error {
	if err := os.MkdirAll(k.l.RunDir(), 0o700); err != nil {
		return err
	}
	// Sandbox roots are mounted below these; runtimes set them up as the
	// sandbox's unprivileged root, which must be able to traverse the path.
	for _, d := range []string{k.cfg.StateDir, k.l.SandboxesDir()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	lock, err := os.OpenFile(filepath.Join(k.l.RunDir(), "keeper.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	k.lock = lock
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errdefs.Newf(errdefs.ErrAlreadyExists, "another keeper runs for %s", k.cfg.StateDir)
	}
	same, err := sameMountNS()
	if err != nil {
		return err
	}
	if same {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "the keeper must run in a mount namespace of its own; it is started by `dsec up`")
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become child subreaper: %w", err)
	}
	if err := checkStatic(k.cfg.Self); err != nil {
		return err
	}
	self, err := os.Open(k.cfg.Self)
	if err != nil {
		return fmt.Errorf("open dsec binary: %w", err)
	}
	k.self = self
	if err := hideCgroup2(k.l.RunDir()); err != nil {
		return err
	}
	layout, err := cgroup.DetectLayout()
	if err != nil {
		return fmt.Errorf("detect cgroups: %w", err)
	}
	k.cg, err = k.newCgroups(layout) // with the host ceilings (ceiling_linux.go)
	if err != nil {
		return err
	}
	k.uids = newUIDPool(k.cfg.IDMap, k.cfg.UIDRanges)
	k.layers, err = rootfs.NewLayers(filepath.Join(k.l.RunDir(), "layers"), k.log)
	if err != nil {
		return err
	}
	if k.cfg.BlobSource != "" {
		if k.lazy, err = newLazyLayers(k.cfg, k.l.RunDir(), k.log, k.lazyFailed); err != nil {
			return err
		}
	}
	// Every command agents run descends from an exec, which gets this filter.
	k.seccomp, err = seccomp.Default().Compile(seccomp.NativeArch())
	if err != nil {
		return fmt.Errorf("seccomp policy: %w", err)
	}
	k.reaper = newReaper()
	k.zyg = &zygotes{k: k}
	// Started now, so the first exec does not pay for it.
	k.zyg.get()
	if err := k.openDisk(); err != nil {
		return err
	}
	k.adopt()
	// Always there, so that a live settings change can turn it on.
	k.warm = newWarmPool(k, max(k.cfg.WarmPool, 0))
	return nil
}

// openDisk sets up the limits of writable layers.
func (k *Keeper) openDisk() error {
	mode := k.cfg.DiskQuota
	if mode == "off" {
		k.log.Warn("writable layers are not size-limited (--disk-quota off)")
		return nil
	}
	if mode == "auto" {
		mode = ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fs, err := diskquota.Open(ctx, diskquota.Config{
		Mode:       diskquota.Mode(mode),
		Image:      filepath.Join(k.cfg.StateDir, "disk", "layers.xfs"),
		Size:       k.cfg.DiskSize,
		MountPoint: filepath.Join(k.l.RunDir(), "disks"),
		Logger:     k.log,
		Run: func(ctx context.Context, path string, args []string) ([]byte, error) {
			return k.run(ctx, append([]string{path}, args...), nil)
		},
	})
	if err != nil {
		return fmt.Errorf("disk limits: %w (run `dsec doctor`; --disk-quota off runs without them)", err)
	}
	k.disk = fs
	if k.cfg.DiskPool > 0 {
		k.pool = newDiskPool(k, k.cfg.DiskPoolBytes, k.cfg.DiskPool)
	}
	k.log.Info("writable layers are size-limited", "mode", fs.Mode(), "pool", k.cfg.DiskPool)
	return nil
}

func (k *Keeper) teardown() {
	if k.zyg != nil {
		k.zyg.close()
	}
	if k.lazy != nil {
		k.lazy.close()
	}
	if k.reaper != nil {
		k.reaper.close()
	}
	for _, f := range []*os.File{k.self, k.lock} {
		if f != nil {
			f.Close()
		}
	}
}

func (k *Keeper) serve(ctx context.Context, stop func()) error {
	sock := k.l.Socket()
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return err
	}
	srv := &http.Server{Handler: k.handler(stop), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	k.log.Info("keeper ready", "socket", sock, "runtime", k.cfg.Runtime, "pid", os.Getpid())
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-errc
	return nil
}

// parentMountNSEnv carries the mount namespace of the process that
// started the keeper, which the keeper's own must differ from.
const parentMountNSEnv = "DSEC_KEEPER_PARENT_MNTNS"

func mountNS() (string, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &st); err != nil {
		return "", fmt.Errorf("read own mount namespace: %w", err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}

// sameMountNS reports whether the keeper shares its starter's mount
// namespace (or was not started by Start at all).
func sameMountNS() (bool, error) {
	own, err := mountNS()
	if err != nil {
		return false, err
	}
	parent := os.Getenv(parentMountNSEnv)
	return parent == "" || parent == own, nil
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

// adopt finds sandboxes a previous keeper started, and removes what is
// left of sandboxes that were never finished (no keeper.json) and cgroups
// that belong to no sandbox.
func (k *Keeper) adopt() {
	ents, _ := os.ReadDir(k.l.SandboxesDir())
	for _, e := range ents {
		if isWarmSlot(e.Name()) {
			// Warm sandboxes nobody claimed are not kept across restarts.
			k.log.Info("removing a warm sandbox", "slot", e.Name())
			k.destroy(context.Background(), &box{info: SandboxInfo{Slot: e.Name()}, exited: closedChan()})
			continue
		}
		b, err := os.ReadFile(filepath.Join(k.l.SandboxDir(e.Name()), "keeper.json"))
		if err != nil {
			if validID(e.Name()) == nil {
				k.log.Info("removing unfinished sandbox", "id", e.Name())
				k.destroy(context.Background(), &box{info: SandboxInfo{ID: e.Name()}, exited: closedChan()})
			}
			continue
		}
		var info SandboxInfo
		if err := json.Unmarshal(b, &info); err != nil || info.ID != e.Name() {
			continue
		}
		bx := k.newBox(info)
		bx.info.Adopted = true
		k.uids.hold(info.IDs(k.cfg.IDMap))
		if st, err := ProcStartTime(info.Pid); err != nil || st != info.StartTime {
			k.exited(bx, "the sandbox's init ended while no keeper ran")
		} else {
			go k.watchAdopted(bx)
		}
		k.boxes[info.ID] = bx
		k.log.Info("adopted sandbox", "id", info.ID, "state", bx.info.State)
	}
	// The names of the adopted sandboxes' cgroups and disks.
	used := map[string]bool{}
	for _, b := range k.boxes {
		used[b.info.slot()] = true
		if b.info.Disk != "" {
			used[b.info.Disk] = true
		}
	}
	if k.disk != nil {
		dirs, err := k.disk.List()
		if err != nil {
			k.log.Warn("list sandbox disks", "err", err)
		}
		for _, d := range dirs {
			if !used[d.Name] {
				k.log.Info("removing orphaned sandbox disk", "name", d.Name)
				_ = k.disk.Remove(context.Background(), d.Name)
			}
		}
	}
	groups, err := k.cg.List()
	if err != nil {
		k.log.Warn("list cgroups", "err", err)
		return
	}
	for _, g := range groups {
		if used[g] {
			continue
		}
		k.log.Info("removing orphaned cgroup", "name", g)
		if err := k.cg.Delete(context.Background(), g); err != nil {
			k.log.Warn("remove orphaned cgroup", "name", g, "err", err)
		}
	}
}

// watchAdopted waits for an adopted init (not our child) to exit.
func (k *Keeper) watchAdopted(bx *box) {
	fd, err := unix.PidfdOpen(bx.info.Pid, 0)
	if err != nil {
		k.exited(bx, "init gone")
		return
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if err == nil || !errors.Is(err, unix.EINTR) {
			break
		}
	}
	k.exited(bx, "init exited")
}

// exited marks a sandbox's init as ended and reports it, unless the
// sandbox is being deleted (then its end is expected).
func (k *Keeper) exited(b *box, reason string) {
	b.markExited(reason)
	b.mu.Lock()
	deleting, id := b.deleting, b.info.ID
	b.mu.Unlock()
	if !deleting {
		k.events.add(id, EventExited, reason)
	}
}

// ProcStartTime reads a process's start time, field 22 of /proc/PID/stat.
func ProcStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	var v uint64
	_, err = fmt.Sscan(f[19], &v)
	return v, err
}

// Takeover replaces the running keeper old with one of self started with
// s: it asks old to exit without deleting its sandboxes (SIGKILL if it has
// not after 30s; sandboxes survive that too), then starts the new one,
// which adopts them. Execs the old keeper was running are reported lost
// by the new one: their end is seen by no keeper.
func Takeover(ctx context.Context, self, stateDir string, s Settings, old Version) error {
	c := NewClient(stateDir)
	defer c.Close()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := c.Shutdown(sctx, false)
	cancel()
	if err != nil && !errdefs.Is(err, errdefs.ErrUnavailable) {
		return fmt.Errorf("stop the node keeper (pid %d): %w", old.Pid, err)
	}
	if old.Pid > 0 && !waitExit(ctx, old.Pid, 30*time.Second) {
		_ = syscall.Kill(old.Pid, syscall.SIGKILL)
		if !waitExit(ctx, old.Pid, 10*time.Second) {
			return errdefs.Newf(errdefs.ErrUnavailable, "the node keeper (pid %d) does not exit: stop it (kill %d), then start dsec up again", old.Pid, old.Pid)
		}
	}
	return Start(ctx, self, stateDir, s)
}

// waitExit waits up to d for process pid to end (to be gone or a zombie).
func waitExit(ctx context.Context, pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i+1:]), " Z") {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Start starts a keeper for stateDir in the background, in its own session
// and mount namespace, running `self keeper` with s, and waits until it
// answers. The keeper is not the caller's child for long: it outlives it.
func Start(ctx context.Context, self, stateDir string, s Settings) error {
	args := s.Args()
	l := Layout{StateDir: stateDir}
	if err := os.MkdirAll(filepath.Join(stateDir, "logs"), 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(stateDir, "logs", "keeper.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self, append([]string{"keeper", "--state-dir", stateDir}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	ns, err := mountNS()
	if err != nil {
		return err
	}
	cmd.Env = append(os.Environ(), "GOTRACEBACK=crash", parentMountNSEnv+"="+ns)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Unshareflags: syscall.CLONE_NEWNS}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start keeper: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	c := NewClient(stateDir)
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		vctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Version(vctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case werr := <-exited:
			return errdefs.Newf(errdefs.ErrUnavailable, "keeper exited at start (%v); see %s", werr, filepath.Join(l.StateDir, "logs", "keeper.log"))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errdefs.Newf(errdefs.ErrUnavailable, "keeper did not answer within 15s; see %s", filepath.Join(l.StateDir, "logs", "keeper.log"))
		}
	}
}
