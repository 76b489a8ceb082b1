package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazyregexp"
	"github.com/dsecproject/dsec/internal/nsexec"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// Sealed execs (ExecSpec.Seal; docs/architecture.md, "Sealed execs").
//
// While a sealed command runs, the sandbox's cgroup is frozen (SealKill:
// every process but the init is killed first, the init frozen), so no
// process of the sandbox can fork, ptrace, signal or write anything. The
// command itself runs in a sibling cgroup, <slot>.seal, with the
// sandbox's memory and pids limits, which is killed and removed when the
// command ends, before the sandbox is thawed: nothing the sealed command
// started outlives it. Freezing comes first and the command is spawned
// after, so no process of the sandbox exists unfrozen while it runs.
//
// The command joins the init's namespaces (checked against those recorded
// at create) except the mount namespace: it gets a copy of the init's,
// made by a keeper thread and owned by the host's user namespace, so
// nothing in the sandbox can change its mounts, in which
//   - /.dsec is a read-only tmpfs holding a copy of the host's static
//     busybox as /.dsec/bin (first on PATH; a shell command runs
//     /.dsec/bin/sh) and the image's layers, without the writable layer,
//     as /.dsec/image;
//   - /etc/ld.so.preload, if the sandbox has one, reads as empty.
// The environment loses every LD_* variable.

// The values of ExecSpec.Seal (sandbox.Seal's numbers).
const (
	sealFreeze = 1
	sealKill   = 2
)

// SealedBin is where a sealed exec finds the platform's tools.
const SealedBin = "/.dsec/bin"

// sealToolsSize bounds the tmpfs of a sealed exec's tools.
const sealToolsSize = "16m"

// sealBusyboxPaths are where a static busybox is looked for on the host,
// in order (Debian's busybox-static installs /bin/busybox).
var sealBusyboxPaths = []string{"/usr/lib/dsec/busybox", "/bin/busybox", "/usr/bin/busybox"}

// sealGroup is the cgroup a sealed exec of the sandbox in slot runs in.
func sealGroup(slot string) string { return slot + ".seal" }

// sealTools is the host's static busybox and its applets, once found.
var sealTools struct {
	mu sync.Mutex
	// guarded by mu
	path    string
	applets []string
}

var appletRe = lazyregexp.New(`^[a-zA-Z0-9_.\[-]{1,64}$`)

// execOutput runs argv with os/exec and returns its standard output: for
// tests, and callers with no reaper of their own.
func execOutput(_ context.Context, argv []string, _ []uintptr) ([]byte, error) {
	return exec.Command(argv[0], argv[1:]...).Output()
}

// findSealTools finds the host's static busybox and its applets, running
// busybox through run (the keeper's k.run: its reaper is the only waiter
// for its children, so os/exec must not be used there).
func findSealTools(run func(ctx context.Context, argv []string, extra []uintptr) ([]byte, error)) (string, []string, error) {
	sealTools.mu.Lock()
	defer sealTools.mu.Unlock()
	if sealTools.path != "" {
		return sealTools.path, sealTools.applets, nil
	}
	failed := "" // a busybox that is there but could not be read or run now
	for _, p := range sealBusyboxPaths {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := checkStatic(p); err != nil {
			if !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
				failed = p // not read (out of files?), not known to be dynamic
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := run(ctx, []string{p, "--list"}, nil)
		cancel()
		if err != nil {
			failed = p // out of processes or memory, say
			continue
		}
		var applets []string
		for a := range strings.FieldsSeq(string(out)) {
			if appletRe.MatchString(a) && a != "busybox" {
				applets = append(applets, a)
			}
		}
		sealTools.path, sealTools.applets = p, applets
		return p, applets, nil
	}
	if failed != "" {
		// Not "install it": it is there. Nothing is cached, the next
		// sealed exec tries again.
		return "", nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrUnavailable,
			"sealed execs: the node's busybox %s could not be read or run just now (the node may be short of processes, memory or files): retry", failed), time.Second)
	}
	return "", nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
		"sealed execs need a static busybox on the node (%s): install Debian's busybox-static", strings.Join(sealBusyboxPaths, ", "))
}

// beginSeal marks id as running the sealed exec execID, or fails when it
// is being packed or runs another sealed exec.
func (c *containerDriver) beginSeal(id, execID string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.packing[id] {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s is being packed: wait for the pack to end, then run the sealed exec", id)
	}
	if other := c.sealing[id]; other != "" {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s runs sealed exec %s: wait for it to end, then run this one", id, other)
	}
	if c.sealing == nil {
		c.sealing = map[string]string{}
	}
	c.sealing[id] = execID
	return nil
}

