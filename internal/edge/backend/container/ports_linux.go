package container

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/sandbox"
)

var _ sandbox.PortDialer = (*Backend)(nil)

// DialPort implements sandbox.PortDialer: it connects to 127.0.0.1:port
// (then [::1]:port) inside the sandbox's network namespace, from a socket
// made in that namespace by a thread of this process that entered it and
// is never given back to Go's scheduler. The namespace is the one the
// sandbox's init was started in, checked against the keeper's record, so
// neither a reused pid nor an init moved elsewhere can point the
// connection at another namespace.
func (b *Backend) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "port %d is out of range: use 1-65535", port)
	}
	info, err := b.keeper.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	ns, err := openNetNS(id, info)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	return dialInNS(ctx, ns, id, port)
}

// openNetNS opens the network namespace of the sandbox's init, as recorded
// in info, and checks that it is that namespace: the pid must still name
// the init (its start time), and the opened namespace must be the one the
// keeper recorded when the init started (device and inode of its nsfs
// file). The descriptor pins the namespace for what follows.
func openNetNS(id string, info keeper.SandboxInfo) (*os.File, error) {
	if info.State != keeper.StateRunning || info.Pid <= 0 {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s: its ports can no longer be reached", id, info.State)
	}
	want, ok := info.NS["net"]
	if !ok {
		// Every keeper that records namespaces records net; a record
		// without one cannot be checked, so it is not trusted.
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s has no recorded network namespace: recreate it to reach its ports", id)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(info.Pid) + "/ns/net")
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s: its init has ended", id)
	}
	st, err := keeper.ProcStartTime(info.Pid)
	if err != nil || st != info.StartTime {
		f.Close()
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s: its init has ended", id)
	}
	var fst unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &fst); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox %s: stat its network namespace: %w", id, err)
	}
	if fst.Dev != want.Dev || fst.Ino != want.Ino {
		f.Close()
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s: its init is no longer in the network namespace it was started in: the sandbox was tampered with; delete it", id)
	}
	return f, nil
}

// dialInNS connects to the port on the loopback of namespace ns. The
// socket is made on a locked thread that entered ns; that thread is never
// unlocked, so it ends with its goroutine instead of going back to the
// pool in the sandbox's namespace. The connect itself may wait on Go's
// poller: a socket's namespace is fixed when it is made.
func dialInNS(ctx context.Context, ns *os.File, id string, port int) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: this thread leaves with the goroutine.
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("sandbox %s: enter its network namespace: %w", id, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if isRefused(err) {
			// A server on the IPv6 loopback only.
			if c6, err6 := d.DialContext(ctx, "tcp6", net.JoinHostPort("::1", strconv.Itoa(port))); err6 == nil {
				c, err = c6, nil
			}
		}
		ch <- result{c, err}
	}()
	r := <-ch
	switch {
	case r.err == nil:
		return r.c, nil
	case isRefused(r.err):
		return nil, errdefs.Newf(errdefs.ErrUnavailable,
			"nothing listens on port %d in sandbox %s: start a server on 127.0.0.1:%d or 0.0.0.0:%d inside it", port, id, port, port)
	case ctx.Err() != nil:
		return nil, errdefs.Newf(errdefs.ErrDeadlineExceeded, "port %d of sandbox %s did not accept the connection in time: is its server busy?", port, id)
	}
	return nil, r.err
}

func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.ENETUNREACH)
}
