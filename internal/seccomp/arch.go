package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
)

// Arch is an architecture a filter is compiled for, named as GOARCH names
// it.
type Arch string

// The architectures Compile supports.
const (
	AMD64 Arch = "amd64" // x86_64
	ARM64 Arch = "arm64" // aarch64
)

// NativeArch returns the architecture this program runs on.
func NativeArch() Arch { return Arch(runtime.GOARCH) }

// archInfo is what Compile needs to know of an architecture.
type archInfo struct {
	// audit is the AUDIT_ARCH_* value of the native calling convention,
	// what seccomp_data.arch holds for native calls.
	audit uint32
	// x32 marks x86_64, where calls of the x32 ABI arrive with the native
	// audit value and bit x32SyscallBit set in the number.
	x32 bool
	// nr maps system call names to numbers.
	nr map[string]uint32
}

// x32SyscallBit is __X32_SYSCALL_BIT.
const x32SyscallBit = 0x40000000

var arches = map[Arch]archInfo{
	AMD64: {audit: 0xc000003e, x32: true, nr: amd64Syscalls}, // AUDIT_ARCH_X86_64
	ARM64: {audit: 0xc00000b7, nr: arm64Syscalls},            // AUDIT_ARCH_AARCH64
}

func lookupArch(a Arch) (archInfo, error) {
	info, ok := arches[a]
	if !ok {
		names := make([]string, 0, len(arches))
		for n := range arches {
			names = append(names, string(n))
		}
		slices.Sort(names)
		return archInfo{}, fmt.Errorf("seccomp: no system call table for architecture %q (only for %s): %w",
			a, strings.Join(names, ", "), errors.ErrUnsupported)
	}
	return info, nil
}

// otherArchOnly names system calls that exist only on architectures the
// filter denies wholesale (vm86 and vm86old are i386's), so a policy may
// name them and Compile skips them.
var otherArchOnly = map[string]bool{"vm86": true, "vm86old": true}

// knownSyscall reports whether name is a system call of any architecture
// this package knows. A name known but absent on the architecture being
// compiled (ustat on arm64) is skipped; an unknown name is an error, so a
// typo never silently allows what it meant to deny.
func knownSyscall(name string) bool {
	if otherArchOnly[name] {
		return true
	}
	for _, info := range arches {
		if _, ok := info.nr[name]; ok {
			return true
		}
	}
	return false
}

// The system call tables hold the calls the default policy names, calls a
// policy is likely to be tuned with, and a few common calls tests use. Add
// a name to both tables (where it exists) before using it in a rule. The
// numbers come from the kernel's arch/x86/entry/syscalls/syscall_64.tbl and
// include/uapi/asm-generic/unistd.h; the tests check them against
// golang.org/x/sys/unix on the machine's architecture.

