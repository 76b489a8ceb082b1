package main

import (
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
)

// ptraceCmd tries to attach to each pid in args with PTRACE_ATTACH and to
// signal it with signal 0, and reports "ptrace:PID ERRNO" and
// "kill:PID ERRNO". An attach that succeeds is detached at once.
func ptraceCmd(args []string) error {
	for _, a := range args {
		pid, err := strconv.Atoi(a)
		if err != nil {
			return fmt.Errorf("pid %q: %v", a, err)
		}
		err = unix.PtraceAttach(pid)
		if err == nil {
			_ = unix.PtraceDetach(pid)
		}
		report("ptrace:"+a, err)
		report("kill:"+a, unix.Kill(pid, 0))
	}
	return nil
}
