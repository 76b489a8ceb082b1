package main

import (
	"fmt"
	"os"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"
)

// attempts are the system calls `probe syscall` makes, by name. Each is
// made with arguments that pass the kernel's own checks only if the call
// is allowed at all, and that do no harm if it were: a refusal shows as
// EPERM (ENOSYS for clone3) from the seccomp filter or a missing
// capability; anything else (ok, ENOENT, EINVAL, EBADF) means the call got
// through to the kernel.
var attempts = map[string]func() error{
	"mount": func() error {
		dir, err := os.MkdirTemp("", "probe-mnt-")
		if err != nil {
			return err
		}
		defer os.Remove(dir)
		err = unix.Mount("none", dir, "tmpfs", 0, "")
		if err == nil {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
		return err
	},
	"umount2":       func() error { return unix.Unmount("/no-such-mount-point", 0) },
	"pivot_root":    func() error { return unix.PivotRoot("/no-such-dir", "/no-such-dir") },
	"fsopen":        func() error { return closeFD(unix.Fsopen("tmpfs", 0)) },
	"open_tree":     func() error { return closeFD(unix.OpenTree(unix.AT_FDCWD, "/no-such-dir", 0)) },
	"init_module":   func() error { return errno(unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, 0)) },
	"finit_module":  func() error { return errno(unix.Syscall(unix.SYS_FINIT_MODULE, ^uintptr(0), 0, 0)) },
	"delete_module": func() error { return unix.DeleteModule("no_such_module", 0) },
	// Unknown flags: EINVAL once the capability check has passed (no
	// segments and no flags would unload the loaded kernel).
	"kexec_load": func() error { return errno(unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0xffff0000, 0, 0)) },
	// A wrong magic number: EINVAL once the capability check has passed.
	"reboot": func() error {
		return errno(unix.Syscall6(unix.SYS_REBOOT, 1, 2, 3, 0, 0, 0))
	},
	"keyctl": func() error {
		_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 0, 0, 0)
		return err
	},
	"add_key": func() error {
		_, err := unix.AddKey("user", "probe", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
		return err
	},
	"request_key": func() error {
		_, err := unix.RequestKey("user", "probe", "", unix.KEY_SPEC_PROCESS_KEYRING)
		return err
	},
	"bpf": func() error {
		var attr [128]byte
		return errno(unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr))))
	},
	"perf_event_open": func() error {
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK}
		attr.Size = uint32(unsafe.Sizeof(attr))
		return closeFD(unix.PerfEventOpen(&attr, 0, -1, -1, 0))
	},
	"userfaultfd": func() error {
		r, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
		return closeFD(int(r), errnoOrNil(e))
	},
	"io_uring_setup": func() error {
		var params [120]byte
		r, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
		return closeFD(int(r), errnoOrNil(e))
	},
	"unshare_user": func() error { return unix.Unshare(unix.CLONE_NEWUSER) },
	"clone3": func() error {
		// A size below the smallest struct clone_args: EINVAL once allowed.
		return errno(unix.Syscall(unix.SYS_CLONE3, 0, 0, 0))
	},
	"open_by_handle_at": func() error {
		return errno(unix.Syscall(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0))
	},
	"name_to_handle_at": func() error {
		_, _, err := unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
		return err
	},
	"syslog": func() error {
		buf := make([]byte, 64)
		_, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
		return err
	},
	// The monotonic clock cannot be set: EINVAL once allowed.
	"clock_settime": func() error {
		ts := unix.Timespec{Sec: 1}
		return errno(unix.Syscall(unix.SYS_CLOCK_SETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&ts)), 0))
	},
	"settimeofday": func() error {
		return errno(unix.Syscall(unix.SYS_SETTIMEOFDAY, 0, 0, 0))
	},
	"swapon": func() error {
		p, _ := unix.BytePtrFromString("/no-such-swap")
		return errno(unix.Syscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(p)), 0, 0))
	},
	"acct": func() error {
		p, _ := unix.BytePtrFromString("/no-such-file")
		return errno(unix.Syscall(unix.SYS_ACCT, uintptr(unsafe.Pointer(p)), 0, 0))
	},
	"iopl": func() error { return errno(unix.Syscall(unix.SYS_IOPL, 3, 0, 0)) },
	"ioperm": func() error {
		return errno(unix.Syscall(unix.SYS_IOPERM, 0x80, 1, 1))
	},
	"personality_no_aslr": func() error {
		const addrNoRandomize = 0x0040000
		_, _, e := unix.Syscall(unix.SYS_PERSONALITY, addrNoRandomize, 0, 0)
		return errnoOrNil(e)
	},
	"xfs_swapext": func() error {
		const xfsIOCSwapext = 0xc0c0586d
		return errno(unix.Syscall(unix.SYS_IOCTL, 0, xfsIOCSwapext, 0))
	},
	// Where a file lies on the host's disk (finding 10 of issue 10).
	"fiemap": func() error {
		var fm [32 + 56]byte    // struct fiemap and one extent
		binaryPut32(fm[24:], 1) // fm_extent_count
		return ioctlFile("/bin/busybox", 0xc020660b, unsafe.Pointer(&fm[0]))
	},
	"getfsmap": func() error {
		var head [192 + 64]byte  // struct fsmap_head and one record
		binaryPut32(head[8:], 1) // fmh_count
		for i := 128; i < 192; i++ {
			head[i] = 0xff // fmh_keys[1]: the end of the device
		}
		return ioctlFile("/bin/busybox", 0xc0c0583b, unsafe.Pointer(&head[0]))
	},
	"fibmap": func() error {
		var block uint32
		return ioctlFile("/bin/busybox", 1, unsafe.Pointer(&block))
	},
	// A character device for host memory (/dev/mem is 1:1).
	"mknod_char": func() error {
		const path = "/tmp/probe-mem"
		err := unix.Mknod(path, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 1)))
		if err == nil {
			os.Remove(path)
		}
		return err
	},
}

// syscallCmd makes the attempts named in args, or all of them for none,
// in name order.
func syscallCmd(args []string) error {
	if len(args) == 0 {
		for n := range attempts {
			args = append(args, n)
		}
		sort.Strings(args)
	}
	for _, n := range args {
		f := attempts[n]
		if f == nil {
			return fmt.Errorf("no attempt %q", n)
		}
		report(n, f())
	}
	return nil
}

// errno turns a raw system call's result into an error.
func errno(_, _ uintptr, e unix.Errno) error { return errnoOrNil(e) }

func errnoOrNil(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// closeFD closes what a call that makes a file descriptor made.
func closeFD(fd int, err error) error {
	if err == nil && fd >= 0 {
		unix.Close(fd)
	}
	return err
}

// ioctlFile makes the ioctl req on the file at path with arg.
func ioctlFile(path string, req uintptr, arg unsafe.Pointer) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return errno(unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)))
}

func binaryPut32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
