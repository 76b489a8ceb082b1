package container

import (
	"context"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/testenv"
)

// nsOf returns the identity of process (or thread) pid's network namespace.
func nsOf(t *testing.T, pid int) keeper.NSID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return keeper.NSID{Dev: st.Dev, Ino: st.Ino}
}

// TestOpenNetNSChecksIdentity: the namespace is reached only when the pid
// still names the init the keeper recorded and the init is still in the
// namespace it was started in.
func TestOpenNetNSChecksIdentity(t *testing.T) {
	pid := os.Getpid()
	st, err := keeper.ProcStartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	good := keeper.SandboxInfo{ID: "s", State: keeper.StateRunning, Pid: pid, StartTime: st,
		NS: map[string]keeper.NSID{"net": nsOf(t, pid)}}
	f, err := openNetNS("s", good)
	if err != nil {
		t.Fatalf("openNetNS(the recorded init) = %v, want the namespace", err)
	}
	f.Close()

	reused := good
	reused.StartTime = st + 1 // the pid now names another process
	moved := good
	moved.NS = map[string]keeper.NSID{"net": {Dev: good.NS["net"].Dev, Ino: good.NS["net"].Ino + 1}}
	unrecorded := good
	unrecorded.NS = nil
	stopped := good
	stopped.State = keeper.StateExited
	gone := good
	gone.Pid = 1 << 22 // above pid_max's default: no such process
	for name, info := range map[string]keeper.SandboxInfo{
		"reused pid": reused, "other namespace": moved, "no record": unrecorded, "exited": stopped, "gone": gone,
	} {
		t.Run(name, func(t *testing.T) {
			f, err := openNetNS("s", info)
			if err == nil {
				f.Close()
				t.Fatalf("openNetNS(%s) = a namespace, want FailedPrecondition", name)
			}
			if !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("openNetNS(%s) = %v, want FailedPrecondition", name, err)
			}
		})
	}
}

// TestDialInNS connects into a network namespace of the test's own (a
// locked thread that unshared one, with a server on its loopback), finds
// a port nothing listens on refused at once, and leaves no thread of Go's
// pool in that namespace.
func TestDialInNS(t *testing.T) {
	testenv.RequireRoot(t)
	host := nsOf(t, os.Getpid())
	type nsServer struct {
		tid int
		ln  net.Listener
		err error
	}
	ready := make(chan nsServer, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- nsServer{err: err}
			return
		}
		if err := loopbackUp(); err != nil {
			ready <- nsServer{err: err}
			return
		}
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		ready <- nsServer{tid: unix.Gettid(), ln: ln, err: err}
		<-done
	}()
	srv := <-ready
	if srv.err != nil {
		t.Fatalf("make a network namespace: %v", srv.err)
	}
	defer srv.ln.Close()
	go func() {
		for {
			c, err := srv.ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	st, err := keeper.ProcStartTime(srv.tid)
	if err != nil {
		t.Fatal(err)
	}
	info := keeper.SandboxInfo{ID: "s", State: keeper.StateRunning, Pid: srv.tid, StartTime: st,
		NS: map[string]keeper.NSID{"net": nsOf(t, srv.tid)}}
	if info.NS["net"] == host {
		t.Fatal("the test's namespace is the host's")
	}
	port := srv.ln.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 20 {
		ns, err := openNetNS("s", info)
		if err != nil {
			t.Fatal(err)
		}
		c, err := dialInNS(ctx, ns, "s", port)
		ns.Close()
		if err != nil {
			t.Fatalf("dialInNS(port %d) = %v, want a connection", port, err)
		}
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("echo through the connection = %q, %v", buf, err)
		}
		c.Close()
	}
	// The host's namespace has no such server: the same port there is
	// another story, and inside the namespace a free port is refused fast.
	ns, err := openNetNS("s", info)
	if err != nil {
		t.Fatal(err)
	}
	free := freePortIn(t, port)
	start := time.Now()
	c, err := dialInNS(ctx, ns, "s", free)
	ns.Close()
	if err == nil {
		c.Close()
		t.Fatalf("dialInNS(port %d, nothing listens) = a connection", free)
	}
	if !errdefs.Is(err, errdefs.ErrUnavailable) || time.Since(start) > time.Second {
		t.Fatalf("dialInNS(port %d, nothing listens) = %v after %v, want Unavailable at once", free, err, time.Since(start))
	}
	// No thread that entered the namespace went back to Go's pool.
	errs := make(chan error, 64)
	for range 64 {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var st unix.Stat_t
			if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
				errs <- err
				return
			}
			if (keeper.NSID{Dev: st.Dev, Ino: st.Ino}) != host {
				errs <- errdefs.Newf(errdefs.ErrInternal, "thread %d is in the sandbox's namespace", unix.Gettid())
				return
			}
			errs <- nil
		}()
	}
	for range 64 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// freePortIn returns a port other than used (nothing listens on it in the
// test's namespace, which has only the one server).
func freePortIn(t *testing.T, used int) int {
	t.Helper()
	if used == 1 {
		return 2
	}
	return used - 1
}

// loopbackUp brings lo up in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