func (c *containerDriver) endSeal(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sealing, id)
}

// sealBusy fails while a sealed exec runs in sandbox id: its other
// processes are frozen, and a command started beside it would either run
// unfrozen beside it or hang frozen, so it is refused.
func (c *containerDriver) sealBusy(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if other := c.sealing[id]; other != "" {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s runs sealed exec %s, which has every other process of it frozen: wait for it to end (dsec exec --wait), then run this", id, other)
	}
	return nil
}

// execSealed starts spec sealed. end, called once the command has ended,
// kills what it left, removes its cgroup and thaws the sandbox.
func (c *containerDriver) execSealed(ctx context.Context, b *box, spec ExecSpec, stdio [3]*os.File) (pid int, end func(), err error) {
	if spec.Seal != sealFreeze && spec.Seal != sealKill {
		return 0, nil, errdefs.Newf(errdefs.ErrInvalidArgument, "seal %d: use 1 (freeze the others) or 2 (kill them)", spec.Seal)
	}
	info := b.snapshot()
	if err := CheckNamespaces(info.Pid, info.NS); err != nil {
		return 0, nil, fmt.Errorf("sandbox %s: %w", info.ID, err)
	}
	busybox, applets, err := findSealTools(c.k.run)
	if err != nil {
		return 0, nil, err
	}
	if err := c.beginSeal(info.ID, spec.ID); err != nil {
		return 0, nil, err
	}
	slot, group := info.slot(), sealGroup(info.slot())
	// undo runs in reverse on failure, or at end.
	var undo []func()
	unwind := func() {
		for _, f := range slices.Backward(undo) {
			f()
		}
	}
	defer func() {
		if err != nil {
			unwind()
		}
	}()
	undo = append(undo, func() { c.endSeal(info.ID) })

	tools, err := makeSealTools(busybox, applets)
	if err != nil {
		return 0, nil, err
	}
	defer tools.Close()
	image, err := c.imageView(b, info.Pid)
	if err != nil {
		return 0, nil, err
	}
	defer image.Close()

	st, err := c.cg.Stats(slot)
	if err != nil {
		return 0, nil, fmt.Errorf("sandbox %s limits: %w", info.ID, err)
	}
	c.removeSealGroup(ctx, group) // one a crash left
	if err := c.cg.Create(group, cgroup.Resources{MemoryBytes: st.MemoryLimit, Pids: st.PidsLimit}); err != nil {
		return 0, nil, fmt.Errorf("sealed exec cgroup: %w", err)
	}
	undo = append(undo, func() { c.removeSealGroup(context.WithoutCancel(ctx), group) })

	if err := c.cg.Freeze(ctx, slot); err != nil {
		return 0, nil, fmt.Errorf("freeze sandbox %s: %w", info.ID, err)
	}
	undo = append(undo, func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := c.cg.Thaw(tctx, slot); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			c.log.Error("thaw sandbox after a sealed exec", "sandbox", info.ID, "err", err)
		}
	})
	if spec.Seal == sealKill {
		if err := c.killAllButInit(ctx, slot, info.Pid); err != nil {
			return 0, nil, fmt.Errorf("sandbox %s: kill its processes: %w", info.ID, err)
		}
	}

	ns, err := newSealNS(info.Pid, tools, image)
	if err != nil {
		return 0, nil, err
	}
	defer ns.close()

	procs, err := c.sealProcs(b, group)
	if err != nil {
		return 0, nil, err
	}
	cfg := nsexec.ExecConfig{
		Pid:         info.Pid,
		MountNS:     ns.path,
		CgroupProcs: procs,
		UID:         spec.UID,
		GID:         spec.GID,
		Groups:      spec.Groups,
		Cwd:         spec.Cwd,
		Argv:        spec.Argv,
		Env:         sealedEnv(spec.Env),
		KeepCaps:    nsexec.DefaultCaps,
		Seccomp:     c.seccomp,
		Setsid:      true,
		TTY:         spec.TTY,
	}
	if cfg.Cwd == "" {
		cfg.Cwd = "/"
	}
	pid, err = c.spawn(cfg, stdio)
	if err != nil {
		return 0, nil, err
	}
	var once sync.Once
	return pid, func() { once.Do(unwind) }, nil
}

