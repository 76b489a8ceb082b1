//go:build linux

package pageout

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// iovec is struct iovec with the base as a number: the addresses are the
// other process's, never dereferenced here.
type iovec struct{ base, len uintptr }

// processMadvise is process_madvise(2) over ranges (at most UIO_MAXIOV of
// them) of the process of pidfd: the bytes advised, and the error that
// stopped it. EINTR is retried.
func processMadvise(pidfd int, ranges []Range, advice int) (int, error) {
	iov := make([]iovec, len(ranges))
	for i, r := range ranges {
		iov[i] = iovec{uintptr(r.Start), uintptr(r.Len())}
	}
	for {
		n, _, e := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(pidfd),
			uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)), uintptr(advice), 0, 0)
		switch e {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		}
		return 0, e
	}
}
