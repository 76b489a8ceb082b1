package keeper

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Keeper is a running keeper: the core, and its drivers.
type Keeper struct {
	cfg    Config
	l      Layout
	log    *slog.Logger
	reaper *reaper
	lock   *os.File
	events *eventLog
	vault  *vault
	// ct is the container driver, the only one so far; drivers lists
	// every driver by name.
	ct      *containerDriver
	drivers map[string]Driver
	// defaultDriver runs sandboxes whose request names none (protocol 2's
	// and the edge's today); "" is the container driver.
	defaultDriver string
	// net is the sandboxes' network (network_linux.go).
	net netState
	// moves are the background moves of paused and resumed sandboxes'
	// memory (pause_linux.go); moveSlots bounds those out of RAM.
	moves         sync.WaitGroup
	moveSlotsOnce sync.Once
	moveSlots     chan struct{}

	mu sync.Mutex
	// guarded by mu
	boxes map[string]*box
	// settings are the keeper's settings, normalized; Live ones change.
	settings Settings
	// handoff is where the vault goes to the keeper replacing this one,
	// once a shutdown asked for that.
	handoff *net.UnixListener
}

// Run runs the keeper until ctx ends or a client asks it to shut down. It
// must be started in a mount namespace of its own (Start does that).
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	k := &Keeper{cfg: cfg, l: Layout{StateDir: cfg.StateDir}, log: cfg.Logger, boxes: map[string]*box{}, events: newEventLog(), vault: newVault(), settings: cfg.Settings()}
	if err := k.setup(); err != nil {
		k.teardown()
		return err
	}
	defer k.teardown()
	ctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, d := range k.drivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.Run(ctx)
		}()
	}
	err := k.serve(ctx, stop)
	stop()
	wg.Wait()
	k.mu.Lock()
	ln := k.handoff
	k.mu.Unlock()
	if ln != nil {
		// The successor starts once the lock is free, and takes the
		// vault over.
		k.lock.Close()
		k.lock = nil
		k.handOver(ln)
	}
	return err
}

// driver returns the driver of name ("" is the container driver).
func (k *Keeper) driver(name string) (Driver, error) {
	if name == "" {
		name = cmp.Or(k.defaultDriver, containerDriverName)
	}
	d, ok := k.drivers[name]
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "this node keeper has no sandbox driver %q (it has %v)", name, k.driverNames())
	}
	return d, nil
}

// driverOf returns the driver of a sandbox.
func (k *Keeper) driverOf(b *box) Driver {
	b.mu.Lock()
	name := b.info.Driver
	b.mu.Unlock()
	d, err := k.driver(name)
	if err != nil {
		// Not reached: a record of a driver this keeper lacks is never
		// adopted, nor a request for one started.
		d, _ = k.driver("")
	}
	return d
}

// allBoxes returns the sandboxes the keeper has.
func (k *Keeper) allBoxes() []*box {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]*box, 0, len(k.boxes))
	for _, b := range k.boxes {
		out = append(out, b)
	}
	return out
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
	// From a keeper this one replaces, before anything looks at sandboxes.
	k.takeOver()
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
	k.reaper = newReaper()
	if k.ct, err = newContainerDriver(k); err != nil {
		return err
	}
	k.drivers = map[string]Driver{containerDriverName: k.ct}
	k.adopt()
	// Before serving: the adopted sandboxes' policies are in force again.
	return k.setupNetwork()
}

