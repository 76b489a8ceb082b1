package diskquota

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Entries of the package's own at the root of the node-level file system.
// They belong to project 0, which has no limit.
const (
	// idsFile holds the first project id not yet reserved, in decimal.
	idsFile = ".ids"
	// trashDir holds directories being removed, named by project id.
	trashDir = ".trash"
	// idBlock is how many project ids one write of idsFile reserves.
	idBlock = 1024
)

// mkfsXFSArgs are the options of the node-level file system of size
// bytes: 4 KiB sectors (to match the loop device's block size, which lets
// it use direct I/O), d_type for overlayfs, no reflink (nothing clones
// between sandboxes; it saves a btree per allocation group), one
// allocation group per CPU (at least 4) so that sandboxes writing at once
// allocate in parallel, and a 128 MiB log for large file systems instead of
// the default (up to 2 GiB, written in full by mkfs even on a sparse file).
func mkfsXFSArgs(size int64) []string {
	args := []string{"-q", "-s", "size=4096", "-n", "ftype=1", "-m", "reflink=0",
		"-d", "agcount=" + strconv.Itoa(min(max(runtime.NumCPU(), 4), 64))}
	if size >= 16<<30 {
		args = append(args, "-l", "size=128m")
	}
	return args
}

func (f *FS) openProject(ctx context.Context, size int64) (err error) {
	if f.image == "" {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "disk quota mode %s needs an image file", ModeProject)
	}
	if err := os.MkdirAll(f.mnt, 0o711); err != nil {
		return fmt.Errorf("disk quota mount point: %w", err)
	}
	mounted, ours, err := mountedFrom(f.mnt, f.image)
	if err != nil {
		return err
	}
	if mounted && !ours {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"%s is the mount point of another file system than %s: unmount it or configure another mount point", f.mnt, f.image)
	}
	if !mounted {
		created := false
		if _, err := os.Stat(f.image); errors.Is(err, fs.ErrNotExist) {
			if size == 0 {
				size = DefaultSize
			}
			size &^= 1<<20 - 1
			if err := makeImage(ctx, f.run, f.image, size, "mkfs.xfs", mkfsXFSArgs(size)...); err != nil {
				return fmt.Errorf("make disk quota image: %w", err)
			}
			created = true
			f.log.Info("made disk quota file system", "image", f.image, "size", size)
		}
		var bound map[fileID]string
		if !created {
			if bound, err = boundLoops(); err != nil {
				return fmt.Errorf("list loop devices: %w", err)
			}
		}
		if _, err := mountImage(f.image, f.mnt, "xfs", "prjquota", bound); err != nil {
			if created {
				os.Remove(f.image)
			}
			if errors.Is(err, unix.EINVAL) && !xfsQuotaSupported() {
				return errdefs.Newf(errdefs.ErrFailedPrecondition,
					"this kernel's XFS has no quota support (CONFIG_XFS_QUOTA): use disk quota mode %q", ModeImage)
			}
			return err
		}
		defer func() {
			if err != nil {
				if uerr := unmount(f.mnt); uerr != nil {
					f.log.Warn("unmount disk quota file system", "err", uerr)
				}
			}
		}()
	}
	if f.root, err = os.OpenFile(f.mnt, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return fmt.Errorf("open disk quota root: %w", err)
	}
	defer func() {
		if err != nil {
			f.root.Close()
		}
	}()
	_, enforced, err := projectQuotaState(int(f.root.Fd()))
	if err != nil {
		return fmt.Errorf("read quota state of %s: %w", f.mnt, err)
	}
	if !enforced {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"%s is mounted without prjquota: unmount it so that it is mounted again with project quotas", f.mnt)
	}
	if err := f.growProject(ctx, size); err != nil {
		return err
	}
	if err := f.loadIDs(); err != nil {
		return err
	}
	return f.emptyTrash(ctx)
}