// removeSealGroup kills what is left in a sealed exec's cgroup and removes it.
func (c *containerDriver) removeSealGroup(ctx context.Context, group string) {
	kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.cg.Delete(kctx, group); err != nil && !errors.Is(err, errdefs.ErrNotFound) { // Delete kills first
		c.log.Warn("remove the sealed exec's cgroup", "cgroup", group, "err", err)
	}
}

// killAllButInit kills every process of the frozen group slot but init,
// and returns once they are gone, the group frozen again.
func (c *containerDriver) killAllButInit(ctx context.Context, slot string, init int) error {
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		pids, err := c.cg.Procs(slot)
		if err != nil {
			return err
		}
		pids = slices.DeleteFunc(pids, func(p int) bool { return p == init })
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			_ = unix.Kill(p, unix.SIGKILL)
		}
		// A v1 freezer holds a killed process until it is thawed; those
		// with SIGKILL pending cannot fork in the moment it takes.
		if err := c.cg.Thaw(kctx, slot); err != nil {
			return err
		}
		for kctx.Err() == nil {
			left, err := c.cg.Procs(slot)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(left, func(p int) bool { return slices.Contains(pids, p) }) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		// Out of the group, a killed process may still be a zombie its
		// parent (the init, at the latest) has not reaped: the sealed
		// command would list it. The init reaps while thawed; a second
		// at most is given to that (a zombie is dead all the same).
		for reap := time.Now().Add(time.Second); kctx.Err() == nil && time.Now().Before(reap); {
			if !slices.ContainsFunc(pids, func(p int) bool { return unix.Kill(p, 0) == nil }) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		if err := c.cg.Freeze(kctx, slot); err != nil {
			return err
		}
		if kctx.Err() != nil {
			return kctx.Err()
		}
	}
}

// sealProcs are the cgroup.procs files a sealed exec joins: its own group
// in the hierarchies the manager uses (the freezer's among them), and the
// sandbox's groups in the others the runtime made (devices, ...), which
// never freeze.
func (c *containerDriver) sealProcs(b *box, group string) ([]string, error) {
	own, err := c.cg.ProcsFiles(group)
	if err != nil {
		return nil, err
	}
	managed, err := c.cg.ProcsFiles(b.snapshot().slot())
	if err != nil {
		return nil, err
	}
	all, err := c.boxProcs(b)
	if err != nil {
		return nil, err
	}
	for _, f := range all {
		if !slices.Contains(managed, f) {
			own = append(own, f)
		}
	}
	return own, nil
}

// sealedEnv is a sealed command's environment: no LD_* variable, and the
// platform's tools first on PATH.
func sealedEnv(env []string) []string {
	out := make([]string, 0, len(env)+1)
	path := ""
	for _, kv := range env {
		switch {
		case strings.HasPrefix(kv, "LD_"):
		case strings.HasPrefix(kv, "PATH="):
			path = strings.TrimPrefix(kv, "PATH=")
		default:
			out = append(out, kv)
		}
	}
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	return append(out, "PATH="+SealedBin+":"+path)
}

