package sandboxfs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// allowedFS are the file systems whose files and directories the API may
// read and write: the ones that hold data, as opposed to kernel interfaces.
// Anything else is refused. virtiofs reports the FUSE magic; ext2, ext3 and
// ext4 share one. devtmpfs reports the tmpfs magic, which is harmless
// because device nodes are refused by type.
var allowedFS = map[uint32]string{
	unix.OVERLAYFS_SUPER_MAGIC: "overlayfs",
	unix.TMPFS_MAGIC:           "tmpfs",
	unix.EXT4_SUPER_MAGIC:      "ext4",
	unix.XFS_SUPER_MAGIC:       "xfs",
	unix.BTRFS_SUPER_MAGIC:     "btrfs",
	unix.EROFS_SUPER_MAGIC_V1:  "erofs",
	unix.SQUASHFS_MAGIC:        "squashfs",
	unix.FUSE_SUPER_MAGIC:      "fuse",
	unix.V9FS_MAGIC:            "9p",
}

// refusedFS names the refused file systems a user is likely to meet, for
// messages.
var refusedFS = map[uint32]string{
	unix.PROC_SUPER_MAGIC:     "procfs",
	unix.SYSFS_MAGIC:          "sysfs",
	unix.DEVPTS_SUPER_MAGIC:   "devpts",
	unix.CGROUP_SUPER_MAGIC:   "cgroup",
	unix.CGROUP2_SUPER_MAGIC:  "cgroup2",
	unix.DEBUGFS_MAGIC:        "debugfs",
	unix.TRACEFS_MAGIC:        "tracefs",
	unix.SECURITYFS_MAGIC:     "securityfs",
	unix.BPF_FS_MAGIC:         "bpf",
	0x62656570:                "configfs",
	0x19800202:                "mqueue",
	unix.HUGETLBFS_MAGIC:      "hugetlbfs",
	unix.BINFMTFS_MAGIC:       "binfmt_misc",
	unix.PSTOREFS_MAGIC:       "pstore",
	unix.EFIVARFS_MAGIC:       "efivarfs",
	unix.SELINUX_MAGIC:        "selinuxfs",
	unix.SMACK_MAGIC:          "smackfs",
	unix.NSFS_MAGIC:           "nsfs",
	unix.AUTOFS_SUPER_MAGIC:   "autofs",
	unix.RAMFS_MAGIC:          "ramfs",
	unix.NFS_SUPER_MAGIC:      "nfs",
	unix.RDTGROUP_SUPER_MAGIC: "resctrl",
}

// fsName names the file system with magic m.
func fsName(m uint32) string {
	if n, ok := allowedFS[m]; ok {
		return n
	}
	if n, ok := refusedFS[m]; ok {
		return n
	}
	return fmt.Sprintf("a file system of type %#x", m)
}

// fsAllowed reports whether the file system with statfs magic m may be read
// and written through this package, and names it.
func fsAllowed(m uint32) (name string, ok bool) {
	_, ok = allowedFS[m]
	return fsName(m), ok
}

// fsMagic returns the statfs magic of the file system fd is on. Statfs_t.Type
// is signed on some architectures; the conversion keeps the 32 bits of the
// magic either way.
func fsMagic(fd int) (uint32, error) {
	var st unix.Statfs_t
	if err := ignoringEINTR(func() error { return unix.Fstatfs(fd, &st) }); err != nil {
		return 0, err
	}
	return uint32(st.Type), nil
}
