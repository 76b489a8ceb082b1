//go:build linux

package swap

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds the system calls golang.org/x/sys/unix has no wrapper
// for, each retried on EINTR.

// swapon(2) with no flags: the default priority, no discard.
func swapon(path string) error { return pathCall(unix.SYS_SWAPON, path, 0) }

// swapoff(2).
func swapoff(path string) error { return pathCall(unix.SYS_SWAPOFF, path, 0) }

func pathCall(trap uintptr, path string, flags uintptr) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	for {
		_, _, e := unix.Syscall(trap, uintptr(unsafe.Pointer(p)), flags, 0)
		switch e {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return e
	}
}
