package doctor

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/layer"
	"github.com/dsecproject/dsec/internal/nsexec"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// stage is a step of the mount probe, in order.
type stage int

const (
	stageSetup   stage = iota + 1 // temporary directory, image, user namespace
	stageEROFS                    // file-backed EROFS mount
	stageIDMap                    // idmapped view of it (rootfs.Layers)
	stageOverlay                  // overlayfs over the view (rootfs.Overlay)
)

// stageError is the failure of one stage of the probe.
type stageError struct {
	stage stage
	err   error
}

func (e *stageError) Error() string { return e.err.Error() }
func (e *stageError) Unwrap() error { return e.err }

// The probe image: a file owned by 0:0 and one owned by 1:1, so that a
// mapping shows on both.
const (
	probeText  = "dsec doctor\n"
	probeOwned = 1 // uid and gid of "owned"
)

// probeResult is what a successful probe saw.
type probeResult struct {
	imageSize int64
	upperFS   string // file system type of the overlay's upper dir
}

// runMountProbe builds a small EROFS image in a temporary directory (in
// the state dir when it exists, so the overlay's upper dir lands on the
// file system dsec will use) and runs the stages up to upTo in a private
// mount namespace, checking what each shows. Everything is removed before
// it returns.
func runMountProbe(ctx context.Context, env Env, upTo stage) (probeResult, error) {
	var res probeResult
	setupErr := func(format string, args ...any) error {
		return &stageError{stageSetup, fmt.Errorf(format, args...)}
	}
	base := os.TempDir()
	if fi, err := os.Stat(env.StateDir); err == nil && fi.IsDir() {
		base = env.StateDir
	}
	dir, err := os.MkdirTemp(base, ".dsec-doctor-")
	if err != nil {
		return res, setupErr("make a temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil {
		res.upperFS = fsTypeName(st.Type)
	}
	image, digest, size, err := buildProbeImage(ctx, dir)
	if err != nil {
		return res, setupErr("build the probe image: %w", err)
	}
	res.imageSize = size
	var userns *os.File
	if upTo >= stageIDMap {
		userns, err = rootfs.NewUserns(env.IDMap, env.Binary, nsexec.PauseEnv())
		if err != nil {
			return res, setupErr("%w", err)
		}
		defer userns.Close()
	}
	err = inPrivateMountNS(func() error {
		if err := probeEROFS(dir, image); err != nil {
			return &stageError{stageEROFS, err}
		}
		if upTo < stageIDMap {
			return nil
		}
		layers, err := rootfs.NewLayers(filepath.Join(dir, "layers"), slog.New(slog.DiscardHandler))
		if err != nil {
			return &stageError{stageIDMap, err}
		}
		raw, err := layers.Acquire(digest, image)
		if err != nil {
			return &stageError{stageIDMap, err}
		}
		defer layers.Release(digest)
		view, err := rootfs.IDMapped(raw, userns)
		if err != nil {
			return &stageError{stageIDMap, err}
		}
		defer view.Close()
		if err := checkOwners(fmt.Sprintf("/proc/self/fd/%d", view.Fd()), env.IDMap, "the idmapped view"); err != nil {
			return &stageError{stageIDMap, err}
		}
		if upTo < stageOverlay {
			return nil
		}
		if err := probeOverlay(dir, view, env.IDMap); err != nil {
			return &stageError{stageOverlay, err}
		}
		return nil
	})
	var se *stageError
	if err != nil && !errors.As(err, &se) {
		err = &stageError{stageSetup, err} // unshare or making mounts private
	}
	return res, err
}

// buildProbeImage writes the probe image into dir with internal/layer.
func buildProbeImage(ctx context.Context, dir string) (path, digest string, size int64, err error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1_700_000_000, 0)
	for _, h := range []struct {
		name     string
		typ      byte
		mode     int64
		uid, gid int
		data     string
	}{
		{"etc/", tar.TypeDir, 0o755, 0, 0, ""},
		{"hello", tar.TypeReg, 0o644, 0, 0, probeText},
		{"owned", tar.TypeReg, 0o644, probeOwned, probeOwned, "owned\n"},
	} {
		hdr := &tar.Header{Name: h.name, Typeflag: h.typ, Mode: h.mode, Uid: h.uid, Gid: h.gid,
			Size: int64(len(h.data)), ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", "", 0, err
		}
		if _, err := tw.Write([]byte(h.data)); err != nil {
			return "", "", 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return "", "", 0, err
	}
	path = filepath.Join(dir, "probe.erofs")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		return "", "", 0, err
	}
	info, err := layer.BuildFromTar(ctx, &buf, f, layer.Options{TempDir: dir})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", "", 0, err
	}
	return path, info.Digest, info.Size, nil
}

