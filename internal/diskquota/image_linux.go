package diskquota

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// imagesDir holds the images of ModeImage, MountPoint/.images/<name>.img.
const imagesDir = ".images"

// ext4BlockSize is the block size of the per-directory file systems.
const ext4BlockSize = 4096

// ext4MountOptions turns off dioread_nolock: with it, buffered writes go
// through unwritten extents, and a file system filled to the last block
// (which sandboxes do) logs ext4_convert_unwritten_extents_endio warnings.
const ext4MountOptions = "nodioread_nolock"

// mkfsExt4Args are the options of a directory's file system with inodes
// inodes: 4 KiB blocks and 256-byte inodes whatever the size (mke2fs picks
// 1 KiB blocks and 128-byte inodes for small ones), no blocks reserved for
// root (which would be space a sandbox cannot use), and no journal: a
// sandbox's writable layer does not outlive a crash of the node, and a
// journal would add a jbd2 thread per mount and write amplification.
// mke2fs punches holes over the sparse image instead of zeroing the inode
// tables, and without the blocks reserved for online resizing (which an
// image mode file system cannot use here anyway) a new 10 GiB image takes
// about 230 KiB of the host's disk, so copying the template is cheap.
func mkfsExt4Args(inodes int64) []string {
	return []string{"-q", "-F", "-T", "default", "-b", strconv.Itoa(ext4BlockSize), "-I", "256", "-m", "0",
		"-O", "^has_journal,^resize_inode", "-N", strconv.FormatInt(inodes, 10), "-E", "root_owner=0:0"}
}

func (f *FS) imagePath(name string) string {
	return filepath.Join(f.mnt, imagesDir, name+".img")
}

// openImage mounts every directory's image that is not mounted and removes
// what a crash left: images half made, mount points without an image.
func (f *FS) openImage() error {
	if err := os.MkdirAll(filepath.Join(f.mnt, imagesDir), 0o700); err != nil {
		return fmt.Errorf("disk quota directory: %w", err)
	}
	if err := os.Chmod(f.mnt, 0o711); err != nil {
		return fmt.Errorf("disk quota directory: %w", err)
	}
	ents, err := os.ReadDir(filepath.Join(f.mnt, imagesDir))
	if err != nil {
		return fmt.Errorf("list disk quota images: %w", err)
	}
	bound, err := boundLoops()
	if err != nil {
		return fmt.Errorf("list loop devices: %w", err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			os.Remove(filepath.Join(f.mnt, imagesDir, e.Name()))
			continue
		}
		name, ok := strings.CutSuffix(e.Name(), ".img")
		if !ok || !ValidName(name) {
			continue
		}
		if err := f.mountDir(name, bound); err != nil {
			// One broken image must not keep the node's other sandboxes
			// from their files; Usage and Remove still see it.
			f.log.Warn("mount disk quota directory", "name", name, "err", err)
		}
	}
	ents, err = os.ReadDir(f.mnt)
	if err != nil {
		return fmt.Errorf("list disk quota directories: %w", err)
	}
	for _, e := range ents {
		if !ValidName(e.Name()) {
			continue
		}
		if _, err := os.Stat(f.imagePath(e.Name())); errors.Is(err, fs.ErrNotExist) {
			dir := filepath.Join(f.mnt, e.Name())
			if err := unmount(dir); err == nil {
				os.Remove(dir) // only an empty mount point goes
			}
		}
	}
	return nil
}

// mountDir mounts the image of name at MountPoint/<name> unless it is
// mounted there already; bound is boundLoops(), or nil for an image just
// made.
func (f *FS) mountDir(name string, bound map[fileID]string) error {
	dir := filepath.Join(f.mnt, name)
	mounted, ours, err := mountedFrom(dir, f.imagePath(name))
	switch {
	case err != nil:
		return err
	case ours:
		var st unix.Stat_t
		if unix.Stat(dir, &st) == nil {
			f.setLoop(name, loopOf(&st))
		}
		return nil
	case mounted:
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"%s is the mount point of another file system: unmount it", dir)
	}
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create mount point: %w", err)
	}
	loop, err := mountImage(f.imagePath(name), dir, "ext4", ext4MountOptions, bound)
	if err != nil {
		return err
	}
	f.setLoop(name, loop)
	return nil
}

// setLoop records the loop device (loopN) of name's image; "" forgets it.
func (f *FS) setLoop(name, loop string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if loop == "" {
		delete(f.loops, name)
		return
	}
	if f.loops == nil {
		f.loops = map[string]string{}
	}
	f.loops[name] = loop
}