var amd64Syscalls = map[string]uint32{
	"read":              0,
	"write":             1,
	"ioctl":             16,
	"getpid":            39,
	"socket":            41,
	"clone":             56,
	"fork":              57,
	"vfork":             58,
	"execve":            59,
	"wait4":             61,
	"kill":              62,
	"chdir":             80,
	"mkdir":             83,
	"ptrace":            101,
	"getuid":            102,
	"syslog":            103,
	"setgroups":         116,
	"setresuid":         117,
	"setresgid":         119,
	"mknod":             133,
	"uselib":            134,
	"personality":       135,
	"ustat":             136,
	"sysfs":             139,
	"modify_ldt":        154,
	"pivot_root":        155,
	"_sysctl":           156,
	"prctl":             157,
	"adjtimex":          159,
	"chroot":            161,
	"acct":              163,
	"settimeofday":      164,
	"mount":             165,
	"umount2":           166,
	"swapon":            167,
	"swapoff":           168,
	"reboot":            169,
	"sethostname":       170,
	"setdomainname":     171,
	"iopl":              172,
	"ioperm":            173,
	"create_module":     174,
	"init_module":       175,
	"delete_module":     176,
	"get_kernel_syms":   177,
	"query_module":      178,
	"quotactl":          179,
	"nfsservctl":        180,
	"lookup_dcookie":    212,
	"clock_settime":     227,
	"exit_group":        231,
	"kexec_load":        246,
	"add_key":           248,
	"request_key":       249,
	"keyctl":            250,
	"openat":            257,
	"mkdirat":           258,
	"mknodat":           259,
	"unshare":           272,
	"perf_event_open":   298,
	"fanotify_init":     300,
	"name_to_handle_at": 303,
	"open_by_handle_at": 304,
	"clock_adjtime":     305,
	"setns":             308,
	"process_vm_readv":  310,
	"process_vm_writev": 311,
	"kcmp":              312,
	"finit_module":      313,
	"seccomp":           317,
	"kexec_file_load":   320,
	"bpf":               321,
	"execveat":          322,
	"userfaultfd":       323,
	"io_uring_setup":    425,
	"io_uring_enter":    426,
	"io_uring_register": 427,
	"open_tree":         428,
	"move_mount":        429,
	"fsopen":            430,
	"fsconfig":          431,
	"fsmount":           432,
	"fspick":            433,
	"clone3":            435,
	"pidfd_getfd":       438,
	"mount_setattr":     442,
	"quotactl_fd":       443,
	"statmount":         457,
	"listmount":         458,
	"open_tree_attr":    467,
}

// arm64Syscalls is the asm-generic table. arm64 never had mkdir, mknod,
// fork, vfork, uselib, ustat, sysfs, _sysctl, iopl, ioperm, modify_ldt or
// the old module calls.
var arm64Syscalls = map[string]uint32{
	"lookup_dcookie":    18,
	"ioctl":             29,
	"mknodat":           33,
	"mkdirat":           34,
	"umount2":           39,
	"mount":             40,
	"pivot_root":        41,
	"nfsservctl":        42,
	"chdir":             49,
	"chroot":            51,
	"openat":            56,
	"quotactl":          60,
	"read":              63,
	"write":             64,
	"acct":              89,
	"personality":       92,
	"exit_group":        94,
	"unshare":           97,
	"kexec_load":        104,
	"init_module":       105,
	"delete_module":     106,
	"clock_settime":     112,
	"syslog":            116,
	"ptrace":            117,
	"kill":              129,
	"reboot":            142,
	"setresuid":         147,
	"setresgid":         149,
	"setgroups":         159,
	"sethostname":       161,
	"setdomainname":     162,
	"prctl":             167,
	"settimeofday":      170,
	"adjtimex":          171,
	"getpid":            172,
	"getuid":            174,
	"socket":            198,
	"add_key":           217,
	"request_key":       218,
	"keyctl":            219,
	"clone":             220,
	"execve":            221,
	"swapon":            224,
	"swapoff":           225,
	"perf_event_open":   241,
	"wait4":             260,
	"fanotify_init":     262,
	"name_to_handle_at": 264,
	"open_by_handle_at": 265,
	"clock_adjtime":     266,
	"setns":             268,
	"process_vm_readv":  270,
	"process_vm_writev": 271,
	"kcmp":              272,
	"finit_module":      273,
	"seccomp":           277,
	"bpf":               280,
	"execveat":          281,
	"userfaultfd":       282,
	"kexec_file_load":   294,
	"io_uring_setup":    425,
	"io_uring_enter":    426,
	"io_uring_register": 427,
	"open_tree":         428,
	"move_mount":        429,
	"fsopen":            430,
	"fsconfig":          431,
	"fsmount":           432,
	"fspick":            433,
	"clone3":            435,
	"pidfd_getfd":       438,
	"mount_setattr":     442,
	"quotactl_fd":       443,
	"statmount":         457,
	"listmount":         458,
	"open_tree_attr":    467,
}
