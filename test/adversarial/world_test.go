package adversarial

import (
	"net"
	"runtime"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
)

// world is a host of the test's own beside the node: a network namespace
// held only by this process (it goes when the test process does, and its
// links with it), joined to the host's namespace by a veth pair whose
// host end has hostAddr and whose own end has addr (a /31 between them),
// so the node's egress proxy, which dials from the host's namespace,
// reaches addr. Public addresses of 11.0.0.0/8, each test its own /31:
// the policy opens public addresses only, and nothing here leaves the
// machine.
type world struct {
	ns             vnetns.NsHandle
	host           netlink.Link
	hostAddr, addr string
}

// newWorld makes a world; name (at most 13 characters) names the host's
// end of the link.
func newWorld(t *testing.T, name, hostAddr, addr string) *world {
	t.Helper()
	runtime.LockOSThread()
	orig, err := vnetns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	ns, err := vnetns.New()
	if err == nil {
		err = vnetns.Set(orig)
	}
	orig.Close()
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatalf("a namespace for the test's world: %v", err)
	}
	w := &world{ns: ns, hostAddr: hostAddr, addr: addr}
	t.Cleanup(func() { w.ns.Close() })
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name + "h", MTU: 1500}, PeerName: name + "w"}
	if err := netlink.LinkAdd(v); err != nil {
		t.Fatalf("add the world's link: %v", err)
	}
	w.host = v
	t.Cleanup(func() {
		if err := netlink.LinkDel(v); err != nil {
			t.Errorf("remove the world's link %s: %v", v.Name, err)
		}
	})
	peer, err := netlink.LinkByName(name + "w")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(peer, int(ns)); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	hostEnd, err := netlink.LinkByName(name + "h")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr(hostAddr + "/31")
	if err := netlink.AddrAdd(hostEnd, a); err != nil {
		t.Fatalf("address %s on %s: %v", hostAddr, hostEnd.Attrs().Name, err)
	}
	if err := netlink.LinkSetUp(hostEnd); err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct{ name, addr string }{{name + "w", addr + "/31"}, {"lo", ""}} {
		link, err := h.LinkByName(l.name)
		if err != nil {
			t.Fatal(err)
		}
		if l.addr != "" {
			a, _ := netlink.ParseAddr(l.addr)
			if err := h.AddrAdd(link, a); err != nil {
				t.Fatalf("address %s in the world: %v", l.addr, err)
			}
		}
		if err := h.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// do runs fn on a thread in the world's namespace: sockets fn makes stay
// there.
func (w *world) do(t *testing.T, fn func() error) {
	t.Helper()
	var err error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The thread is not unlocked: it ends with the goroutine, so
		// none is left in the world's namespace.
		runtime.LockOSThread()
		if err = vnetns.Set(w.ns); err != nil {
			return
		}
		err = fn()
	}()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
}

// listen runs fn, which makes a socket, in the world's namespace, or in
// the host's when w is nil.
func (w *world) listen(t *testing.T, fn func() error) {
	t.Helper()
	if w != nil {
		w.do(t, fn)
	} else if err := fn(); err != nil {
		t.Fatal(err)
	}
}

// udpEcho echoes datagrams on pc and counts those that arrive.
type udpEcho struct {
	pc net.PacketConn
	mu sync.Mutex
	// guarded by mu
	got int
}

// listenUDP starts a UDP echo on addr:0 in the world (in the host's
// namespace when w is nil) and returns it; it stops when t ends.
func (w *world) listenUDP(t *testing.T, addr string) *udpEcho {
	t.Helper()
	e := &udpEcho{}
	w.listen(t, func() (err error) {
		e.pc, err = net.ListenPacket("udp4", net.JoinHostPort(addr, "0"))
		return err
	})
	t.Cleanup(func() { e.pc.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := e.pc.ReadFrom(buf)
			if err != nil {
				return
			}
			e.mu.Lock()
			e.got++
			e.mu.Unlock()
			e.pc.WriteTo(buf[:n], from)
		}
	}()
	return e
}

func (e *udpEcho) addr() string { return e.pc.LocalAddr().String() }

func (e *udpEcho) received() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got
}

// tcpCounter accepts connections on ln, counts them, says "dsec-world\n"
// and closes them.
type tcpCounter struct {
	ln net.Listener
	mu sync.Mutex
	// guarded by mu
	n int
}

// listenTCP accepts connections on addr:0 in the world (the host's
// namespace when w is nil) until t ends.
func (w *world) listenTCP(t *testing.T, addr string) *tcpCounter {
	t.Helper()
	c := &tcpCounter{}
	w.listen(t, func() (err error) {
		c.ln, err = net.Listen("tcp4", net.JoinHostPort(addr, "0"))
		return err
	})
	t.Cleanup(func() { c.ln.Close() })
	go func() {
		for {
			conn, err := c.ln.Accept()
			if err != nil {
				return
			}
			c.mu.Lock()
			c.n++
			c.mu.Unlock()
			conn.Write([]byte("dsec-world\n"))
			conn.Close()
		}
	}()
	return c
}

func (c *tcpCounter) addr() string { return c.ln.Addr().String() }

func (c *tcpCounter) accepted() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
