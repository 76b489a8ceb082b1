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

func TestXFSIoctlSizes(t *testing.T) {
	tests := []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(struct xfs_bstat)", unsafe.Sizeof(xfsBstat{}), sizeofXFSBstat},
		{"offsetof(struct xfs_swapext, sx_stat)", unsafe.Offsetof(xfsSwapext{}.stat), 56},
		{"sizeof(struct xfs_swapext)", unsafe.Sizeof(xfsSwapext{}), sizeofXFSSwapext},
		{"sizeof(struct xfs_exchange_range)", unsafe.Sizeof(xfsExchangeRange{}), sizeofXFSExchangeRange},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %d, want %d", tt.name, tt.got, tt.want)
		}
	}
}
