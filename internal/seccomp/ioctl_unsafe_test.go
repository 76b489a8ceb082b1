//go:build amd64 || arm64

package seccomp

import (
	"testing"
	"unsafe"
)

// Go mirrors of the XFS ioctl arguments (xfs_fs.h). On amd64 and arm64 Go
// lays these fields out as C does (8-byte alignment of 64-bit fields, size
// a multiple of the alignment), so their sizes check the hand-computed
// ones the ioctl numbers are built from.
type (
	xfsBstime struct {
		_ int64 // tv_sec (__kernel_long_t)
		_ int32 // tv_nsec
	}
	xfsBstat struct {
		_ uint64       // bs_ino
		_ [2]uint16    // bs_mode, bs_nlink
		_ [3]uint32    // bs_uid, bs_gid, bs_rdev
		_ int32        // bs_blksize
		_ int64        // bs_size
		_ [3]xfsBstime // bs_atime, bs_mtime, bs_ctime
		_ int64        // bs_blocks
		_ [4]uint32    // bs_xflags, bs_extsize, bs_extents, bs_gen
		_ [5]uint16    // bs_projid_lo, bs_forkoff, bs_projid_hi, bs_sick, bs_checked
		_ [2]byte      // bs_pad
		_ [2]uint32    // bs_cowextsize, bs_dmevmask
		_ [2]uint16    // bs_dmstate, bs_aextents
	}
	xfsSwapext struct {
		_    [5]int64 // sx_version, sx_fdtarget, sx_fdtmp, sx_offset, sx_length
		_    [16]byte // sx_pad
		stat xfsBstat // sx_stat
	}
	xfsExchangeRange struct {
		_ int32     // file1_fd
		_ uint32    // pad
		_ [4]uint64 // file1_offset, file2_offset, length, flags
	}
)

// Go mirrors of the block-mapping ioctls' arguments (linux/fiemap.h,
// linux/fsmap.h), without their flexible arrays.
type (
	fiemap struct {
		_ [2]uint64 // fm_start, fm_length
		_ [4]uint32 // fm_flags, fm_mapped_extents, fm_extent_count, fm_reserved
	}
	fsmap struct {
		_ [2]uint32 // fmr_device, fmr_flags
		_ [7]uint64 // fmr_physical, fmr_owner, fmr_offset, fmr_length, fmr_reserved[3]
	}
	fsmapHead struct {
		_ [4]uint32 // fmh_iflags, fmh_oflags, fmh_count, fmh_entries
		_ [6]uint64 // fmh_reserved
		_ [2]fsmap  // fmh_keys
	}
)

func TestXFSIoctlSizes(t *testing.T) {
	tests := []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(struct xfs_bstat)", unsafe.Sizeof(xfsBstat{}), sizeofXFSBstat},
		{"offsetof(struct xfs_swapext, sx_stat)", unsafe.Offsetof(xfsSwapext{}.stat), 56},
		{"sizeof(struct xfs_swapext)", unsafe.Sizeof(xfsSwapext{}), sizeofXFSSwapext},
		{"sizeof(struct xfs_exchange_range)", unsafe.Sizeof(xfsExchangeRange{}), sizeofXFSExchangeRange},
		{"sizeof(struct fiemap)", unsafe.Sizeof(fiemap{}), sizeofFiemap},
		{"sizeof(struct fsmap_head)", unsafe.Sizeof(fsmapHead{}), sizeofFsmapHead},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %d, want %d", tt.name, tt.got, tt.want)
		}
	}
}