// makeSealTools returns a detached, read-only tmpfs holding bin/busybox (a
// copy of the host's), a link to it for each applet, an empty directory
// image and an empty file empty. Its files are the keeper's own copies:
// no inode of the host reaches the sandbox.
func makeSealTools(busybox string, applets []string) (_ *os.File, err error) {
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("sealed exec tools: fsopen: %w", err)
	}
	defer unix.Close(fsfd)
	for _, o := range [][2]string{{"size", sealToolsSize}, {"mode", "755"}, {"nr_inodes", "4096"}} {
		if err := unix.FsconfigSetString(fsfd, o[0], o[1]); err != nil {
			return nil, fmt.Errorf("sealed exec tools: %s: %w", o[0], err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fmt.Errorf("sealed exec tools: create: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID)
	if err != nil {
		return nil, fmt.Errorf("sealed exec tools: fsmount: %w", err)
	}
	mnt := os.NewFile(uintptr(mfd), "sealed tools")
	defer func() {
		if err != nil {
			mnt.Close()
		}
	}()
	for _, d := range []string{"bin", "image"} {
		if err := unix.Mkdirat(mfd, d, 0o755); err != nil {
			return nil, fmt.Errorf("sealed exec tools: %w", err)
		}
	}
	src, err := os.Open(busybox)
	if err != nil {
		return nil, fmt.Errorf("sealed exec tools: %w", err)
	}
	defer src.Close()
	// Execute-only, and owned by an id no sandbox maps: a process that
	// runs it cannot read it, so the kernel makes it non-dumpable, and
	// nothing of the sandbox that runs (none should) may ptrace it or
	// open its /proc files.
	dfd, err := unix.Openat(mfd, "bin/busybox", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o711)
	if err != nil {
		return nil, fmt.Errorf("sealed exec tools: %w", err)
	}
	dst := os.NewFile(uintptr(dfd), "busybox")
	_, err = io.Copy(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("sealed exec tools: copy busybox: %w", err)
	}
	for _, a := range applets {
		if err := unix.Symlinkat("busybox", mfd, "bin/"+a); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("sealed exec tools: link %s: %w", a, err)
		}
	}
	efd, err := unix.Openat(mfd, "empty", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return nil, fmt.Errorf("sealed exec tools: %w", err)
	}
	unix.Close(efd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(mfd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return nil, fmt.Errorf("sealed exec tools: read-only: %w", err)
	}
	return mnt, nil
}

// imageView returns a detached read-only overlay of the sandbox's layers,
// as the sandbox's user namespace sees them, without its writable layer.
func (c *containerDriver) imageView(b *box, initPid int) (*os.File, error) {
	if err := c.reacquireLayers(b); err != nil {
		return nil, err
	}
	b.mu.Lock()
	digests := slices.Clone(b.ct.layers)
	b.mu.Unlock()
	userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", initPid))
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "the sandbox's init is gone: the sandbox ended (dsec ps shows how)")
	}
	defer userns.Close()
	var views []*os.File
	defer func() {
		for _, v := range views {
			v.Close()
		}
	}()
	for _, d := range slices.Backward(digests) { // overlay wants the top first
		raw, ok := c.layers.Path(d)
		if !ok {
			return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "layer %s of the sandbox is not mounted on this node", d)
		}
		v, err := rootfs.IDMapped(raw, userns)
		if err != nil {
			return nil, err
		}
		views = append(views, v)
	}
	if len(views) == 0 {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "the sandbox's layers are not known to this keeper (it was made by an older dsec): sealed execs need a sandbox made by this one")
	}
	return rootfs.ReadOnlyOverlay(views)
}

// layerRecord is the file, in a sandbox's directory, that names its
// layers (lowest first), so that a keeper that adopted the sandbox can
// mount them again for its sealed execs.
const layerRecord = "layers.json"

func writeLayerRecord(dir string, layers []Layer) error {
	if err := writeJSON(filepath.Join(dir, layerRecord), layers); err != nil {
		return fmt.Errorf("sandbox layer record: %w", err)
	}
	return nil
}

// reacquireLayers mounts again the layers of a sandbox this keeper
// adopted (it holds none of them), from its layer record; they are
// released with the sandbox. Lazy layers are never adopted.
func (c *containerDriver) reacquireLayers(b *box) error {
	b.mu.Lock()
	held := len(b.ct.layers) > 0
	b.mu.Unlock()
	if held {
		return nil
	}
	raw, err := os.ReadFile(filepath.Join(b.dir(c.l), layerRecord))
	if errors.Is(err, os.ErrNotExist) {
		return nil // made by an older keeper: imageView says so
	}
	if err != nil {
		return fmt.Errorf("sandbox layer record: %w", err)
	}
	var layers []Layer
	if err := json.Unmarshal(raw, &layers); err != nil {
		return fmt.Errorf("sandbox layer record: %w", err)
	}
	var got []string
	for _, l := range layers {
		if l.Lazy != nil {
			err = errdefs.Newf(errdefs.ErrFailedPrecondition, "layer %s of the sandbox is lazy and was served by an earlier keeper", l.Digest)
		} else {
			_, err = c.layers.Acquire(l.Digest, l.Path)
		}
		if err != nil {
			for _, d := range got {
				c.layers.Release(d)
			}
			return err
		}
		got = append(got, l.Digest)
	}
	// Sealed execs of a sandbox run one at a time (beginSeal): nothing
	// else sets its layers meanwhile.
	b.mu.Lock()
	b.ct.layers = got
	b.mu.Unlock()
	return nil
}

// sealNS is a mount namespace made for one sealed exec and held by a
// locked thread of the keeper until close.
type sealNS struct {
	path    string // the thread's /proc/PID/task/TID/ns/mnt
	release chan struct{}
	done    chan struct{}
}

