package diskquota

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// FS is the set of limited directories under one mount point.
type FS struct {
	run   runner
	mode  Mode
	mnt   string
	image string // ModeProject: the node-level image
	log   *slog.Logger
	// root is MountPoint opened (ModeProject): quotactl_fd and the
	// allocation of project ids go through it.
	root *os.File

	mu sync.Mutex
	// next is the next project id to hand out; ids in [next, reserved)
	// are reserved on disk and unused.
	next, reserved uint32 // guarded by mu
	closed         bool   // guarded by mu
	// loops maps a ModeImage directory to the loop device (loopN) its
	// image was mounted from, so that Remove waits for that one device to
	// unbind without reading every loop device of the host.
	loops map[string]string // guarded by mu
}

// Open makes the file system of cfg ready: in ModeProject it creates and
// formats the image when it does not exist, mounts it (or reuses the mount
// already at MountPoint) and grows it to cfg.Size; in ModeImage it mounts
// every directory's image that is not mounted. Both finish removals a crash
// interrupted.
func Open(ctx context.Context, cfg Config) (*FS, error) {
	cfg, err := checkConfig(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.MountPoint, err = filepath.Abs(cfg.MountPoint); err != nil {
		return nil, fmt.Errorf("disk quota mount point: %w", err)
	}
	if cfg.Image != "" {
		if cfg.Image, err = filepath.Abs(cfg.Image); err != nil {
			return nil, fmt.Errorf("disk quota image: %w", err)
		}
	}
	if cfg.Mode == ModeAuto {
		cfg.Mode = detectMode(cfg)
	}
	f := &FS{mode: cfg.Mode, mnt: cfg.MountPoint, image: cfg.Image, log: cfg.Logger, run: cfg.Run}
	if f.run == nil {
		f.run = execRun
	}
	if f.mode == ModeProject {
		err = f.openProject(ctx, cfg.Size)
	} else {
		err = f.openImage()
	}
	if err != nil {
		return nil, err
	}
	return f, nil
}

// detectMode is ModeAuto's choice for cfg.
func detectMode(cfg Config) Mode {
	if cfg.Image != "" {
		if _, err := os.Stat(cfg.Image); err == nil {
			return ModeProject
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.MountPoint, imagesDir)); err == nil {
		return ModeImage
	}
	if cfg.Image != "" && xfsQuotaSupported() {
		return ModeProject
	}
	return ModeImage
}

// xfsQuotaSupported reports whether the running kernel's XFS has quota
// support: the XFS quota manager adds /proc/fs/xfs/xqm.
func xfsQuotaSupported() bool {
	_, err := os.Stat("/proc/fs/xfs/xqm")
	return err == nil
}

// Mode returns the mode in use.
func (f *FS) Mode() Mode { return f.mode }

// Create makes the directory name with upper/ and work/ in it, limited to
// limitBytes bytes and limitInodes inodes (0 means DefaultLimitBytes and
// one inode per DefaultBytesPerInode bytes). It fails with AlreadyExists
// when name exists and leaves nothing behind when it fails.
func (f *FS) Create(ctx context.Context, name string, limitBytes, limitInodes int64) (Dir, error) {
	if err := f.check(name); err != nil {
		return Dir{}, err
	}
	b, i, err := limits(limitBytes, limitInodes)
	if err != nil {
		return Dir{}, err
	}
	if f.mode == ModeProject {
		return f.createProject(name, b, i)
	}
	return f.createImage(ctx, name, b, i)
}

// Usage returns the bytes and inodes the directory name uses.
func (f *FS) Usage(name string) (bytes, inodes int64, err error) {
	if err := f.check(name); err != nil {
		return 0, 0, err
	}
	if f.mode == ModeProject {
		return f.usageProject(name)
	}
	return f.usageImage(name)
}

// SetLimit changes the limits of the directory name (0 means the defaults
// Create applies). In ModeImage limits only grow: a smaller byte limit, or
// more inodes than the grown file system has, is FailedPrecondition.
func (f *FS) SetLimit(ctx context.Context, name string, limitBytes, limitInodes int64) error {
	if err := f.check(name); err != nil {
		return err
	}
	b, i, err := limits(limitBytes, limitInodes)
	if err != nil {
		return err
	}
	if f.mode == ModeProject {
		return f.setLimitProject(name, b, i)
	}
	return f.setLimitImage(ctx, name, b, i)
}

// Remove deletes the directory name and everything in it and frees its
// limit. Removing a directory that does not exist succeeds. An overlay
// still mounted over the directory (overlayfs holds private clones of its
// layers' mounts) keeps working on deleted files; in ModeImage its file
// system and loop device go when that overlay is unmounted.
func (f *FS) Remove(ctx context.Context, name string) error {
	if err := f.check(name); err != nil {
		return err
	}
	if f.mode == ModeProject {
		return f.removeProject(name)
	}
	return f.removeImage(name)
}

// List returns the directories, sorted by name.
func (f *FS) List() ([]Dir, error) {
	if err := f.check(""); err != nil {
		return nil, err
	}
	if f.mode == ModeProject {
		return f.listProject()
	}
	return f.listImage()
}

// Close unmounts what Open and Create mounted; the loop devices unbind
// themselves once no overlay uses their file system any more. The
// directories and their limits stay, for the next Open, which finds a file
// system still alive under an overlay and mounts it again.
func (f *FS) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	if f.mode == ModeProject {
		return f.closeProject()
	}
	return f.closeImage()
}