// growProject grows the image and its file system to size when size is
// larger.
func (f *FS) growProject(ctx context.Context, size int64) error {
	size &^= 1<<20 - 1
	st, err := os.Stat(f.image)
	if err != nil {
		return fmt.Errorf("stat disk quota image: %w", err)
	}
	if size == 0 || size == st.Size() {
		return nil
	}
	if size < st.Size() {
		f.log.Warn("disk quota file system is larger than configured; shrinking is not supported, keeping it",
			"image", f.image, "size", st.Size(), "configured", size)
		return nil
	}
	var sx unix.Stat_t
	if err := unix.Fstat(int(f.root.Fd()), &sx); err != nil {
		return err
	}
	loop := loopOf(&sx)
	if loop == "" {
		return fmt.Errorf("grow disk quota file system: %s is not on a loop device", f.mnt)
	}
	if err := os.Truncate(f.image, size); err != nil {
		return fmt.Errorf("grow disk quota image: %w", err)
	}
	if err := growLoop(loop); err != nil {
		return fmt.Errorf("grow %s: %w", loop, err)
	}
	if err := f.run.do(ctx, "xfs_growfs", "-d", f.mnt); err != nil {
		return fmt.Errorf("grow disk quota file system: %w", err)
	}
	f.log.Info("grew disk quota file system", "image", f.image, "from", st.Size(), "to", size)
	return nil
}

// loadIDs sets the next project id past every id reserved on disk and
// every id in use.
func (f *FS) loadIDs() error {
	next := uint64(1)
	b, err := os.ReadFile(filepath.Join(f.mnt, idsFile))
	switch {
	case err == nil:
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
		if err != nil {
			return fmt.Errorf("read %s: %w", idsFile, err)
		}
		next = max(next, n)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("read project ids: %w", err)
	}
	dirs, err := f.listProject()
	if err != nil {
		return err
	}
	for _, d := range dirs {
		next = max(next, uint64(d.ProjectID)+1)
	}
	if next > math.MaxUint32 {
		next = math.MaxUint32
	}
	f.mu.Lock()
	f.next, f.reserved = uint32(next), uint32(next)
	f.mu.Unlock()
	return nil
}

// allocID returns a project id never handed out before, reserving a block
// of ids on disk first when none is left.
func (f *FS) allocID() (uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.next == f.reserved {
		if f.reserved > math.MaxUint32-idBlock {
			return 0, errdefs.Newf(errdefs.ErrResourceExhausted,
				"disk quota %s has used every project id: make a new file system", f.image)
		}
		end := f.reserved + idBlock
		if err := writeFileSync(filepath.Join(f.mnt, idsFile), []byte(strconv.FormatUint(uint64(end), 10)+"\n")); err != nil {
			return 0, fmt.Errorf("reserve project ids: %w", err)
		}
		f.reserved = end
	}
	id := f.next
	f.next++
	return id, nil
}

// writeFileSync replaces file with data atomically and durably.
func writeFileSync(file string, data []byte) error {
	tmp := file + ".tmp"
	t, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	_, err = t.Write(data)
	if err == nil {
		err = t.Sync()
	}
	if cerr := t.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, file)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	d, err := os.Open(filepath.Dir(file))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (f *FS) createProject(name string, bytes, inodes int64) (d Dir, err error) {
	d = newDir(f.mnt, name, 0)
	if err := os.Mkdir(d.Path, 0o711); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return Dir{}, errdefs.Newf(errdefs.ErrAlreadyExists, "disk quota directory %s exists", name)
		}
		return Dir{}, fmt.Errorf("create disk quota directory: %w", err)
	}
	defer func() {
		if err != nil {
			if rerr := os.RemoveAll(d.Path); rerr != nil {
				f.log.Warn("remove disk quota directory", "dir", d.Path, "err", rerr)
			}
			if d.ProjectID != 0 {
				if cerr := setProjectLimits(int(f.root.Fd()), d.ProjectID, 0, 0); cerr != nil {
					f.log.Warn("clear project limits", "project", d.ProjectID, "err", cerr)
				}
			}
		}
	}()
	id, err := f.allocID()
	if err != nil {
		return Dir{}, err
	}
	d.ProjectID = id
	if err := setProjectLimits(int(f.root.Fd()), id, bytes, inodes); err != nil {
		return Dir{}, fmt.Errorf("set limits of project %d: %w", id, err)
	}
	if err := setProject(d.Path, id); err != nil {
		return Dir{}, err
	}
	if err := makeUpperWork(d); err != nil {
		return Dir{}, err
	}
	return d, nil
}

// makeUpperWork makes d's upper and work directories.
func makeUpperWork(d Dir) error {
	for _, p := range []string{d.Upper, d.Work} {
		if err := os.Mkdir(p, 0o700); err != nil {
			return fmt.Errorf("create disk quota directory: %w", err)
		}
	}
	if err := os.Chmod(d.Upper, 0o755); err != nil {
		return fmt.Errorf("create disk quota directory: %w", err)
	}
	return nil
}

