//go:build linux && arm64

package seccomp

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// TestSyscallTableARM64 checks the arm64 table against
// golang.org/x/sys/unix, an independent copy of the kernel's numbers.
func TestSyscallTableARM64(t *testing.T) {
	want := map[string]uint32{
		"lookup_dcookie":    unix.SYS_LOOKUP_DCOOKIE,
		"ioctl":             unix.SYS_IOCTL,
		"mknodat":           unix.SYS_MKNODAT,
		"mkdirat":           unix.SYS_MKDIRAT,
		"umount2":           unix.SYS_UMOUNT2,
		"mount":             unix.SYS_MOUNT,
		"pivot_root":        unix.SYS_PIVOT_ROOT,
		"nfsservctl":        unix.SYS_NFSSERVCTL,
		"chdir":             unix.SYS_CHDIR,
		"chroot":            unix.SYS_CHROOT,
		"openat":            unix.SYS_OPENAT,
		"quotactl":          unix.SYS_QUOTACTL,
		"read":              unix.SYS_READ,
		"write":             unix.SYS_WRITE,
		"acct":              unix.SYS_ACCT,
		"personality":       unix.SYS_PERSONALITY,
		"exit_group":        unix.SYS_EXIT_GROUP,
		"unshare":           unix.SYS_UNSHARE,
		"kexec_load":        unix.SYS_KEXEC_LOAD,
		"init_module":       unix.SYS_INIT_MODULE,
		"delete_module":     unix.SYS_DELETE_MODULE,
		"clock_settime":     unix.SYS_CLOCK_SETTIME,
		"syslog":            unix.SYS_SYSLOG,
		"ptrace":            unix.SYS_PTRACE,
		"kill":              unix.SYS_KILL,
		"reboot":            unix.SYS_REBOOT,
		"setresuid":         unix.SYS_SETRESUID,
		"setresgid":         unix.SYS_SETRESGID,
		"setgroups":         unix.SYS_SETGROUPS,
		"sethostname":       unix.SYS_SETHOSTNAME,
		"setdomainname":     unix.SYS_SETDOMAINNAME,
		"prctl":             unix.SYS_PRCTL,
		"settimeofday":      unix.SYS_SETTIMEOFDAY,
		"adjtimex":          unix.SYS_ADJTIMEX,
		"getpid":            unix.SYS_GETPID,
		"getuid":            unix.SYS_GETUID,
		"socket":            unix.SYS_SOCKET,
		"add_key":           unix.SYS_ADD_KEY,
		"request_key":       unix.SYS_REQUEST_KEY,
		"keyctl":            unix.SYS_KEYCTL,
		"clone":             unix.SYS_CLONE,
		"execve":            unix.SYS_EXECVE,
		"swapon":            unix.SYS_SWAPON,
		"swapoff":           unix.SYS_SWAPOFF,
		"perf_event_open":   unix.SYS_PERF_EVENT_OPEN,
		"wait4":             unix.SYS_WAIT4,
		"fanotify_init":     unix.SYS_FANOTIFY_INIT,
		"name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT,
		"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT,
		"clock_adjtime":     unix.SYS_CLOCK_ADJTIME,
		"setns":             unix.SYS_SETNS,
		"process_vm_readv":  unix.SYS_PROCESS_VM_READV,
		"process_vm_writev": unix.SYS_PROCESS_VM_WRITEV,
		"kcmp":              unix.SYS_KCMP,
		"finit_module":      unix.SYS_FINIT_MODULE,
		"seccomp":           unix.SYS_SECCOMP,
		"bpf":               unix.SYS_BPF,
		"execveat":          unix.SYS_EXECVEAT,
		"userfaultfd":       unix.SYS_USERFAULTFD,
		"kexec_file_load":   unix.SYS_KEXEC_FILE_LOAD,
		"io_uring_setup":    unix.SYS_IO_URING_SETUP,
		"io_uring_enter":    unix.SYS_IO_URING_ENTER,
		"io_uring_register": unix.SYS_IO_URING_REGISTER,
		"open_tree":         unix.SYS_OPEN_TREE,
		"move_mount":        unix.SYS_MOVE_MOUNT,
		"fsopen":            unix.SYS_FSOPEN,
		"fsconfig":          unix.SYS_FSCONFIG,
		"fsmount":           unix.SYS_FSMOUNT,
		"fspick":            unix.SYS_FSPICK,
		"clone3":            unix.SYS_CLONE3,
		"pidfd_getfd":       unix.SYS_PIDFD_GETFD,
		"mount_setattr":     unix.SYS_MOUNT_SETATTR,
		"quotactl_fd":       unix.SYS_QUOTACTL_FD,
		"statmount":         unix.SYS_STATMOUNT,
		"listmount":         unix.SYS_LISTMOUNT,
		"open_tree_attr":    unix.SYS_OPEN_TREE_ATTR,
	}
	if diff := cmp.Diff(want, arm64Syscalls); diff != "" {
		t.Errorf("arm64Syscalls differs from golang.org/x/sys/unix (-want +got):\n%s", diff)
	}
}
