package seccomp

// Default returns the policy of every sandbox: Docker's default profile for
// an unprivileged container, as far as it concerns calls a sandbox's
// processes could reach at all, plus the XFS extent-exchange ioctls and the
// ioctls that map files to the host disk's blocks.
//
// Namespaces: creating a user namespace needs no capability and hands out
// every capability over the namespaces made with it, so clone and unshare
// with CLONE_NEWUSER are denied always. Every other namespace flag needs
// CAP_SYS_ADMIN in the sandbox's user namespace, which the kernel checks
// itself; a keeper that drops that capability gets Docker's behaviour
// without a rule here. Deny("unshare") turns unshare off entirely.
func Default() Policy {
	return Policy{}.With(defaultRules()...)
}

// Flags and values the default rules compare arguments with.
const (
	cloneNewUser = 0x10000000 // CLONE_NEWUSER

	// Personalities Docker allows (PER_LINUX, PER_LINUX32, UNAME26 and
	// both, and the query 0xffffffff).
	perLinux        = 0x0
	perLinux32      = 0x8
	perUname26      = 0x20000
	perLinux32Uname = 0x20008
	perQuery        = 0xffffffff
)

// ioctl request numbers are built as the kernel's generic _IOC macro does
// (x86_64 and arm64 both use it): direction in bits 30-31, the argument's
// size in bits 16-29, the type in bits 8-15 and the number in bits 0-7.
const (
	xfsIOCType = 0x58 // 'X', the type of XFS's ioctls

	iocWrite = 1 // _IOC_WRITE: the caller passes data in
	iocRead  = 2 // _IOC_READ: the kernel passes data out

	iocNrShift   = 0
	iocTypeShift = 8
	iocSizeShift = 16
	iocDirShift  = 30
)

// Sizes of the XFS ioctl arguments on 64-bit architectures (xfs_fs.h),
// where int64 fields are 8-aligned and a struct's size is a multiple of 8.
const (
	// struct xfs_bstat: bs_ino 0, bs_mode 8, bs_nlink 10, bs_uid 12,
	// bs_gid 16, bs_rdev 20, bs_blksize 24, 4 bytes of padding, bs_size 32,
	// bs_atime, bs_mtime, bs_ctime 40, 56, 72 (struct xfs_bstime: a long
	// and an s32, 16 bytes), bs_blocks 88, bs_xflags 96, bs_extsize 100,
	// bs_extents 104, bs_gen 108, bs_projid_lo 112, bs_forkoff 114,
	// bs_projid_hi 116, bs_sick 118, bs_checked 120, bs_pad[2] 122,
	// bs_cowextsize 124, bs_dmevmask 128, bs_dmstate 132, bs_aextents 134.
	sizeofXFSBstat = 136
	// struct xfs_swapext: sx_version, sx_fdtarget, sx_fdtmp, sx_offset,
	// sx_length (int64 each), sx_pad[16], sx_stat (struct xfs_bstat at 56).
	sizeofXFSSwapext = 5*8 + 16 + sizeofXFSBstat
	// struct xfs_exchange_range: file1_fd (s32), pad (u32), file1_offset,
	// file2_offset, length, flags (u64 each).
	sizeofXFSExchangeRange = 4 + 4 + 4*8
)

// Sizes of the arguments of the block-mapping ioctls (linux/fiemap.h,
// linux/fsmap.h).
const (
	// struct fiemap: fm_start, fm_length (u64), fm_flags, fm_mapped_extents,
	// fm_extent_count, fm_reserved (u32), then the extents.
	sizeofFiemap = 2*8 + 4*4
	// struct fsmap: fmr_device, fmr_flags (u32), fmr_physical, fmr_owner,
	// fmr_offset, fmr_length, fmr_reserved[3] (u64).
	sizeofFsmap = 2*4 + 7*8
	// struct fsmap_head: fmh_iflags, fmh_oflags, fmh_count, fmh_entries
	// (u32), fmh_reserved[6] (u64), fmh_keys[2] (struct fsmap), then the
	// records.
	sizeofFsmapHead = 4*4 + 6*8 + 2*sizeofFsmap
)

const (
	// fsIOCFiemap is FS_IOC_FIEMAP, _IOWR('f', 11, struct fiemap).
	fsIOCFiemap = (iocRead|iocWrite)<<iocDirShift | sizeofFiemap<<iocSizeShift | 'f'<<iocTypeShift | 11<<iocNrShift
	// fsIOCGetfsmap is FS_IOC_GETFSMAP, _IOWR('X', 59, struct fsmap_head).
	fsIOCGetfsmap = (iocRead|iocWrite)<<iocDirShift | sizeofFsmapHead<<iocSizeShift | xfsIOCType<<iocTypeShift | 59<<iocNrShift
	// fibmap is FIBMAP, _IO(0x00, 1).
	fibmap = 1
)