// probeEROFS mounts the image straight from its file, as rootfs.Layers
// does, reads it back and unmounts it.
func probeEROFS(dir, image string) (err error) {
	mnt := filepath.Join(dir, "erofs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	if err := unix.Mount(image, mnt, "erofs", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("mount(%s, erofs): %w", filepath.Base(image), err)
	}
	defer func() {
		if uerr := rootfs.Unmount(mnt); err == nil {
			err = uerr
		}
	}()
	b, err := os.ReadFile(filepath.Join(mnt, "hello"))
	if err != nil {
		return fmt.Errorf("read the mounted image: %w", err)
	}
	if string(b) != probeText {
		return fmt.Errorf("the mounted image reads %q, want %q", b, probeText)
	}
	return checkOwners(mnt, rootfs.IDMap{HostID: 0, Size: 1 << 31}, "the EROFS mount")
}

// checkOwners checks that the probe image's files under dir (hello and
// owned, or only those named) show the owners the image gives them, mapped
// by m.
func checkOwners(dir string, m rootfs.IDMap, what string, only ...string) error {
	for _, f := range []struct {
		name string
		id   uint32
	}{{"hello", 0}, {"owned", probeOwned}} {
		if len(only) > 0 && !slices.Contains(only, f.name) {
			continue
		}
		want, ok := m.ToHost(f.id)
		if !ok {
			continue // the range is too small to show this id
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, f.name), &st); err != nil {
			return fmt.Errorf("stat in %s: %w", what, err)
		}
		if st.Uid != want || st.Gid != want {
			return fmt.Errorf("%s shows %s owned by %d:%d, want %d:%d", what, f.name, st.Uid, st.Gid, want, want)
		}
	}
	return nil
}

// probeOverlay mounts an overlayfs over the idmapped view as a sandbox's
// root is mounted (rootfs.Overlay), then writes a file and copies one up,
// which must keep its mapped owner.
func probeOverlay(dir string, view *os.File, m rootfs.IDMap) (err error) {
	target, upper, work := filepath.Join(dir, "root"), filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []string{target, upper, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	if err := rootfs.Overlay(target, upper, work, []*os.File{view}); err != nil {
		return err
	}
	defer func() {
		if uerr := rootfs.Unmount(target); err == nil {
			err = uerr
		}
	}()
	if err := checkOwners(target, m, "the overlay"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(target, "new"), []byte("new\n"), 0o644); err != nil {
		return fmt.Errorf("write into the overlay: %w", err)
	}
	if _, err := os.Stat(filepath.Join(upper, "new")); err != nil {
		return fmt.Errorf("a file written into the overlay is not in its upper dir: %w", err)
	}
	if err := os.Chmod(filepath.Join(target, "owned"), 0o600); err != nil {
		return fmt.Errorf("copy up a file of the lower layer: %w", err)
	}
	return checkOwners(upper, m, "the upper dir after copy-up", "owned")
}

// fsTypeName names the file systems a state dir may be on.
func fsTypeName(t int64) string {
	switch t {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	case 0x2fc12fc1:
		return "zfs"
	}
	return fmt.Sprintf("file system 0x%x", t)
}