// waitImageReleased waits until no loop device is bound to name's image,
// or d: the device recorded at its mount when there is one, else any.
func (f *FS) waitImageReleased(name string, d time.Duration) {
	f.mu.Lock()
	loop := f.loops[name]
	delete(f.loops, name)
	f.mu.Unlock()
	image := f.imagePath(name)
	if loop == "" {
		waitLoopReleased(image, d)
		return
	}
	deadline := time.Now().Add(d)
	for {
		if bound, err := loopBacks(loop, image); err != nil || !bound || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *FS) createImage(ctx context.Context, name string, bytes, inodes int64) (d Dir, err error) {
	d = newDir(f.mnt, name, 0)
	img := f.imagePath(name)
	if _, err := os.Stat(img); err == nil {
		return Dir{}, errdefs.Newf(errdefs.ErrAlreadyExists, "disk quota directory %s exists", name)
	}
	size := roundUp(bytes, ext4BlockSize)
	if err := f.makeExt4(ctx, img, size, inodes); err != nil {
		if errdefs.Is(err, errdefs.ErrAlreadyExists) {
			return Dir{}, errdefs.Newf(errdefs.ErrAlreadyExists, "disk quota directory %s exists", name)
		}
		return Dir{}, fmt.Errorf("make disk quota image: %w", err)
	}
	defer func() {
		if err != nil {
			if uerr := unmount(d.Path); uerr != nil {
				f.log.Warn("unmount disk quota directory", "dir", d.Path, "err", uerr)
			}
			os.Remove(d.Path)
			os.Remove(img)
		}
	}()
	if err := f.mountDir(name, nil); err != nil {
		return Dir{}, err
	}
	if err := makeUpperWork(d); err != nil {
		return Dir{}, err
	}
	return d, nil
}

// statDir returns the statfs of the mounted directory name: NotFound when
// it has no image, FailedPrecondition when it is not mounted.
func (f *FS) statDir(name string) (unix.Statfs_t, error) {
	var st unix.Statfs_t
	dir := filepath.Join(f.mnt, name)
	if _, err := os.Stat(f.imagePath(name)); errors.Is(err, fs.ErrNotExist) {
		return st, notFound(name)
	}
	_, ours, err := mountedFrom(dir, f.imagePath(name))
	if err != nil {
		return st, err
	}
	if !ours {
		return st, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"disk quota directory %s is not mounted: its image failed to mount (see the log); remove it", name)
	}
	if err := unix.Statfs(dir, &st); err != nil {
		return st, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st, nil
}

// usageImage counts what the file system uses: the files, and the root
// and lost+found directories and the 11 inodes ext4 reserves.
func (f *FS) usageImage(name string) (int64, int64, error) {
	st, err := f.statDir(name)
	if err != nil {
		return 0, 0, err
	}
	return int64(st.Blocks-st.Bfree) * int64(st.Bsize), int64(st.Files - st.Ffree), nil
}

func (f *FS) setLimitImage(ctx context.Context, name string, bytes, inodes int64) error {
	st, err := f.statDir(name)
	if err != nil {
		return err
	}
	img := f.imagePath(name)
	info, err := os.Stat(img)
	if err != nil {
		return fmt.Errorf("stat disk quota image: %w", err)
	}
	size := roundUp(bytes, ext4BlockSize)
	switch {
	case size < info.Size():
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"disk quota directory %s cannot shrink from %d to %d bytes in mode %s: copy its files to a new one",
			name, info.Size(), size, ModeImage)
	case size == info.Size() && inodes > int64(st.Files):
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"disk quota directory %s has %d inodes; in mode %s more come only with more bytes", name, st.Files, ModeImage)
	case size == info.Size():
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !hasCapability(unix.CAP_SYS_RESOURCE) {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"growing disk quota directory %s in mode %s needs CAP_SYS_RESOURCE (ext4 online resize), which this process lacks",
			name, ModeImage)
	}
	dir := filepath.Join(f.mnt, name)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	var sx unix.Stat_t
	if err := unix.Fstat(fd, &sx); err != nil {
		return err
	}
	loop := loopOf(&sx)
	if loop == "" {
		return fmt.Errorf("grow %s: not on a loop device", dir)
	}
	if err := os.Truncate(img, size); err != nil {
		return fmt.Errorf("grow disk quota image: %w", err)
	}
	if err := growLoop(loop); err != nil {
		return fmt.Errorf("grow %s: %w", loop, err)
	}
	if err := ext4Resize(fd, uint64(size/ext4BlockSize)); err != nil {
		return fmt.Errorf("grow file system of %s: %w", name, err)
	}
	if err := unix.Fstatfs(fd, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if inodes > int64(st.Files) {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"disk quota directory %s grew to %d bytes but has %d inodes, not %d: in mode %s inodes come only with bytes",
			name, size, st.Files, inodes, ModeImage)
	}
	return nil
}