func (k *Keeper) teardown() {
	k.stopMoves()
	k.closeNetwork()
	for _, d := range k.drivers {
		d.Close()
	}
	if k.reaper != nil {
		k.reaper.close()
	}
	if k.vault != nil {
		k.vault.closeAll()
	}
	if k.lock != nil {
		k.lock.Close()
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
	// Find the sealed execs' busybox while the node is calm, not at the
	// first sealed exec, which may come while sandboxes exhaust the host's
	// processes or files.
	go func() { _, _, _ = findSealTools(k.run) }()
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

// adopt finds sandboxes a previous keeper started, and has the drivers
// remove what is left of sandboxes that were never finished (no
// keeper.json) and what belongs to no sandbox.
func (k *Keeper) adopt() {
	ctx := context.Background()
	ents, _ := os.ReadDir(k.l.SandboxesDir())
	for _, e := range ents {
		if isWarmSlot(e.Name()) && k.ct != nil {
			// Warm sandboxes nobody claimed are not kept across restarts.
			k.log.Info("removing a warm sandbox", "slot", e.Name())
			k.ct.Destroy(ctx, &box{info: SandboxInfo{Slot: e.Name()}, exited: closedChan()})
			continue
		}
		b, err := os.ReadFile(filepath.Join(k.l.SandboxDir(e.Name()), "keeper.json"))
		if err != nil {
			if validID(e.Name()) == nil {
				// No record says which driver made it: every driver
				// removes what it may have made.
				k.log.Info("removing unfinished sandbox", "id", e.Name())
				for _, d := range k.drivers {
					d.Destroy(ctx, &box{info: SandboxInfo{ID: e.Name()}, exited: closedChan()})
				}
			}
			continue
		}
		var info SandboxInfo
		if err := json.Unmarshal(b, &info); err != nil || info.ID != e.Name() {
			continue
		}
		d, err := k.driver(info.Driver)
		if err != nil {
			k.log.Error("not adopting a sandbox of an unknown driver: delete it with the dsec that made it", "id", info.ID, "err", err)
			continue
		}
		// The driver's record says whether it is paused, not keeper.json
		// (pause_linux.go).
		p, canPause := d.(pauser)
		info.Paused = canPause && p.recordedPaused(info)
		bx := k.newBox(info)
		bx.info.Adopted, bx.info.Driver = true, d.Name()
		d.Adopt(bx)
		if st, err := ProcStartTime(info.Pid); err != nil || st != info.StartTime {
			k.exited(bx, "the sandbox's init ended while no keeper ran")
		} else {
			go k.watchAdopted(bx)
			if info.Paused {
				// Its memory goes on moving out where the last keeper
				// stopped (or comes out again after a swapoff).
				bx.pausedSince = time.Now()
				k.prepareMove(bx, p, true)()
			}
		}
		k.boxes[info.ID] = bx
		k.log.Info("adopted sandbox", "id", info.ID, "state", bx.info.State)
	}
	// The names of the adopted sandboxes' slots and disks.
	used := map[string]bool{}
	for _, b := range k.boxes {
		used[b.info.slot()] = true
		if b.info.Disk != "" {
			used[b.info.Disk] = true
		}
	}
	for _, d := range k.drivers {
		d.Sweep(ctx, used)
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
	st, _, err := ProcStat(pid)
	return st, err
}

// ProcStat reads a process's start time in clock ticks since boot (field
// 22 of /proc/PID/stat) and its state (field 3: 'R', 'S', 'Z', ...).
func ProcStat(pid int) (start uint64, state byte, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields that follow start after its last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: too few fields", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, f[0][0], err
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
	var err error
	if old.Protocol >= 3 {
		// It hands its vault over to the new keeper once its lock is free.
		err = c.call(sctx, http.MethodPost, "/v1/shutdown", url.Values{"handoff": {"1"}}, nil, nil)
	} else {
		err = c.Shutdown(sctx, false)
	}
	cancel()
	if err != nil && !errdefs.Is(err, errdefs.ErrUnavailable) {
		return fmt.Errorf("stop the node keeper (pid %d): %w", old.Pid, err)
	}
	if old.Protocol >= 3 && old.Pid > 0 {
		if waitUnlocked(ctx, Layout{StateDir: stateDir}, 30*time.Second) {
			if err := Start(ctx, self, stateDir, s); err != nil {
				return err
			}
			waitExit(ctx, old.Pid, 30*time.Second)
			return nil
		}
	}
	if old.Pid > 0 && !waitExit(ctx, old.Pid, 30*time.Second) {
		_ = syscall.Kill(old.Pid, syscall.SIGKILL)
		if !waitExit(ctx, old.Pid, 10*time.Second) {
			return errdefs.Newf(errdefs.ErrUnavailable, "the node keeper (pid %d) does not exit: stop it (kill %d), then start dsec up again", old.Pid, old.Pid)
		}
	}
	return Start(ctx, self, stateDir, s)
}

// waitUnlocked waits up to d for no keeper to hold the lock of l.
func waitUnlocked(ctx context.Context, l Layout, d time.Duration) bool {
	f, err := os.Open(filepath.Join(l.RunDir(), "keeper.lock"))
	if err != nil {
		return true
	}
	defer f.Close()
	deadline := time.Now().Add(d)
	for {
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
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
