// Package diskquota gives each sandbox a writable directory, the upper and
// work dirs of its overlayfs root, whose size is enforced by the kernel: a
// sandbox that fills its directory gets ENOSPC or EDQUOT from its writes,
// and the node's own state is never counted against that limit.
//
// It has two modes, chosen by Config.Mode:
//
//   - ModeProject: one node-level XFS file system in a sparse image file,
//     attached to a loop device and mounted at MountPoint with prjquota.
//     Each directory is MountPoint/<name>, carries its own project id with
//     FS_XFLAG_PROJINHERIT, and its project has hard block and inode
//     limits (quotactl Q_XSETQLIM). It needs a kernel with
//     CONFIG_XFS_QUOTA.
//   - ModeImage: one small ext4 file system per directory, in the sparse
//     image MountPoint/.images/<name>.img, attached to its own loop device
//     and mounted at MountPoint/<name>. The file system's size is the limit
//     and its inode count the inode limit. It needs only ext4 and loop
//     devices, so it works on kernels without quota support.
//
// In both modes a directory holds upper/ and work/ on one file system, as
// overlayfs requires, and a write past the limit fails with ENOSPC, also
// through an overlay and for every uid (XFS reports project quotas as
// ENOSPC; a full ext4 is ENOSPC). FullError turns such an error into
// ResourceExhausted for the API.
//
// ModeImage costs a mkfs.ext4, a loop device and a mount per directory
// (tens of milliseconds per Create), and its limits only grow, which needs
// CAP_SYS_RESOURCE; ModeProject costs a mkdir and two system calls.
//
// Invariants: names are single path components of [a-z0-9._-] that start
// with a letter or digit, so no name walks out of MountPoint and no name
// meets the package's own entries (.ids, .trash, .images, lost+found);
// loop devices are attached with LO_FLAGS_AUTOCLEAR, so unmounting is the
// only cleanup a loop device needs and a crash leaks none; an image already
// bound to a loop device is mounted through that device, never through a
// second one; project ids are reserved on disk before they are used, so a
// restarted process never hands out an id again. Every operation can be
// repeated after a crash: Open remounts what is missing and finishes
// interrupted removals, and Remove of a missing directory succeeds.
//
// An FS is safe for concurrent use on different names; operations on one
// name are serialised by the caller, and Close runs alone.
package diskquota

