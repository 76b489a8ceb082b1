//go:build linux

package diskquota

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds every system call that passes a pointer to a structure
// golang.org/x/sys/unix does not define.

// fsxattr is struct fsxattr of <linux/fs.h>.
type fsxattr struct {
	xflags     uint32
	extsize    uint32
	nextents   uint32
	projid     uint32
	cowextsize uint32
	pad        [8]byte
}

const (
	fsIocFsgetxattr    = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFssetxattr    = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjinherit = 0x00000200
	ext4IocResizeFS    = 0x40086610 // _IOW('f', 16, __u64)
	sizeofFsxattr      = 28
	sizeofFsDiskQuota  = 112
	sizeofFsQuotaStatV = 160
	_                  = uint(sizeofFsxattr - unsafe.Sizeof(fsxattr{}))
	_                  = uint(unsafe.Sizeof(fsxattr{}) - sizeofFsxattr)
	_                  = uint(sizeofFsDiskQuota - unsafe.Sizeof(fsDiskQuota{}))
	_                  = uint(unsafe.Sizeof(fsDiskQuota{}) - sizeofFsDiskQuota)
	_                  = uint(sizeofFsQuotaStatV - unsafe.Sizeof(fsQuotaStatV{}))
	_                  = uint(unsafe.Sizeof(fsQuotaStatV{}) - sizeofFsQuotaStatV)
	sysQuotactlFd      = 443 // quotactl_fd(2), the same number on every architecture
	quotaTypeProject   = 2   // PRJQUOTA
	fsDquotVersion     = 1   // FS_DQUOT_VERSION
	fsQstatVersion     = 1   // FS_QSTATV_VERSION1
	fsProjQuota        = 2   // FS_PROJ_QUOTA, for d_flags
	qXGetQuota         = 'X'<<8 + 3
	qXSetQLim          = 'X'<<8 + 4
	qXGetQStatV        = 'X'<<8 + 8
	fsDqIsoft          = 1 << 0
	fsDqIhard          = 1 << 1
	fsDqBsoft          = 1 << 2
	fsDqBhard          = 1 << 3
	fsQuotaPdqAcct     = 1 << 4 // FS_QUOTA_PDQ_ACCT in fs_quota_statv.qs_flags
	fsQuotaPdqEnfd     = 1 << 5 // FS_QUOTA_PDQ_ENFD
	basicBlock         = 512    // the unit of fs_disk_quota's block fields
	quotaCmdShift      = 8
	quotaTypeMask      = 0xff
)

// fsDiskQuota is struct fs_disk_quota of <linux/dqblk_xfs.h>. Block counts
// are in 512-byte basic blocks.
type fsDiskQuota struct {
	version      int8
	flags        int8
	fieldmask    uint16
	id           uint32
	blkHardlimit uint64
	blkSoftlimit uint64
	inoHardlimit uint64
	inoSoftlimit uint64
	bcount       uint64
	icount       uint64
	itimer       int32
	btimer       int32
	iwarns       uint16
	bwarns       uint16
	itimerHi     int8
	btimerHi     int8
	rtbtimerHi   int8
	padding2     int8
	rtbHardlimit uint64
	rtbSoftlimit uint64
	rtbcount     uint64
	rtbtimer     int32
	rtbwarns     uint16
	padding3     int16
	padding4     [8]byte
}

// fsQuotaStatV is struct fs_quota_statv of <linux/dqblk_xfs.h>.
type fsQuotaStatV struct {
	version      int8
	pad1         uint8
	flags        uint16
	incoredqs    uint32
	uquota       fsQfilestatv
	gquota       fsQfilestatv
	pquota       fsQfilestatv
	btimelimit   int32
	itimelimit   int32
	rtbtimelimit int32
	bwarnlimit   uint16
	iwarnlimit   uint16
	rtbwarnlimit uint16
	pad3         uint16
	pad4         uint32
	pad2         [7]uint64
}

// fsQfilestatv is struct fs_qfilestatv.
type fsQfilestatv struct {
	ino      uint64
	nblks    uint64
	nextents uint32
	pad      uint32
}

func getFsxattr(fd int) (fsxattr, error) {
	var a fsxattr
	err := ioctl(fd, fsIocFsgetxattr, unsafe.Pointer(&a))
	return a, err
}

func setFsxattr(fd int, a *fsxattr) error {
	return ioctl(fd, fsIocFssetxattr, unsafe.Pointer(a))
}

// ext4Resize grows the mounted ext4 file system that fd is on to blocks
// file-system blocks.
func ext4Resize(fd int, blocks uint64) error {
	return ioctl(fd, ext4IocResizeFS, unsafe.Pointer(&blocks))
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

// quotactlFd runs quotactl_fd(2) on the file system that fd is on: cmd is
// a Q_X* command, applied to project quotas.
func quotactlFd(fd int, cmd int, id uint32, arg unsafe.Pointer) error {
	qcmd := uintptr(cmd<<quotaCmdShift | quotaTypeProject&quotaTypeMask)
	for {
		_, _, e := unix.Syscall6(sysQuotactlFd, uintptr(fd), qcmd, uintptr(id), uintptr(arg), 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

func getProjectQuota(fd int, id uint32) (fsDiskQuota, error) {
	var q fsDiskQuota
	err := quotactlFd(fd, qXGetQuota, id, unsafe.Pointer(&q))
	return q, err
}

func setProjectLimits(fd int, id uint32, bytes, inodes int64) error {
	q := fsDiskQuota{
		version:      fsDquotVersion,
		flags:        fsProjQuota,
		fieldmask:    fsDqBhard | fsDqBsoft | fsDqIhard | fsDqIsoft,
		id:           id,
		blkHardlimit: uint64(bytes+basicBlock-1) / basicBlock,
		inoHardlimit: uint64(inodes),
	}
	return quotactlFd(fd, qXSetQLim, id, unsafe.Pointer(&q))
}

// projectQuotaState reports whether project quotas are accounted and
// enforced on the file system that fd is on.
func projectQuotaState(fd int) (accounted, enforced bool, err error) {
	s := fsQuotaStatV{version: fsQstatVersion}
	if err := quotactlFd(fd, qXGetQStatV, 0, unsafe.Pointer(&s)); err != nil {
		return false, false, err
	}
	return s.flags&fsQuotaPdqAcct != 0, s.flags&fsQuotaPdqEnfd != 0, nil
}