// newSealNS makes a copy of the init's mount namespace, owned by the
// host's user namespace, with tools at /.dsec and image at /.dsec/image.
func newSealNS(initPid int, tools, image *os.File) (*sealNS, error) {
	ns := &sealNS{release: make(chan struct{}), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		defer close(ns.done)
		// Never unlocked: the thread, in another mount namespace and with
		// a file system context of its own, ends with this goroutine.
		runtime.LockOSThread()
		if err := enterSealNS(initPid, tools, image); err != nil {
			ready <- err
			return
		}
		ns.path = fmt.Sprintf("/proc/%d/task/%d/ns/mnt", os.Getpid(), unix.Gettid())
		ready <- nil
		<-ns.release
	}()
	if err := <-ready; err != nil {
		<-ns.done
		return nil, err
	}
	return ns, nil
}

func (ns *sealNS) close() {
	close(ns.release)
	<-ns.done
}

// enterSealNS moves the calling (locked) thread into a new mount
// namespace copied from the init's and mounts the sealed exec's views in
// it. After the setns every path resolves in the sandbox's root: only
// descriptors opened before reach the host.
func enterSealNS(initPid int, tools, image *os.File) error {
	mntfd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", initPid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "the sandbox's init is gone: the sandbox ended (dsec ps shows how)")
	}
	defer unix.Close(mntfd)
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("sealed exec: unshare fs: %w", err)
	}
	if err := unix.Setns(mntfd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("sealed exec: enter the sandbox's mounts: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("sealed exec: new mount namespace: %w", err)
	}
	// Nothing mounted here reaches the sandbox's namespace, nor back.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("sealed exec: private mounts: %w", err)
	}
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sealed exec: open root: %w", err)
	}
	defer unix.Close(root)
	var st unix.Stat_t
	switch err := unix.Fstatat(root, ".dsec", &st, unix.AT_SYMLINK_NOFOLLOW); {
	case errors.Is(err, unix.ENOENT):
		if err := unix.Mkdirat(root, ".dsec", 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return errdefs.Newf(errdefs.ErrFailedPrecondition, "sealed exec: make /.dsec in the sandbox: %v (free space in its writable layer)", err)
		}
	case err != nil:
		return fmt.Errorf("sealed exec: stat /.dsec: %w", err)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		// Reserved: whatever else the agent put there (a link to lead our
		// mounts elsewhere) gives way to an empty directory.
		if err := unix.Unlinkat(root, ".dsec", 0); err != nil {
			return fmt.Errorf("sealed exec: remove the sandbox's /.dsec: %w", err)
		}
		if err := unix.Mkdirat(root, ".dsec", 0o755); err != nil {
			return errdefs.Newf(errdefs.ErrFailedPrecondition, "sealed exec: make /.dsec in the sandbox: %v (free space in its writable layer)", err)
		}
	}
	if err := attach(tools, root, ".dsec", unix.O_DIRECTORY); err != nil {
		return fmt.Errorf("sealed exec: mount /.dsec: %w", err)
	}
	if err := attach(image, root, ".dsec/image", unix.O_DIRECTORY); err != nil {
		return fmt.Errorf("sealed exec: mount /.dsec/image: %w", err)
	}
	return maskPreload(root)
}

// attach mounts the detached mount src at path under root, never
// following a symbolic link there.
func attach(src *os.File, root int, path string, flags int) error {
	dst, err := unix.Openat2(root, path, &unix.OpenHow{
		Flags:   uint64(unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW | flags),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return err
	}
	defer unix.Close(dst)
	return unix.MoveMount(int(src.Fd()), "", dst, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
}

// maskPreload mounts /.dsec/empty over what /etc/ld.so.preload names in
// the sandbox's root (following links as the loader does), if anything.
func maskPreload(root int) error {
	fd, err := unix.Openat2(root, "etc/ld.so.preload", &unix.OpenHow{
		Flags:   uint64(unix.O_PATH | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return nil // nothing the loader could read
	}
	if err != nil {
		return fmt.Errorf("sealed exec: open /etc/ld.so.preload: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("sealed exec: stat /etc/ld.so.preload: %w", err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil // the loader cannot read a directory
	}
	empty, err := unix.OpenTree(root, ".dsec/empty", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("sealed exec: mask /etc/ld.so.preload: %w", err)
	}
	defer unix.Close(empty)
	if err := unix.MoveMount(empty, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("sealed exec: mask /etc/ld.so.preload: %w", err)
	}
	return nil
}
