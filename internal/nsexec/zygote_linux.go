//go:build linux && cgo

package nsexec

// #include "nsexec_linux.h"
import "C"

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// The zygote protocol; the numbers come from nsexec_linux.h.
const (
	zygoteSockFD     = C.DSEC_ZYGOTE_SOCK_FD
	zygoteHeader     = C.DSEC_ZYGOTE_HEADER
	zygoteChunk      = C.DSEC_ZYGOTE_CHUNK
	zygoteMagicFirst = C.DSEC_ZYGOTE_MAGIC_FIRST
	zygoteMagicNext  = C.DSEC_ZYGOTE_MAGIC_NEXT
	zygoteMagicReady = C.DSEC_ZYGOTE_MAGIC_READY
)

// The C side bounds configs by the same number (a compile error if not).
const _ = uint(MaxConfigSize-C.DSEC_MAX_CONFIG) + uint(C.DSEC_MAX_CONFIG-MaxConfigSize)

const (
	// zygoteSndBuf is the send buffer asked for: the kernel refuses a
	// SEQPACKET message larger than the buffer, and the largest message is
	// a chunk and its header.
	zygoteSndBuf = 4 * zygoteChunk
	// zygoteSendTimeout bounds one request's send: a zygote that takes no
	// request for that long (stopped, wedged) is useless.
	zygoteSendTimeout = 10 * time.Second
	// zygoteStartTimeout bounds the wait for a new zygote's ready message.
	zygoteStartTimeout = 10 * time.Second
	// zygoteHupWait is how long Spawn waits, after a request's status
	// descriptor closed without a word, to see whether the zygote died:
	// its socket and the descriptors it held close in the same exit.
	zygoteHupWait = 100 * time.Millisecond
)

// Zygote is a running exec zygote: the binary with ModeEnv=zygote, a fork
// server that starts commands in sandboxes like Spawn does, but without an
// execve of the binary per command. It is the caller's child: the caller
// reaps Pid() (the zygote reaps its own workers). Its methods are safe for
// concurrent use.
type Zygote struct {
	pid  int
	conn *net.UnixConn // the keeper's end of the socketpair

	stop chan struct{} // closed by Close: releases the thread that started the zygote
	done chan struct{} // closed when that thread's goroutine has returned

	closeOnce sync.Once

	sendMu sync.Mutex // serialises requests, which may take several messages
	// guarded by sendMu
	null   *os.File // /dev/null, for stdio left nil; nil once closed
	broken error    // why the zygote cannot take requests; nil while it can
	// The socket is closed when broken is set (conn is safe to use
	// without the lock: a use after Close fails with net.ErrClosed).
}

// StartZygote starts the binary self (normally os.Executable() of a binary
// importing this package) as an exec zygote and returns once it is ready
// to serve. The zygote dies with the caller (PR_SET_PDEATHSIG), and exits
// when Close closes its socket. A zygote that does not become ready is
// killed, and left for the caller's wait4(-1) to reap.
//
// The zygote's parent-death signal fires when the thread that started it
// ends, so StartZygote starts it from a goroutine locked to its thread,
// which stays parked until Close.
func StartZygote(self string) (*Zygote, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("exec zygote: socketpair: %w", err)
	}
	ours, theirs := fds[0], fds[1]
	// Only the zygote may hold its end once it runs: we would not see it
	// die otherwise. Closed at once after the fork, or here on failure.
	theirsOpen := true
	defer func() {
		if theirsOpen {
			syscall.Close(theirs)
		}
	}()
	f := os.NewFile(uintptr(ours), "dsec-zygote")
	defer f.Close()
	if err := setSndBuf(ours, zygoteSndBuf); err != nil {
		return nil, err
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("exec zygote: socket: %w", err)
	}
	conn, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("exec zygote: socket is a %T, want a unix socket", c)
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("exec zygote: open %s: %w", os.DevNull, err)
	}
	// The zygote's stderr is ours, for the words of a zygote that fails;
	// /dev/null when we have none.
	stderr := null.Fd()
	if _, err := unix.FcntlInt(uintptr(syscall.Stderr), unix.F_GETFD, 0); err == nil {
		stderr = uintptr(syscall.Stderr)
	}

	z := &Zygote{conn: conn, null: null, stop: make(chan struct{}), done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		defer close(z.done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		// syscall.ForkExec, not os/exec: the caller reaps every child itself.
		pid, err := syscall.ForkExec(self, []string{"dsec-zygote"}, &syscall.ProcAttr{
			Env:   []string{ModeEnv + "=zygote"},
			Files: []uintptr{null.Fd(), null.Fd(), stderr, uintptr(theirs)},
			Sys:   &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
		})
		z.pid = pid
		started <- err
		if err != nil {
			return
		}
		<-z.stop
	}()
	err = <-started
	syscall.Close(theirs)
	theirsOpen = false
	if err != nil {
		<-z.done
		conn.Close()
		null.Close()
		return nil, fmt.Errorf("exec zygote: start %s: %w", self, err)
	}
	runtime.KeepAlive(null)
	if err := z.awaitReady(); err != nil {
		_ = syscall.Kill(z.pid, syscall.SIGKILL)
		z.Close()
		return nil, fmt.Errorf("exec zygote: %s (pid %d) did not start as a zygote: %w", self, z.pid, err)
	}
	return z, nil
}

