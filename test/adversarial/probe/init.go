package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// initCmd attacks the sandbox's init, pid 1, the way an agent would take
// it over to escape the policy every other process has: PTRACE_ATTACH and
// PTRACE_SEIZE, /proc/1/mem opened for writing and for reading,
// process_vm_readv of its memory, and its descriptors (/proc/1/fd/N)
// opened for writing. It reports "NAME ok" or "NAME ERRNO" for each.
func initCmd(args []string) error {
	const pid = 1
	err := unix.PtraceAttach(pid)
	if err == nil {
		_ = unix.PtraceDetach(pid)
	}
	report("ptrace_attach", err)
	err = unix.PtraceSeize(pid)
	if err == nil {
		_ = unix.PtraceDetach(pid)
	}
	report("ptrace_seize", err)
	for _, m := range []struct {
		name string
		flag int
	}{{"mem_rdwr", unix.O_RDWR}, {"mem_read", unix.O_RDONLY}} {
		fd, err := unix.Open("/proc/1/mem", m.flag|unix.O_CLOEXEC, 0)
		report(m.name, closeFD(fd, err))
	}
	buf := make([]byte, 64)
	local := []unix.Iovec{{Base: &buf[0], Len: uint64(len(buf))}}
	// An address the init's static binary maps: its ELF header.
	remote := []unix.RemoteIovec{{Base: 0x400000, Len: len(buf)}}
	_, err = unix.ProcessVMReadv(pid, local, remote, 0)
	report("process_vm_readv", err)
	for fd := 0; fd <= 4; fd++ {
		f, err := os.OpenFile("/proc/1/fd/"+strconv.Itoa(fd), os.O_WRONLY, 0)
		if err == nil {
			f.Close()
		}
		report("fd_"+strconv.Itoa(fd), unwrapPath(err))
	}
	return nil
}

// inotifyCmd makes up to N inotify instances ("inotify N") and reports how
// many it got and how the next one failed: "inotify COUNT ERRNO". With
// "hold" after N it then keeps them until killed.
func inotifyCmd(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("usage: inotify N [hold]")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 {
		return fmt.Errorf("count %q", args[0])
	}
	var fds []int
	var last error
	for len(fds) < n {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			last = err
			break
		}
		fds = append(fds, fd)
	}
	res := "ok"
	if errno, ok := last.(unix.Errno); ok {
		res = unix.ErrnoName(errno)
	}
	fmt.Printf("inotify %d %s\n", len(fds), res)
	if len(args) > 1 && args[1] == "hold" {
		os.Stdout.Sync()
		for {
			time.Sleep(time.Hour)
		}
	}
	return nil
}

// unwrapPath returns the errno inside a *os.PathError.
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