const (
	// xfsIOCSwapext is XFS_IOC_SWAPEXT, _IOWR('X', 109, struct xfs_swapext).
	xfsIOCSwapext = (iocRead|iocWrite)<<iocDirShift | sizeofXFSSwapext<<iocSizeShift | xfsIOCType<<iocTypeShift | 109<<iocNrShift
	// xfsIOCExchangeRange is XFS_IOC_EXCHANGE_RANGE (Linux 6.10),
	// _IOW('X', 129, struct xfs_exchange_range).
	xfsIOCExchangeRange = iocWrite<<iocDirShift | sizeofXFSExchangeRange<<iocSizeShift | xfsIOCType<<iocTypeShift | 129<<iocNrShift
)

// defaultRules is the default policy, one denial per system call, each
// with its reason.
func defaultRules() []Rule {
	var rules []Rule
	deny := func(reason string, names ...string) {
		for _, n := range names {
			rules = append(rules, Rule{Syscall: n, Action: ActEPERM, Reason: reason})
		}
	}
	deny("the kernel keyring is not namespaced: keys of the host and of other sandboxes",
		"keyctl", "add_key", "request_key")
	deny("eBPF programs and maps: a large kernel attack surface",
		"bpf")
	deny("performance counters: kernel attack surface and a side channel on other processes",
		"perf_event_open")
	deny("stalls kernel copies from user memory at will, the usual way to win kernel races",
		"userfaultfd")
	deny("loads a new kernel",
		"kexec_load", "kexec_file_load")
	deny("loads and unloads kernel modules",
		"init_module", "finit_module", "delete_module")
	deny("opens any file of a file system by handle, past the mount namespace (the shocker escape)",
		"open_by_handle_at")
	deny("makes the file handles open_by_handle_at takes",
		"name_to_handle_at")
	deny("raw access to the host's I/O ports",
		"iopl", "ioperm")
	deny("changes the host's swap",
		"swapon", "swapoff")
	deny("reboots or halts the host",
		"reboot")
	deny("the clock is not namespaced: sets or slews the host's clock",
		"settimeofday", "clock_settime", "clock_adjtime", "adjtimex")
	deny("turns on process accounting host-wide",
		"acct")
	deny("kernel profiling helper that reveals paths by cookie",
		"lookup_dcookie")
	deny("virtual 8086 mode (i386 only; listed for completeness)",
		"vm86", "vm86old")
	deny("changes disk quotas of the file system",
		"quotactl", "quotactl_fd")
	deny("the new mount API: makes, moves and changes mounts as mount does",
		"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr")
	deny("changes the sandbox's mounts, reaching file system code the sandbox has no business in",
		"mount", "umount2", "pivot_root")
	deny("reads or clears the host's kernel log",
		"syslog")
	deny("obsolete: loads an a.out shared library",
		"uselib")
	deny("obsolete: statistics of any file system by device number",
		"ustat")
	deny("obsolete: file system type information",
		"sysfs")
	deny("obsolete: binary sysctl interface",
		"_sysctl")
	deny("obsolete: NFS server control",
		"nfsservctl")
	deny("io_uring: a large kernel attack surface whose operations this filter cannot see",
		"io_uring_setup", "io_uring_enter", "io_uring_register")
	return append(rules,
		Rule{
			Syscall: "clone", Action: ActEPERM,
			Arg:    ArgMatch{Index: 0, Op: OpAnyBits, Values: []uint32{cloneNewUser}},
			Reason: "a new user namespace gives every capability over the namespaces made in it, the start of most container escapes",
		},
		Rule{
			Syscall: "unshare", Action: ActEPERM,
			Arg:    ArgMatch{Index: 0, Op: OpAnyBits, Values: []uint32{cloneNewUser}},
			Reason: "a new user namespace gives every capability over the namespaces made in it, the start of most container escapes",
		},
		Rule{
			Syscall: "clone3", Action: ActENOSYS,
			Reason: "its flags are in memory the filter cannot read; ENOSYS makes C libraries fall back to clone, which is checked",
		},
		Rule{
			Syscall: "personality", Action: ActEPERM,
			Arg:    ArgMatch{Index: 0, Op: OpNotIn, Values: []uint32{perLinux, perLinux32, perUname26, perLinux32Uname, perQuery}},
			Reason: "execution domains that weaken the process (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO); only Docker's safe values pass",
		},
		Rule{
			Syscall: "ioctl", Action: ActEPERM,
			Arg: ArgMatch{Index: 1, Op: OpIn, Values: []uint32{xfsIOCSwapext, xfsIOCExchangeRange, fsIOCFiemap, fsIOCGetfsmap, fibmap}},
			Reason: "XFS_IOC_SWAPEXT and XFS_IOC_EXCHANGE_RANGE exchange extents between files: low-level file system surgery no sandboxed program needs; " +
				"FS_IOC_FIEMAP, FS_IOC_GETFSMAP and FIBMAP tell where files lie on the host's disk",
		},
	)
}