// awaitReady reads the zygote's ready message.
func (z *Zygote) awaitReady() error {
	if err := z.conn.SetReadDeadline(time.Now().Add(zygoteStartTimeout)); err != nil {
		return err
	}
	var b [8]byte
	n, err := z.conn.Read(b[:])
	switch {
	case err == io.EOF || n == 0 && err == nil:
		return errors.New("it exited")
	case err != nil:
		return err
	case n != 4 || binary.LittleEndian.Uint32(b[:]) != zygoteMagicReady:
		return fmt.Errorf("it said %q, want its ready message", b[:n])
	}
	return nil
}

// setSndBuf makes fd's send buffer hold at least size bytes, forcing it
// past net.core.wmem_max when that is too small (which needs
// CAP_NET_ADMIN).
func setSndBuf(fd, size int) error {
	// The kernel doubles what it is asked for, capped at wmem_max.
	_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, size)
	if got, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF); err == nil && got >= size {
		return nil
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, size); err != nil {
		return fmt.Errorf("exec zygote: socket send buffer of %d bytes (raise net.core.wmem_max): %w", size, err)
	}
	return nil
}

// Pid returns the zygote's pid, for the caller to reap.
func (z *Zygote) Pid() int { return z.pid }

// Close closes the zygote's socket. The zygote serves the requests already
// sent and exits; Close does not wait for that (the caller reaps Pid()).
// Spawns after Close return an Unavailable error.
func (z *Zygote) Close() error {
	var err error
	z.closeOnce.Do(func() {
		// First the socket, which ends a send blocked on a full buffer.
		// A zygote found broken had its socket closed already.
		if err = z.conn.Close(); errors.Is(err, net.ErrClosed) {
			err = nil
		}
		z.sendMu.Lock()
		if z.broken == nil {
			z.broken = errors.New("it was closed")
		}
		z.null.Close()
		z.null = nil
		z.sendMu.Unlock()
		close(z.stop)
		<-z.done
	})
	return err
}

// Spawn starts cfg's command inside the sandbox whose process is cfg.Pid,
// as the package-level Spawn does, through the zygote: stdio become the
// command's descriptors 0, 1 and 2 (nil means /dev/null), errors are of the
// same kinds (a *HelperError for a setup failure), and childPid is the
// command's host pid. A zygote that has exited (or was closed) makes Spawn
// return an Unavailable error; start a new one.
//
// Spawn returns once the command's execve has returned, like Spawn, but
// without waiting for the zygote's worker to exit, which it does just
// after: only then is childPid reparented to the nearest child subreaper
// (the caller), and until then the worker is in the sandbox's cgroups too.
// A caller that waits for childPid by pid (rather than with wait4(-1)) must
// retry ECHILD for that moment.
func (z *Zygote) Spawn(cfg ExecConfig, stdio [3]*os.File) (childPid int, err error) {
	config, err := cfg.Encode()
	if err != nil {
		return 0, err
	}
	return z.spawnEncoded(config, &cfg, stdio)
}