// check refuses calls after Close and invalid names ("" skips the name).
func (f *FS) check(name string) error {
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "disk quota %s is closed", f.mnt)
	}
	if name == "" {
		return nil
	}
	return checkName(name)
}

// makeImage creates image, a sparse file of size bytes formatted by mkfs
// (mkfs args... image). The image appears complete or not at all: it is
// made under a temporary name and renamed without replacing anything; an
// existing image is AlreadyExists.
func makeImage(ctx context.Context, run runner, image string, size int64, mkfs string, args ...string) (err error) {
	tmp := image + ".tmp"
	t, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return errdefs.Newf(errdefs.ErrAlreadyExists, "%s is being created", image)
	}
	if err != nil {
		return fmt.Errorf("create image: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	err = t.Truncate(size)
	if cerr := t.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("size image: %w", err)
	}
	if err := run.do(ctx, mkfs, append(args, tmp)...); err != nil {
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, image, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return errdefs.Newf(errdefs.ErrAlreadyExists, "%s exists", image)
		}
		return fmt.Errorf("rename image: %w", err)
	}
	return nil
}

// tools names the package that installs each program run here.
var tools = map[string]string{
	"mkfs.xfs":   "xfsprogs",
	"xfs_growfs": "xfsprogs",
	"mkfs.ext4":  "e2fsprogs",
}

// runner runs a helper program (Config.Run).
type runner func(ctx context.Context, path string, args []string) ([]byte, error)

func execRun(ctx context.Context, path string, args []string) ([]byte, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// do runs a program and returns its output in the error when it fails.
func (run runner) do(ctx context.Context, prog string, args ...string) error {
	path, err := exec.LookPath(prog)
	if err != nil {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "%s not found: apt-get install %s", prog, tools[prog])
	}
	out, err := run(ctx, path, args)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", prog, ctx.Err())
		}
		return fmt.Errorf("%s %v: %w: %s", prog, args, err, bytes.TrimSpace(out))
	}
	return nil
}

// mountImage mounts the file system in image at dir through a loop device:
// the one bound names for it, else a new one (see attachLoop).
func mountImage(image, dir, fstype, opts string, bound map[fileID]string) (loop string, err error) {
	dev, err := attachLoop(image, bound)
	if err != nil {
		return "", err
	}
	// Once mounted, the mount holds the device; closing ours lets
	// LO_FLAGS_AUTOCLEAR unbind it when the mount goes.
	defer dev.Close()
	for {
		err = unix.Mount(dev.Name(), dir, fstype, unix.MS_NOSUID|unix.MS_NODEV, opts)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("mount %s (%s on %s) at %s: %w", fstype, image, dev.Name(), dir, err)
	}
	return filepath.Base(dev.Name()), nil
}

// mountedFrom reports whether dir is the root of a mount, and whether that
// mount is of image through a loop device. A missing dir is not mounted.
func mountedFrom(dir, image string) (mounted, ours bool, err error) {
	var sx unix.Statx_t
	err = unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &sx)
	if errors.Is(err, unix.ENOENT) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("stat %s: %w", dir, err)
	}
	if sx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return false, false, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"cannot tell whether %s is a mount point: this needs Linux 5.8 or later", dir)
	}
	if sx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return false, false, nil
	}
	st := unix.Stat_t{Dev: unix.Mkdev(sx.Dev_major, sx.Dev_minor)}
	loop := loopOf(&st)
	if loop == "" {
		return true, false, nil
	}
	ours, err = loopBacks(loop, image)
	if errors.Is(err, fs.ErrNotExist) {
		return true, false, nil
	}
	return true, ours, err
}

// unmount unmounts dir; no mount there is success. A busy mount (a process
// working in it, a mount on top of it) is FailedPrecondition.
func unmount(dir string) error {
	for {
		err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EBUSY):
			return errdefs.Newf(errdefs.ErrFailedPrecondition,
				"unmount %s: it is in use: stop what runs in it or has it as its working directory", dir)
		default:
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
}

// notFound is the error for a directory name that does not exist.
func notFound(name string) error {
	return errdefs.Newf(errdefs.ErrNotFound, "disk quota directory %s not found", name)
}

// IsFull reports whether err is what a write gets when its directory is
// full: ENOSPC, or EDQUOT (which generic VFS quotas return).
func IsFull(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// FullError returns err as ResourceExhausted, with a message that says
// what to do, when IsFull(err); else err. what names the full thing for
// users ("sandbox vm-abc").
func FullError(what string, err error) error {
	if !IsFull(err) {
		return err
	}
	return errdefs.Newf(errdefs.ErrResourceExhausted,
		"the disk of %s is full: delete files in it, or create it with a larger disk limit", what)
}

// Dir returns the paths of the directory name (made by Create).
func (f *FS) Dir(name string) Dir { return newDir(f.mnt, name, 0) }
