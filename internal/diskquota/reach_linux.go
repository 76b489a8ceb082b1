package diskquota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Reach makes the directory name reachable at Dir(name).Path in the
// calling process's mount namespace for a while, and returns what undoes
// that. In ModeProject the directory is always reachable. In ModeImage the
// directory's file system may be mounted only in another mount namespace
// (a sandbox's, once its creator detached its own mount): Reach mounts it
// again through the loop device that already holds its image, so both
// mounts share one super block. It never binds a second loop device to an
// image that is in use, which would put two file systems on one disk;
// an image bound to no device is FailedPrecondition.
func (f *FS) Reach(name string) (release func() error, err error) {
	if err := f.check(name); err != nil {
		return nil, err
	}
	noop := func() error { return nil }
	if f.mode != ModeImage {
		return noop, nil
	}
	dir, image := filepath.Join(f.mnt, name), f.imagePath(name)
	_, ours, err := mountedFrom(dir, image)
	if err != nil {
		return nil, err
	}
	if ours {
		return noop, nil
	}
	img, err := os.Open(image)
	if errors.Is(err, os.ErrNotExist) {
		return nil, notFound(name)
	}
	if err != nil {
		return nil, fmt.Errorf("open disk quota image: %w", err)
	}
	var st unix.Stat_t
	err = unix.Fstat(int(img.Fd()), &st)
	img.Close()
	if err != nil {
		return nil, fmt.Errorf("stat disk quota image: %w", err)
	}
	// The device the image was mounted through, when this FS mounted it;
	// else a scan of every loop device (slow on hosts with thousands).
	f.mu.Lock()
	loop := f.loops[name]
	f.mu.Unlock()
	dev, err := openLoopOf(loop, st)
	if err != nil {
		bound, berr := boundLoops()
		if berr != nil {
			return nil, berr
		}
		var ok bool
		if loop, ok = bound[fileID{uint64(st.Dev), st.Ino}]; !ok {
			return nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
				"disk quota directory %s is mounted nowhere (its image has no loop device): nothing uses it", name)
		}
		if dev, err = openLoopOf(loop, st); err != nil {
			return nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
				"disk quota directory %s: its loop device %s was released meanwhile: nothing uses it", name, loop)
		}
	}
	defer dev.Close()
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("create mount point: %w", err)
	}
	for {
		err = unix.Mount(dev.Name(), dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ext4MountOptions)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("mount %s (%s) at %s again: %w", image, dev.Name(), dir, err)
	}
	return func() error { return unmount(dir) }, nil
}

// openLoopOf opens the loop device loop (loopN) if it is bound to the file
// st describes. Opened, the device cannot unbind itself.
func openLoopOf(loop string, st unix.Stat_t) (*os.File, error) {
	if loop == "" {
		return nil, os.ErrNotExist
	}
	dev, err := os.OpenFile("/dev/"+loop, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	info, err := unix.IoctlLoopGetStatus64(int(dev.Fd()))
	if err != nil || info.Device != uint64(st.Dev) || info.Inode != st.Ino {
		dev.Close()
		return nil, fmt.Errorf("%s is not bound to the image", loop)
	}
	return dev, nil
}
