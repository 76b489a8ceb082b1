package diskquota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// loopBlockSize is the logical block size of the loop devices: the file
// systems' block size, which lets the loop driver use direct I/O on the
// backing file.
const loopBlockSize = 4096

// loopAttachTries bounds the retries when another process takes the free
// loop device between LOOP_CTL_GET_FREE and LOOP_CONFIGURE.
const loopAttachTries = 32

// fileID identifies a file: its device and inode numbers.
type fileID struct{ dev, ino uint64 }

// boundLoops returns the loop devices (loopN) bound to files, by file.
func boundLoops() (map[fileID]string, error) {
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	m := make(map[fileID]string, len(files))
	for _, b := range files {
		name := filepath.Base(filepath.Dir(filepath.Dir(b)))
		if id, ok := loopFile(name); ok {
			m[id] = name
		}
	}
	return m, nil
}

// loopFile returns the file the loop device name (loopN) is bound to.
func loopFile(name string) (fileID, bool) {
	dev, err := os.OpenFile("/dev/"+name, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fileID{}, false // unbound meanwhile, or not ours to open
	}
	defer dev.Close()
	info, err := unix.IoctlLoopGetStatus64(int(dev.Fd()))
	if err != nil {
		return fileID{}, false
	}
	return fileID{info.Device, info.Inode}, true
}

// attachLoop returns an open loop device bound to image: the one bound
// already, if bound (from boundLoops) names one, else a free one
// configured with LO_FLAGS_AUTOCLEAR (the device unbinds itself when its
// last user, normally the mount, goes away) and direct I/O (no second copy
// of the data in the host's page cache). bound is nil for an image just
// made, which no device can hold. The caller closes the returned file once
// the device is mounted.
// loopMu serialises finding and binding a free loop device in this
// process.
var loopMu sync.Mutex

func attachLoop(image string, bound map[fileID]string) (dev *os.File, err error) {
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open image: %w", err)
	}
	defer img.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(img.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat image: %w", err)
	}
	if name, ok := bound[fileID{st.Dev, st.Ino}]; ok {
		dev, err := os.OpenFile("/dev/"+name, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			// Opened, the device cannot unbind itself; check that it did
			// not before.
			info, err := unix.IoctlLoopGetStatus64(int(dev.Fd()))
			if err == nil && info.Device == st.Dev && info.Inode == st.Ino {
				return dev, nil
			}
			dev.Close()
		}
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"open /dev/loop-control: %v: load the loop module (modprobe loop) and give the process /dev", err)
	}
	defer ctl.Close()
	// Concurrent attaches in this process would all be handed the same
	// free device; take turns (other processes are handled by retrying).
	loopMu.Lock()
	defer loopMu.Unlock()
	for range loopAttachTries {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open loop device: %w", err)
		}
		err = configureLoop(dev, img, image)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("bind %s to %s: %w", image, dev.Name(), err)
		}
	}
	return nil, errdefs.Newf(errdefs.ErrUnavailable,
		"bind %s to a loop device: every free device was taken by another process %d times; retry", image, loopAttachTries)
}

// configureLoop binds img to dev, with direct I/O when the backing file
// system allows it.
func configureLoop(dev, img *os.File, name string) error {
	cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Size: loopBlockSize}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], name)
	err := unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
	if errors.Is(err, unix.EINVAL) {
		// Kernels that cannot do direct I/O on this backing file refuse
		// the flag instead of ignoring it.
		cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
	}
	return err
}

// loopOf returns the name (loopN) of the loop device that holds the file
// system of st, a stat of a file on it, or "" when st is on something else.
func loopOf(st *unix.Stat_t) string {
	base := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	if _, err := os.Stat(base + "/loop"); err != nil {
		return ""
	}
	target, err := os.Readlink(base)
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}

// loopBacks reports whether the loop device name (loopN) is bound to the
// file image.
func loopBacks(name, image string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err != nil {
		return false, err
	}
	id, ok := loopFile(name)
	return ok && id == fileID{st.Dev, st.Ino}, nil
}

// growLoop makes the loop device name (loopN) see the new size of its
// backing file.
func growLoop(name string) error {
	dev, err := os.OpenFile("/dev/"+name, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer dev.Close()
	return unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_CAPACITY, 0)
}
