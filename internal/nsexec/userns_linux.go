//go:build linux && cgo

package nsexec

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// usernsTimeout bounds each step of the user namespace helper.
const usernsTimeout = 10 * time.Second

// StartFunc starts a child process (a caller that reaps every child with
// wait4(-1) starts them all itself) and returns its pid.
type StartFunc func(argv, env []string, files []uintptr, sys *syscall.SysProcAttr) (int, error)

// UserNS is a sandbox's user namespace, made by a helper process running
// as the sandbox's own host root uid, which holds it until Close.
//
// The kernel charges a user namespace's counts (inotify instances and
// watches, namespaces, and every other /proc/sys/user counter) to its
// owner in the parent namespace as well: a namespace made by the host's
// root charges root, so that one sandbox could exhaust what every other
// sandbox and the host itself may have. A namespace made by a process
// running as the sandbox's host uid charges that uid, which no other
// sandbox shares.
type UserNS struct {
	pid  int
	conn *net.UnixConn
	ns   *os.File
}

// usernsSelfFD is where the helper's binary is passed: the helper runs it
// through /proc/self/fd, so it need not be reachable by path for the
// sandbox's uid (a binary under a directory only root may enter).
const usernsSelfFD = 4

// NewUserNS makes a user namespace owned by host uid hostID, in which ids
// 0 to size-1 are host ids hostID to hostID+size-1, with limits set inside
// it. self is a binary importing this package, open; start starts it (the
// caller reaps the helper after Close; on error the helper is killed and
// left to the caller's reaping).
func NewUserNS(self *os.File, hostID, size uint32, limits []Limit, start StartFunc) (*UserNS, error) {
	if hostID == 0 || size == 0 || uint64(hostID)+uint64(size) > 1<<32-1 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "user namespace: id range %d+%d: must start above 0, have a size and fit 32 bits", hostID, size)
	}
	var req strings.Builder
	for _, l := range limits {
		if l.Name == "" || strings.Trim(l.Name, "abcdefghijklmnopqrstuvwxyz_") != "" {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "user namespace: limit name %q", l.Name)
		}
		fmt.Fprintf(&req, "%s %d\n", l.Name, l.Value)
	}
	req.WriteByte('\n')
	if req.Len() > 4096 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "user namespace: %d limits are too many", len(limits))
	}

	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("user namespace: socketpair: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "dsec-userns")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		syscall.Close(fds[1])
		return nil, fmt.Errorf("user namespace: socket: %w", err)
	}
	conn := c.(*net.UnixConn)
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		conn.Close()
		syscall.Close(fds[1])
		return nil, err
	}
	defer null.Close()
	pid, err := start([]string{fmt.Sprintf("/proc/self/fd/%d", usernsSelfFD)}, []string{ModeEnv + "=userns"},
		[]uintptr{null.Fd(), null.Fd(), null.Fd(), uintptr(fds[1]), self.Fd()},
		&syscall.SysProcAttr{Credential: &syscall.Credential{Uid: hostID, Gid: hostID, Groups: []uint32{}}})
	syscall.Close(fds[1])
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("user namespace: start %s as uid %d: %w", self.Name(), hostID, err)
	}
	u := &UserNS{pid: pid, conn: conn}
	if err := u.setup(hostID, size, req.String()); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		u.Close()
		return nil, fmt.Errorf("user namespace for host uid %d: %w", hostID, err)
	}
	return u, nil
}

func (u *UserNS) setup(hostID, size uint32, req string) error {
	r := bufio.NewReaderSize(u.conn, 1024)
	if err := u.await(r, "ready"); err != nil {
		return err
	}
	m := fmt.Sprintf("0 %d %d\n", hostID, size)
	for _, name := range []string{"uid_map", "gid_map"} {
		if err := writeProcFile(fmt.Sprintf("/proc/%d/%s", u.pid, name), m); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	if err := u.conn.SetWriteDeadline(time.Now().Add(usernsTimeout)); err != nil {
		return err
	}
	if _, err := u.conn.Write([]byte(req)); err != nil {
		return fmt.Errorf("send limits: %w", err)
	}
	if err := u.await(r, "ok"); err != nil {
		return err
	}
	ns, err := os.Open(u.Path())
	if err != nil {
		return err
	}
	u.ns = ns
	return nil
}

// writeProcFile writes s to an existing /proc file in one write.
func writeProcFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// await reads the helper's next line and checks that it is want.
func (u *UserNS) await(r *bufio.Reader, want string) error {
	if err := u.conn.SetReadDeadline(time.Now().Add(usernsTimeout)); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	line = strings.TrimSuffix(line, "\n")
	switch {
	case err != nil && line == "":
		return fmt.Errorf("the helper (pid %d) ended before it said %q: %w", u.pid, want, err)
	case line == want:
		return nil
	case strings.HasPrefix(line, "err "):
		code, rest, _ := strings.Cut(strings.TrimPrefix(line, "err "), " ")
		n, _ := strconv.Atoi(code)
		errno := syscall.Errno(n)
		if strings.HasPrefix(rest, "unshare") && (errno == syscall.EPERM || errno == syscall.ENOSPC || errno == syscall.EUSERS) {
			return errdefs.Newf(errdefs.ErrFailedPrecondition,
				"the kernel refused an unprivileged user namespace (%v): check user.max_user_namespaces and that unprivileged user namespaces are allowed (dsec doctor)", errno)
		}
		return fmt.Errorf("%s: %w", rest, errno)
	}
	return fmt.Errorf("the helper said %.80q, want %q", line, want)
}

// Pid is the helper's pid, for the caller to reap once it has ended.
func (u *UserNS) Pid() int { return u.pid }

// Path names the namespace while the helper holds it (for an OCI runtime
// to join).
func (u *UserNS) Path() string { return fmt.Sprintf("/proc/%d/ns/user", u.pid) }

// File is the namespace, open (for idmapped mounts); valid until Close.
func (u *UserNS) File() *os.File { return u.ns }

// Close lets the helper exit and closes the namespace file; the
// namespace lives on while processes are in it.
func (u *UserNS) Close() error {
	var errs []error
	if u.ns != nil {
		errs = append(errs, u.ns.Close())
	}
	errs = append(errs, u.conn.Close())
	return errors.Join(errs...)
}