// setProject gives dir the project id and makes what is created in it
// inherit the id.
func setProject(dir string, id uint32) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	a, err := getFsxattr(fd)
	if err != nil {
		return fmt.Errorf("get attributes of %s: %w", dir, err)
	}
	a.projid = id
	a.xflags |= fsXflagProjinherit
	if err := setFsxattr(fd, &a); err != nil {
		return fmt.Errorf("set project %d on %s: %w", id, dir, err)
	}
	return nil
}

// projectOf returns the project id of the directory name; NotFound when it
// does not exist.
func (f *FS) projectOf(name string) (uint32, error) {
	fd, err := unix.Openat(int(f.root.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.ENOENT) {
		return 0, notFound(name)
	}
	if err != nil {
		return 0, fmt.Errorf("open disk quota directory %s: %w", name, err)
	}
	defer unix.Close(fd)
	a, err := getFsxattr(fd)
	if err != nil {
		return 0, fmt.Errorf("get project of %s: %w", name, err)
	}
	if a.projid == 0 {
		return 0, errdefs.Newf(errdefs.ErrNotFound, "disk quota directory %s has no project: remove it and create it again", name)
	}
	return a.projid, nil
}

func (f *FS) usageProject(name string) (int64, int64, error) {
	id, err := f.projectOf(name)
	if err != nil {
		return 0, 0, err
	}
	q, err := getProjectQuota(int(f.root.Fd()), id)
	if err != nil {
		return 0, 0, fmt.Errorf("get quota of project %d: %w", id, err)
	}
	return int64(q.bcount) * basicBlock, int64(q.icount), nil
}

func (f *FS) setLimitProject(name string, bytes, inodes int64) error {
	id, err := f.projectOf(name)
	if err != nil {
		return err
	}
	if err := setProjectLimits(int(f.root.Fd()), id, bytes, inodes); err != nil {
		return fmt.Errorf("set limits of project %d: %w", id, err)
	}
	return nil
}

// removeProject moves the directory to the trash (so that it is gone from
// List at once and a crash leaves it to Open), deletes it and clears the
// limits of its project.
func (f *FS) removeProject(name string) error {
	id, err := f.projectOf(name)
	if err != nil && !errdefs.Is(err, errdefs.ErrNotFound) {
		return err
	}
	trash := filepath.Join(f.mnt, trashDir)
	if err := os.Mkdir(trash, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("remove disk quota directory: %w", err)
	}
	// A directory without a project (a crash between mkdir and setting
	// it) has id 0 here and is only deleted.
	entry := strconv.FormatUint(uint64(id), 10) + "-" + name
	if err := os.Rename(filepath.Join(f.mnt, name), filepath.Join(trash, entry)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove disk quota directory: %w", err)
	}
	return f.removeTrashEntry(entry)
}

// emptyTrash finishes the removals a crash interrupted.
func (f *FS) emptyTrash(ctx context.Context) error {
	ents, err := os.ReadDir(filepath.Join(f.mnt, trashDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read disk quota trash: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		errs = append(errs, f.removeTrashEntry(e.Name()))
	}
	return errors.Join(errs...)
}

// removeTrashEntry deletes the trash entry <id>-<name> and clears the
// limits of project id.
func (f *FS) removeTrashEntry(entry string) error {
	if err := os.RemoveAll(filepath.Join(f.mnt, trashDir, entry)); err != nil {
		return fmt.Errorf("remove disk quota directory: %w", err)
	}
	idStr, _, _ := strings.Cut(entry, "-")
	if id, err := strconv.ParseUint(idStr, 10, 32); err == nil && id != 0 {
		if err := setProjectLimits(int(f.root.Fd()), uint32(id), 0, 0); err != nil {
			return fmt.Errorf("clear limits of project %d: %w", id, err)
		}
	}
	return nil
}

func (f *FS) listProject() ([]Dir, error) {
	ents, err := os.ReadDir(f.mnt)
	if err != nil {
		return nil, fmt.Errorf("list disk quota directories: %w", err)
	}
	var dirs []Dir
	for _, e := range ents {
		if !e.IsDir() || !ValidName(e.Name()) {
			continue
		}
		id, err := f.projectOf(e.Name())
		if errdefs.Is(err, errdefs.ErrNotFound) {
			id = 0 // a crash before its project was set; Remove deletes it
		} else if err != nil {
			return nil, err
		}
		dirs = append(dirs, newDir(f.mnt, e.Name(), id))
	}
	slices.SortFunc(dirs, func(a, b Dir) int { return strings.Compare(a.Name, b.Name) })
	return dirs, nil
}

func (f *FS) closeProject() error {
	err := f.root.Close()
	return errors.Join(err, unmount(f.mnt))
}