// removeImage unmounts the directory, then deletes its image and mount
// point.
func (f *FS) removeImage(name string) error {
	dir := filepath.Join(f.mnt, name)
	if err := unmount(dir); err != nil {
		return err
	}
	if _, err := os.Lstat(f.imagePath(name)); errors.Is(err, fs.ErrNotExist) {
		// Nothing to wait for: no image, no loop device (and looking for
		// one would read every loop device of the host).
		f.setLoop(name, "")
		if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove disk quota directory: %w", err)
		}
		return nil
	}
	// The kernel unbinds an autoclear loop device after the last user
	// goes, asynchronously; wait a little so that a removed directory
	// leaves no device behind when Remove returns.
	f.waitImageReleased(name, 2*time.Second)
	if err := os.Remove(f.imagePath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove disk quota image: %w", err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove disk quota directory: %w", err)
	}
	return nil
}

func (f *FS) listImage() ([]Dir, error) {
	ents, err := os.ReadDir(filepath.Join(f.mnt, imagesDir))
	if err != nil {
		return nil, fmt.Errorf("list disk quota images: %w", err)
	}
	var dirs []Dir
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), ".img"); ok && ValidName(name) {
			dirs = append(dirs, newDir(f.mnt, name, 0))
		}
	}
	slices.SortFunc(dirs, func(a, b Dir) int { return strings.Compare(a.Name, b.Name) })
	return dirs, nil
}

func (f *FS) closeImage() error {
	dirs, err := f.listImage()
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		errs = append(errs, unmount(d.Path))
	}
	for _, d := range dirs {
		f.waitImageReleased(d.Name, 2*time.Second)
	}
	return errors.Join(errs...)
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// hasCapability reports whether the process has capability c in its
// effective set.
func hasCapability(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

// maxTemplates bounds the formatted images kept to copy from, one per
// distinct pair of limits.
const maxTemplates = 8

// templateVersion names the options of mkfsExt4Args: change it when they
// change, so that templates made with the old ones are not used.
const templateVersion = "v2"

// makeExt4 makes img, an ext4 image of size bytes and inodes inodes, as a
// copy of a template made by mkfs.ext4 on first use: copying the few MiB a
// fresh file system has written is faster than running mkfs.ext4. Copies
// share the template's UUID and directory hash seed.
func (f *FS) makeExt4(ctx context.Context, img string, size, inodes int64) error {
	dir := filepath.Join(f.mnt, imagesDir)
	tmpl := filepath.Join(dir, fmt.Sprintf(".template-%s-%d-%d", templateVersion, size, inodes))
	if _, err := os.Stat(tmpl); errors.Is(err, fs.ErrNotExist) {
		have, _ := filepath.Glob(filepath.Join(dir, ".template-*[0-9]"))
		if len(have) >= maxTemplates {
			return makeImage(ctx, f.run, img, size, "mkfs.ext4", mkfsExt4Args(inodes)...)
		}
		err := makeImage(ctx, f.run, tmpl, size, "mkfs.ext4", mkfsExt4Args(inodes)...)
		if errdefs.Is(err, errdefs.ErrAlreadyExists) {
			// Another Create is making it: do not wait for it.
			return makeImage(ctx, f.run, img, size, "mkfs.ext4", mkfsExt4Args(inodes)...)
		}
		if err != nil {
			return err
		}
	}
	return copyImage(tmpl, img)
}

// copyImage copies the sparse file from to the new file to, with its holes,
// under a temporary name first.
func copyImage(from, to string) (err error) {
	src, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("open template: %w", err)
	}
	defer src.Close()
	info, err := src.Stat()
	if err != nil {
		return err
	}
	tmp := to + ".tmp"
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return errdefs.Newf(errdefs.ErrAlreadyExists, "%s is being created", to)
	}
	if err != nil {
		return fmt.Errorf("create image: %w", err)
	}
	defer func() {
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if err := dst.Truncate(info.Size()); err != nil {
		return fmt.Errorf("size image: %w", err)
	}
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	for off := int64(0); off < info.Size(); {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("copy image: %w", err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("copy image: %w", err)
		}
		for in, out := data, data; in < hole; {
			n, err := unix.CopyFileRange(sfd, &in, dfd, &out, int(hole-in), 0)
			if err != nil {
				return fmt.Errorf("copy image: %w", err)
			}
			if n == 0 {
				return fmt.Errorf("copy image: %s ended early", from)
			}
		}
		off = hole
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return errdefs.Newf(errdefs.ErrAlreadyExists, "%s exists", to)
		}
		return fmt.Errorf("rename image: %w", err)
	}
	return nil
}

// waitLoopReleased waits until no loop device is bound to image, or d.
func waitLoopReleased(image string, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		if !loopBound(image) || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// loopBound reports whether a loop device is bound to image.
func loopBound(image string) bool {
	ents, _ := os.ReadDir("/sys/block")
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err == nil && strings.TrimSpace(string(b)) == image {
			return true
		}
	}
	return false
}
