package main

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// forceExit0 makes pid's next system call exit_group(0).
func forceExit0(pid int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(pid); err != nil {
		return err
	}
	if err := unix.PtraceInterrupt(pid); err != nil {
		return err
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
		return err
	}
	// Syscall stops until one at a system call's entry (rax is -ENOSYS
	// there on amd64), whose number is then replaced.
	n := uint64(unix.ENOSYS)
	enosys := -n
	for range 64 {
		if err := unix.PtraceSyscall(pid, 0); err != nil {
			return err
		}
		if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
			return err
		}
		if ws.Exited() || ws.Signaled() {
			return unix.ESRCH
		}
		var regs unix.PtraceRegs
		if err := unix.PtraceGetRegs(pid, &regs); err != nil {
			return err
		}
		if regs.Rax != enosys {
			continue
		}
		regs.Orig_rax = unix.SYS_EXIT_GROUP
		regs.Rdi = 0
		if err := unix.PtraceSetRegs(pid, &regs); err != nil {
			return err
		}
		return unix.PtraceDetach(pid)
	}
	return unix.EAGAIN
}
