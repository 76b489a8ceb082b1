package rootfs

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Layers mounts layers once per node, reference counted.
type Layers struct {
	dir string
	log *slog.Logger

	mu sync.Mutex
	// guarded by mu
	refs map[string]int // short name → users
	// done holds what lazily mounted layers release once unmounted.
	done map[string]io.Closer // short name → closer
}

// LazyOpener prepares the mount of a lazy layer when no sandbox uses it
// yet: it returns the local metadata image, the path of its data device
// (device=), and what to close once the layer is unmounted (nil: nothing).
type LazyOpener func() (meta, device string, done io.Closer, err error)

// NewLayers prepares dir to hold layer mounts. Mounts left by an earlier
// process under dir are removed.
func NewLayers(dir string, log *slog.Logger) (*Layers, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("layer mount dir: %w", err)
	}
	l := &Layers{dir: dir, log: log, refs: map[string]int{}, done: map[string]io.Closer{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("layer mount dir: %w", err)
	}
	for _, e := range ents {
		l.unmountLayer(e.Name())
	}
	return l, nil
}

// Acquire mounts the layer (if no sandbox uses it yet) and returns the path
// of its mount, whose files have the image's own owners; a sandbox sees it
// through IDMapped.
func (l *Layers) Acquire(digest, image string) (string, error) {
	name, err := shortName(digest)
	if err != nil {
		return "", err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	raw := filepath.Join(l.dir, name, "r")
	if l.refs[name] > 0 {
		l.refs[name]++
		return raw, nil
	}
	if err := l.mountLayer(name, image, ""); err != nil {
		l.unmountLayer(name)
		return "", err
	}
	l.refs[name] = 1
	return raw, nil
}

// AcquireLazy is Acquire for a layer mounted from its lazy form: on first
// use open gives the metadata image and the data device, which EROFS
// takes as device=.
func (l *Layers) AcquireLazy(digest string, open LazyOpener) (string, error) {
	name, err := shortName(digest)
	if err != nil {
		return "", err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	raw := filepath.Join(l.dir, name, "r")
	if l.refs[name] > 0 {
		l.refs[name]++
		return raw, nil
	}
	meta, device, done, err := open()
	if err != nil {
		return "", fmt.Errorf("lazy layer %s: %w", digest, err)
	}
	if done != nil {
		l.done[name] = done
	}
	if strings.ContainsAny(device, ",") {
		l.unmountLayer(name)
		return "", fmt.Errorf("lazy layer %s: data device path %q has a comma", digest, device)
	}
	if err := l.mountLayer(name, meta, "device="+device); err != nil {
		l.unmountLayer(name)
		return "", err
	}
	l.refs[name] = 1
	return raw, nil
}

// Release drops one use of the layer and unmounts it when none is left.
func (l *Layers) Release(digest string) {
	name, err := shortName(digest)
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch n := l.refs[name]; {
	case n > 1:
		l.refs[name] = n - 1
	case n == 1:
		delete(l.refs, name)
		l.unmountLayer(name)
	}
}

// Mounted returns the number of layers mounted now.
func (l *Layers) Mounted() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.refs)
}

func (l *Layers) mountLayer(name, image, opts string) error {
	raw := filepath.Join(l.dir, name, "r")
	if err := os.MkdirAll(raw, 0o700); err != nil {
		return fmt.Errorf("mount layer %s: %w", name, err)
	}
	if err := mountRetry(image, raw, "erofs", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return fmt.Errorf("mount EROFS layer %s: %w (is the image a valid EROFS file?)", name, err)
	}
	return nil
}

// IDMapped returns a view of the mounted layer at raw in which the files'
// owners are mapped through the user namespace userns (an open
// /proc/PID/ns/user): a detached, read-only, nodev mount of its own, which
// the caller closes once an overlay holds it. It costs no mount in any
// mount table, and a sandbox's overlay over such views names no host path.
func IDMapped(raw string, userns *os.File) (*os.File, error) {
	tree, err := unix.OpenTree(unix.AT_FDCWD, raw, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("idmap layer %s: open_tree: %w", filepath.Base(filepath.Dir(raw)), err)
	}
	attr := &unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID,
		Userns_fd: uint64(userns.Fd()),
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
		unix.Close(tree)
		return nil, fmt.Errorf("idmap layer %s: mount_setattr: %w", filepath.Base(filepath.Dir(raw)), err)
	}
	return os.NewFile(uintptr(tree), "idmapped "+raw), nil
}

// unmountLayer removes a layer's mounts and directories; it is idempotent.
func (l *Layers) unmountLayer(name string) {
	base := filepath.Join(l.dir, name)
	// "v" is where an earlier dsec mounted a shared idmapped view.
	for _, d := range []string{filepath.Join(base, "v"), filepath.Join(base, "r")} {
		if err := Unmount(d); err != nil {
			l.log.Warn("unmount layer", "dir", d, "err", err)
		}
	}
	if err := os.RemoveAll(base); err != nil {
		l.log.Warn("remove layer dir", "dir", base, "err", err)
	}
	if c := l.done[name]; c != nil {
		delete(l.done, name)
		if err := c.Close(); err != nil {
			l.log.Warn("release lazy layer", "layer", name, "err", err)
		}
	}
}