// spawnEncoded is Spawn with the config already encoded; cfg words errors.
func (z *Zygote) spawnEncoded(config []byte, cfg *ExecConfig, stdio [3]*os.File) (int, error) {
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("exec: status pipe: %w", err)
	}
	defer statusR.Close()
	err = z.send(config, statusW, stdio)
	// The zygote holds its own copy now (or never will).
	statusW.Close()
	if err != nil {
		return 0, err
	}
	status, err := readStatus(statusR)
	if err != nil {
		return 0, fmt.Errorf("exec: read zygote status: %w", err)
	}
	if len(status) == 0 && z.died() {
		return 0, z.unavailable()
	}
	return parseStatus(status, cfg)
}

// send sends one request: the config and the descriptors status, stdin,
// stdout and stderr.
func (z *Zygote) send(config []byte, status *os.File, stdio [3]*os.File) error {
	z.sendMu.Lock()
	defer z.sendMu.Unlock()
	if z.broken != nil {
		return z.unavailableLocked()
	}
	fds := [4]int{int(status.Fd())}
	for i, f := range stdio {
		if f == nil {
			f = z.null
		}
		// Fd puts the file in blocking mode, which the command expects.
		fds[i+1] = int(f.Fd())
		defer runtime.KeepAlive(f)
	}
	defer runtime.KeepAlive(status)

	if err := z.conn.SetWriteDeadline(time.Now().Add(zygoteSendTimeout)); err != nil {
		return z.breakLocked(err)
	}
	first := min(len(config), zygoteChunk)
	msg := make([]byte, zygoteHeader, zygoteHeader+first)
	binary.LittleEndian.PutUint32(msg, zygoteMagicFirst)
	binary.LittleEndian.PutUint32(msg[4:], uint32(len(config)))
	msg = append(msg, config[:first]...)
	if _, _, err := z.conn.WriteMsgUnix(msg, syscall.UnixRights(fds[:]...), nil); err != nil {
		return z.breakLocked(err)
	}
	for off := first; off < len(config); {
		n := min(len(config)-off, zygoteChunk)
		msg = binary.LittleEndian.AppendUint32(msg[:0], zygoteMagicNext)
		msg = binary.LittleEndian.AppendUint32(msg, uint32(off))
		msg = append(msg, config[off:off+n]...)
		if _, _, err := z.conn.WriteMsgUnix(msg, nil, nil); err != nil {
			// The zygote waits for the rest of the request: it is lost.
			return z.breakLocked(err)
		}
		off += n
	}
	return nil
}

// breakLocked records that the zygote cannot take requests because of err,
// closes the socket so that it exits, and returns the Unavailable error.
func (z *Zygote) breakLocked(err error) error {
	if z.broken == nil {
		z.broken = err
		z.conn.Close()
	}
	return z.unavailableLocked()
}

// unavailable is breakLocked for a zygote found dead.
func (z *Zygote) unavailable() error {
	z.sendMu.Lock()
	defer z.sendMu.Unlock()
	return z.breakLocked(errors.New("it exited"))
}

func (z *Zygote) unavailableLocked() error {
	return errdefs.Newf(errdefs.ErrUnavailable, "exec: the exec zygote (pid %d) is gone (%v): start a new one", z.pid, z.broken)
}

// died reports whether the zygote has closed its end of the socket, waiting
// up to zygoteHupWait for it.
func (z *Zygote) died() bool {
	rc, err := z.conn.SyscallConn()
	if err != nil {
		return true
	}
	hup := false
	cerr := rc.Control(func(fd uintptr) {
		deadline := time.Now().Add(zygoteHupWait)
		for {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			n, err := unix.Poll(p, max(0, int(time.Until(deadline).Milliseconds())))
			if err == unix.EINTR && time.Now().Before(deadline) {
				continue
			}
			hup = err == nil && n > 0 && p[0].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR) != 0
			return
		}
	})
	return cerr != nil || hup
}

// readStatus reads the status line: up to and including its newline, up
// to EOF, or maxStatus bytes. The line comes in one write (it is shorter
// than PIPE_BUF), so the first newline ends it.
func readStatus(r io.Reader) ([]byte, error) {
	buf := make([]byte, 0, 64)
	var chunk [256]byte
	for len(buf) < maxStatus {
		n, err := r.Read(chunk[:min(len(chunk), maxStatus-len(buf))])
		buf = append(buf, chunk[:n]...)
		if bytes.IndexByte(chunk[:n], '\n') >= 0 {
			return buf, nil
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}