import (
	"context"
	"log/slog"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Mode is how directories are limited.
type Mode string

// The modes.
const (
	// ModeAuto picks the mode of existing state (an Image file means
	// ModeProject, a MountPoint/.images directory ModeImage), else
	// ModeProject when the running kernel has XFS quota support, else
	// ModeImage.
	ModeAuto Mode = ""
	// ModeProject limits directories of one XFS file system with project
	// quotas.
	ModeProject Mode = "project"
	// ModeImage gives each directory its own ext4 file system.
	ModeImage Mode = "image"
)

// Defaults and bounds.
const (
	// DefaultLimitBytes is the limit of a directory created with limit 0.
	DefaultLimitBytes = 10 << 30
	// DefaultBytesPerInode sets the inode limit of a directory created with
	// inode limit 0: one inode per DefaultBytesPerInode bytes of its limit.
	DefaultBytesPerInode = 16 << 10
	// MinLimitBytes is the smallest byte limit accepted.
	MinLimitBytes = 16 << 20
	// MinLimitInodes is the smallest inode limit accepted.
	MinLimitInodes = 64
	// DefaultSize is the size of the node-level file system in
	// ModeProject when Config.Size is 0.
	DefaultSize = 1 << 40
	// minSize is the smallest node-level file system mkfs.xfs makes.
	minSize = 512 << 20
)

// Config configures Open.
type Config struct {
	// Mode chooses how directories are limited. Default ModeAuto.
	Mode Mode
	// Image is the sparse image file of the node-level file system
	// (ModeProject; required there, ignored in ModeImage). It is created
	// and formatted when it does not exist.
	Image string
	// Size is the size of the node-level file system (ModeProject): of a
	// new image, DefaultSize when 0. The image is sparse, so only what is
	// written takes space on the host; the sum of the directories' limits
	// may exceed it. A Size larger than an existing image grows the image
	// and the file system (xfs_growfs); a smaller one is ignored with a
	// warning, and 0 leaves an existing image as it is.
	Size int64
	// MountPoint is where the node-level file system is mounted
	// (ModeProject) or the directory that holds the per-directory images
	// and their mounts (ModeImage). Required. Created when missing.
	MountPoint string
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
	// Run runs a helper program (mkfs, xfs_growfs) and returns its
	// combined output. Default: os/exec. A process that reaps all its
	// children itself (the keeper) passes its own.
	Run func(ctx context.Context, path string, args []string) ([]byte, error)
}

// Dir is one limited directory.
type Dir struct {
	// Name is the name given to Create.
	Name string
	// Path is MountPoint/<name>.
	Path string
	// Upper is Path/upper, the overlayfs upperdir: owned by root, mode
	// 0755, empty when created.
	Upper string
	// Work is Path/work, the overlayfs workdir, on the same file system as
	// Upper.
	Work string
	// ProjectID is the directory's project id in ModeProject; 0 in
	// ModeImage.
	ProjectID uint32
}

func newDir(mountPoint, name string, id uint32) Dir {
	p := mountPoint + "/" + name
	return Dir{Name: name, Path: p, Upper: p + "/upper", Work: p + "/work", ProjectID: id}
}

// ValidName reports whether name can name a directory: 1 to 128 bytes of
// lower-case letters, digits, '.', '-' and '_', starting with a letter or a
// digit.
func ValidName(name string) bool {
	if name == "" || len(name) > 128 {
		return false
	}
	for i, c := range []byte(name) {
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '-' && c != '_') {
			return false
		}
	}
	return true
}

func checkName(name string) error {
	if !ValidName(name) {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"disk quota name %q is invalid: use 1 to 128 of [a-z0-9._-], starting with a letter or digit", name)
	}
	return nil
}

// limits applies the defaults to a byte and an inode limit and checks them.
func limits(bytes, inodes int64) (int64, int64, error) {
	if bytes == 0 {
		bytes = DefaultLimitBytes
	}
	if bytes < MinLimitBytes {
		return 0, 0, errdefs.Newf(errdefs.ErrInvalidArgument,
			"disk limit %d bytes is too small: use at least %d (16 MiB)", bytes, MinLimitBytes)
	}
	if inodes == 0 {
		inodes = max(bytes/DefaultBytesPerInode, MinLimitInodes)
	}
	if inodes < MinLimitInodes || inodes > 1<<32-1 {
		return 0, 0, errdefs.Newf(errdefs.ErrInvalidArgument,
			"inode limit %d is out of range: use %d to %d", inodes, MinLimitInodes, uint64(1<<32-1))
	}
	return bytes, inodes, nil
}

// checkConfig applies the defaults of cfg that do not depend on the
// machine.
func checkConfig(cfg Config) (Config, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MountPoint == "" {
		return cfg, errdefs.Newf(errdefs.ErrInvalidArgument, "disk quota: no mount point configured")
	}
	switch cfg.Mode {
	case ModeAuto, ModeProject, ModeImage:
	default:
		return cfg, errdefs.Newf(errdefs.ErrInvalidArgument,
			"disk quota mode %q is unknown: use %q, %q or empty for automatic", cfg.Mode, ModeProject, ModeImage)
	}
	if cfg.Size != 0 && cfg.Size < minSize {
		return cfg, errdefs.Newf(errdefs.ErrInvalidArgument,
			"disk quota file system size %d is too small: use at least %d (512 MiB)", cfg.Size, int64(minSize))
	}
	return cfg, nil
}