// Overlay mounts a sandbox root at target: lowers (highest first, as
// overlayfs wants them; detached mounts such as IDMapped returns) under
// upper, with work as overlay's work dir. upper and work must be in one
// directory, and be empty or hold an earlier mount's state.
//
// The layers are given to overlayfs as descriptors (Linux 6.13 and newer),
// upper and work through a detached clone of their directory, so the
// mount's options, which /proc/self/mountinfo shows inside the sandbox,
// name no path of the host: lowerdir+=/, upperdir=/upper, workdir=/work.
func Overlay(target, upper, work string, lowersTopFirst []*os.File) error {
	dir := filepath.Dir(upper)
	if filepath.Dir(work) != dir {
		return fmt.Errorf("overlay: upper %s and work %s are not in one directory", upper, work)
	}
	if len(lowersTopFirst) == 0 {
		return fmt.Errorf("overlay: no lower layers")
	}
	clone, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("overlay: clone %s: %w", dir, err)
	}
	defer unix.Close(clone)
	var dirs [2]int
	for i, name := range []string{filepath.Base(upper), filepath.Base(work)} {
		fd, err := unix.Openat(clone, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("overlay: open %s: %w", name, err)
		}
		defer unix.Close(fd)
		dirs[i] = fd
	}
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("overlay: fsopen: %w", err)
	}
	defer unix.Close(fsfd)
	fail := func(what string, err error) error {
		return fmt.Errorf("mount overlay root: %s: %w%s", what, err, fsLog(fsfd))
	}
	for i, l := range lowersTopFirst {
		if err := unix.FsconfigSetFd(fsfd, "lowerdir+", int(l.Fd())); err != nil {
			return fail(fmt.Sprintf("layer %d of %d", i+1, len(lowersTopFirst)), err)
		}
	}
	if err := unix.FsconfigSetFd(fsfd, "upperdir", dirs[0]); err != nil {
		return fail("upperdir", err)
	}
	if err := unix.FsconfigSetFd(fsfd, "workdir", dirs[1]); err != nil {
		return fail("workdir", err)
	}
	for _, o := range [][2]string{{"index", "off"}, {"redirect_dir", "off"}, {"metacopy", "off"}} {
		if err := unix.FsconfigSetString(fsfd, o[0], o[1]); err != nil {
			return fail(o[0], err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fail("create", err)
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fail("fsmount", err)
	}
	defer unix.Close(mnt)
	if err := unix.MoveMount(mnt, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount overlay root at %s: %w", target, err)
	}
	return nil
}

// fsLog returns what the file system said about a failed fsconfig, as
// ": " and its messages, or "".
func fsLog(fsfd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for range 8 {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	if len(msgs) == 0 {
		return ""
	}
	return " (" + strings.Join(msgs, "; ") + ")"
}

// Unmount detaches the mount at path if one is there; no mount is success.
func Unmount(path string) error {
	for {
		err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue // stacked mounts: take them all
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point (any more)
		default:
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
}

func mountRetry(src, dst, fstype string, flags uintptr, data string) error {
	for {
		err := unix.Mount(src, dst, fstype, flags, data)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// NewUserns creates a user namespace with the mapping m and returns it
// open; the process that made it is gone when NewUserns returns. helper
// must be a program that waits (it is started, the namespace file opened,
// then it is killed and reaped).
func NewUserns(m IDMap, helper string, env []string) (*os.File, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	attr := &syscall.ProcAttr{
		Env:   env,
		Files: []uintptr{r.Fd(), ^uintptr(0), ^uintptr(0)},
		Sys: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.HostID), Size: int(m.Size)}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.HostID), Size: int(m.Size)}},
			Pdeathsig:   syscall.SIGKILL,
		},
	}
	pid, err := syscall.ForkExec(helper, []string{"dsec-userns"}, attr)
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("create user namespace: %w", err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	_ = syscall.Kill(pid, syscall.SIGKILL)
	var ws syscall.WaitStatus
	for {
		_, werr := syscall.Wait4(pid, &ws, 0, nil)
		if !errors.Is(werr, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open user namespace: %w", err)
	}
	return f, nil
}

// Path returns the mount of an acquired layer (Acquire's result), or false
// when no sandbox holds it.
func (l *Layers) Path(digest string) (string, bool) {
	name, err := shortName(digest)
	if err != nil {
		return "", false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refs[name] == 0 {
		return "", false
	}
	return filepath.Join(l.dir, name, "r"), true
}

// ReadOnlyOverlay returns a detached, read-only overlay of lowers (highest
// first, detached mounts such as IDMapped returns) without an upper layer:
// the image as it was built, whatever a sandbox wrote over it. One layer
// is returned as a read-only clone of itself.
func ReadOnlyOverlay(lowersTopFirst []*os.File) (*os.File, error) {
	if len(lowersTopFirst) == 0 {
		return nil, fmt.Errorf("overlay: no lower layers")
	}
	if len(lowersTopFirst) == 1 {
		tree, err := unix.OpenTree(int(lowersTopFirst[0].Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
		if err != nil {
			return nil, fmt.Errorf("clone layer: %w", err)
		}
		return os.NewFile(uintptr(tree), "image"), nil
	}
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("overlay: fsopen: %w", err)
	}
	defer unix.Close(fsfd)
	fail := func(what string, err error) error {
		return fmt.Errorf("mount read-only overlay: %s: %w%s", what, err, fsLog(fsfd))
	}
	for i, l := range lowersTopFirst {
		if err := unix.FsconfigSetFd(fsfd, "lowerdir+", int(l.Fd())); err != nil {
			return nil, fail(fmt.Sprintf("layer %d of %d", i+1, len(lowersTopFirst)), err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fail("create", err)
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID)
	if err != nil {
		return nil, fail("fsmount", err)
	}
	return os.NewFile(uintptr(mnt), "image"), nil
}
