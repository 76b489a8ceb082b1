package netproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/internal/testenv"
)

// sandboxNS is a network namespace standing for a sandbox's, held by an
// open descriptor.
type sandboxNS int

// newSandboxNS makes a namespace with lo up, closed when the test ends.
func newSandboxNS(t testing.TB) sandboxNS {
	t.Helper()
	type res struct {
		fd  int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is thrown away
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- res{-1, err}
			return
		}
		if lo, err := netlink.LinkByName("lo"); err == nil {
			netlink.LinkSetUp(lo)
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		ch <- res{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("make sandbox namespace: %v", r.err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	return sandboxNS(r.fd)
}

// do runs fn in the namespace on a thread thrown away afterwards; sockets
// fn makes stay in the namespace.
func (s sandboxNS) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(s), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// dial connects from inside the sandbox.
func (s sandboxNS) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := s.do(func() (err error) {
		c, err = net.DialTimeout(network, addr, timeout)
		return err
	})
	return c, err
}

// The world is a namespace the test makes for the hosts sandboxes reach:
// allowedIP and deniedIP on its loopback. The proxy dials into it.
const (
	allowedIP = "198.51.100.1"
	deniedIP  = "198.51.100.2"
)

func newWorld(t testing.TB) sandboxNS {
	t.Helper()
	w := newSandboxNS(t)
	if err := w.do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, ip := range []string{allowedIP, deniedIP} {
			a, _ := netlink.ParseAddr(ip + "/32")
			if err := netlink.AddrAdd(lo, a); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("world namespace: %v", err)
	}
	return w
}

// dialer dials from inside the namespace.
func (s sandboxNS) dialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := s.do(func() (err error) {
			var d net.Dialer
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// echo serves a TCP echo on allowedIP in the world's namespace.
type echo struct {
	ln    net.Listener
	conns chan struct{}
}

func newEcho(t testing.TB, w sandboxNS) *echo {
	t.Helper()
	var ln net.Listener
	if err := w.do(func() (err error) {
		ln, err = net.Listen("tcp4", allowedIP+":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e := &echo{ln: ln, conns: make(chan struct{}, 1000)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case e.conns <- struct{}{}:
			default:
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return e
}

// newSource serves "send me N bytes" on allowedIP in the world.
func newSource(t testing.TB, w sandboxNS) int {
	t.Helper()
	var ln net.Listener
	if err := w.do(func() (err error) {
		ln, err = net.Listen("tcp4", allowedIP+":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var req [8]byte
				if _, err := io.ReadFull(c, req[:]); err != nil {
					return
				}
				n := int64(binary.BigEndian.Uint64(req[:]))
				for n > 0 {
					m, err := c.Write(chunk[:min(n, int64(len(chunk)))])
					if err != nil {
						return
					}
					n -= int64(m)
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

func (e *echo) port() int { return e.ln.Addr().(*net.TCPAddr).Port }

// testNode is a node with a catalogue pointing allowed.test and
// denied.test at 127.0.0.1 and 127.0.0.2.
type testNode struct {
	*Node
	dir   string
	echo  *echo // on allowedIP
	cat   *netpolicy.Catalogue
	world sandboxNS
	// source is a port on allowedIP that sends what a connection's first
	// 8 bytes ask for (big-endian length), then closes.
	source int
}

// newTestNode makes a test node; each of with may change its proxy's
// configuration (its Dial dials the test's world).
func newTestNode(t testing.TB, with ...func(*Config)) *testNode {
	t.Helper()
	testenv.RequireRoot(t)
	world := newWorld(t)
	e := newEcho(t, world)
	src := newSource(t, world)
	conf := fmt.Sprintf(`version = 1
[services.mirror]
domains = ["allowed.test"]
ports = [%d, %d]
[hosts]
"allowed.test" = ["%s"]
"denied.test" = ["%s"]
"other.test" = ["%s"]
`, e.port(), src, allowedIP, deniedIP, allowedIP)
	cat, err := netpolicy.ParseCatalogue("test.toml", []byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pcfg := Config{Dial: world.dialer()}
	for _, w := range with {
		w(&pcfg)
	}
	n, err := OpenNode(NodeConfig{Dir: dir, Catalogue: cat, Proxy: pcfg})
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNode{Node: n, dir: dir, echo: e, cat: cat, world: world, source: src}
	t.Cleanup(func() {
		if tn.Node != nil {
			if err := tn.Destroy(); err != nil {
				t.Errorf("Destroy: %v", err)
			}
		}
		if _, err := os.Stat(dir + "/router"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("router namespace file left: %v", err)
		}
	})
	return tn
}

func (n *testNode) policy(t testing.TB, flag string) *netpolicy.Policy {
	t.Helper()
	f, err := netpolicy.ParseNetworkFlag(flag)
	if err != nil {
		t.Fatal(err)
	}
	p, err := n.Compile(f.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// attach gives a new sandbox a link under policy flag.
func (n *testNode) attach(t testing.TB, id, flag string) (sandboxNS, netip.Addr) {
	t.Helper()
	ns := newSandboxNS(t)
	l, err := n.Attach(id, int(ns), n.policy(t, flag))
	if err != nil {
		t.Fatalf("Attach(%s): %v", id, err)
	}
	return ns, l.RouterAddr
}

// lookup asks the node resolver from inside the sandbox, over UDP to
// server (any address: the firewall takes port 53 to the resolver).
func lookup(t testing.TB, ns sandboxNS, server, name string) (*dns.Msg, error) {
	t.Helper()
	c, err := ns.dial("udp4", server, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	dc := &dns.Conn{Conn: c}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if err := dc.WriteMsg(m); err != nil {
		return nil, err
	}
	return dc.ReadMsg()
}

// roundTrip writes msg and reads as many bytes back; it fails when the
// proxy refuses or cuts the connection.
func roundTrip(c net.Conn, msg []byte) error {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo returned %q, want %q", got, msg)
	}
	return nil
}

// refusedFast checks that a connection from ns to addr, sending msg, is
// refused (reset or closed without an echo) within a second.
func refusedFast(t *testing.T, ns sandboxNS, addr string, msg []byte) {
	t.Helper()
	start := time.Now()
	c, err := ns.dial("tcp4", addr, time.Second)
	if err == nil {
		err = roundTrip(c, msg)
		c.Close()
	}
	if err == nil {
		t.Errorf("connect %s sending %.20q: echoed, want refused", addr, msg)
		return
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("connect %s: refused after %v, want under 1 s (%v)", addr, d, err)
	}
}

// clientHello returns the ClientHello crypto/tls sends for serverName.
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake()
		a.Close()
	}()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(b, buf); err != nil {
		t.Fatal(err)
	}
	rest := make([]byte, int(buf[3])<<8|int(buf[4]))
	if _, err := io.ReadFull(b, rest); err != nil {
		t.Fatal(err)
	}
	b.Close()
	return append(buf, rest...)
}

// TestEnforcement runs the bypass attempts from inside two sandboxes, one
// under an allow list and one under open, against a real router
// namespace, firewall, proxy and resolver.
func TestEnforcement(t *testing.T) {
	n := newTestNode(t)
	a, aRouter := n.attach(t, "sb-a", "allow=mirror")
	o, oRouter := n.attach(t, "sb-open", "open")
	bNS, _ := n.attach(t, "sb-b", "allow=mirror")
	port := n.echo.port()
	var hostAddrs []netip.Prefix
	hp, err := hostPrefixes()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range hp {
		if p.Addr().Is4() && !p.Addr().IsLoopback() {
			hostAddrs = append(hostAddrs, p)
		}
	}
	allowed := net.JoinHostPort(allowedIP, strconv.Itoa(port))

	// A listener inside sandbox b, on its own address: no other sandbox
	// reaches it.
	bLink, _ := n.Link("sb-b")
	var bLn net.Listener
	if err := bNS.do(func() (err error) {
		bLn, err = net.Listen("tcp4", bLink.SandboxAddr.String()+":8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer bLn.Close()

	// Resolution through the node resolver, at any address's port 53.
	for _, server := range []string{aRouter.String() + ":53", "8.8.8.8:53", "192.0.2.1:53"} {
		m, err := lookup(t, a, server, "allowed.test")
		if err != nil {
			t.Fatalf("lookup allowed.test at %s: %v", server, err)
		}
		if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != allowedIP {
			t.Fatalf("lookup allowed.test at %s = %v, want %s", server, m, allowedIP)
		}
	}
	// DNS over TCP to any address too.
	tc, err := a.dial("tcp4", "192.0.2.1:53", time.Second)
	if err != nil {
		t.Fatalf("DNS over TCP: %v", err)
	}
	tq := new(dns.Msg)
	tq.SetQuestion("allowed.test.", dns.TypeA)
	tdc := &dns.Conn{Conn: tc}
	tc.SetDeadline(time.Now().Add(2 * time.Second))
	if err := tdc.WriteMsg(tq); err != nil {
		t.Fatal(err)
	}
	if m, err := tdc.ReadMsg(); err != nil || len(m.Answer) != 1 {
		t.Errorf("DNS over TCP to 192.0.2.1:53 = %v, %v; want the node resolver's answer", m, err)
	}
	tc.Close()
	if m, err := lookup(t, a, "8.8.8.8:53", "denied.test"); err != nil || m.Rcode != dns.RcodeNameError {
		t.Errorf("lookup denied.test = %v, %v; want NXDOMAIN", m, err)
	}

	// The allowed name connects and transfers.
	c, err := a.dial("tcp4", allowed, time.Second)
	if err != nil {
		t.Fatalf("connect allowed: %v", err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	go c.Write(big)
	got := make([]byte, len(big))
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("transfer through the proxy: %v", err)
	}
	// Half-close: the echo sees our end, ends its copy, and we see its.
	c.(*net.TCPConn).CloseWrite()
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("after CloseWrite: read %d, %v; want EOF", n, err)
	}
	c.Close()

	// HTTP with an allowed Host passes; TLS with the allowed SNI too.
	for _, msg := range [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: allowed.test:" + fmt.Sprint(port) + "\r\n\r\n"),
		clientHello(t, "allowed.test"),
	} {
		c, err := a.dial("tcp4", allowed, time.Second)
		if err == nil {
			err = roundTrip(c, msg)
			c.Close()
		}
		if err != nil {
			t.Errorf("allowed name %.30q: %v", msg, err)
		}
	}

	for _, sb := range []struct {
		name   string
		ns     sandboxNS
		router netip.Addr
	}{{"allow list", a, aRouter}, {"open", o, oRouter}} {
		t.Run(sb.name, func(t *testing.T) {
			ping := []byte("ping")
			// The resolved name's address on another port; an address
			// no name resolved to; the host's loopback services.
			refusedFast(t, sb.ns, allowedIP+":7420", ping)
			refusedFast(t, sb.ns, net.JoinHostPort(deniedIP, strconv.Itoa(port)), ping)
			// The node's own addresses (where its API listens).
			for _, p := range hostAddrs {
				refusedFast(t, sb.ns, netip.AddrPortFrom(p.Addr(), 7420).String(), ping)
			}
			// A denied Host, a denied SNI, on the allowed address.
			refusedFast(t, sb.ns, allowed, []byte("GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n"))
			refusedFast(t, sb.ns, allowed, clientHello(t, "denied.test"))
			refusedFast(t, sb.ns, allowed, []byte("GET / HTTP/1.1\r\nHost: other.test\r\nHost: allowed.test\r\n\r\n"))
			// Metadata, the router's own ports, another sandbox.
			refusedFast(t, sb.ns, "169.254.169.254:80", ping)
			refusedFast(t, sb.ns, sb.router.String()+":22", ping)
			refusedFast(t, sb.ns, bLink.SandboxAddr.String()+":8080", ping)
			refusedFast(t, sb.ns, bLink.RouterAddr.String()+":8080", ping)
			// UDP other than DNS goes nowhere.
			if c, err := sb.ns.dial("udp4", sb.router.String()+":123", time.Second); err == nil {
				c.SetDeadline(time.Now().Add(300 * time.Millisecond))
				c.Write(ping)
				if _, err := c.Read(make([]byte, 10)); err == nil {
					t.Errorf("UDP to the router's port 123 was answered")
				}
				c.Close()
			}
			// ICMP echo to the router (and raw IP) goes nowhere.
			if pingAnswered(t, sb.ns, sb.router) {
				t.Errorf("the router answered an ICMP echo")
			}
			// IPv6 has no route.
			if c, err := sb.ns.dial("tcp6", "[2001:db8::1]:80", 300*time.Millisecond); err == nil {
				c.Close()
				t.Errorf("IPv6 connect succeeded")
			}
		})
	}
	if _, err := a.dial("tcp4", allowed, time.Second); err != nil {
		t.Errorf("allowed after the bypass attempts: %v", err)
	}

	st, _ := n.Stats("sb-a")
	if st.Denied < 9 || len(st.Denials) < 9 || st.ConnsOut < 3 || st.BytesOut < int64(len(big)) || st.DNSDenied != 1 {
		t.Errorf("stats of sb-a = %+v, want >= 9 denials, >= 3 connections, >= 1 MiB out, 1 DNS denial", st)
	}
	found := false
	for _, d := range st.Denials {
		if d.Dest == "169.254.169.254:80/tcp" && strings.Contains(d.Reason, "link-local") {
			found = true
		}
	}
	if !found {
		t.Errorf("no denial of 169.254.169.254:80/tcp naming link-local in %+v", st.Denials)
	}
}

// TestUpdate: a new policy applies to the next connection at once, both
// ways, and cuts an established connection it no longer allows.
func TestUpdate(t *testing.T) {
	n := newTestNode(t)
	a, _ := n.attach(t, "sb-a", "allow=mirror")
	if _, err := lookup(t, a, "8.8.8.8:53", "allowed.test"); err != nil {
		t.Fatal(err)
	}
	allowed := net.JoinHostPort(allowedIP, strconv.Itoa(n.echo.port()))
	est, err := a.dial("tcp4", allowed, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer est.Close()
	if err := roundTrip(est, []byte("hello")); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	cut, err := n.SetPolicy("sb-a", n.policy(t, "deny=mirror"))
	if err != nil || cut != 1 {
		t.Fatalf("SetPolicy(deny) = %d, %v; want 1 connection cut", cut, err)
	}
	est.SetDeadline(time.Now().Add(time.Second))
	if _, err := est.Read(make([]byte, 1)); err == nil {
		t.Errorf("established connection still open after revocation")
	}
	refusedFast(t, a, allowed, []byte("x"))
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("revocation took %v, want within 100 ms", d)
	} else {
		t.Logf("revocation, cut and a refused connection: %v", d)
	}

	start = time.Now()
	if _, err := n.SetPolicy("sb-a", n.policy(t, "allow=mirror")); err != nil {
		t.Fatal(err)
	}
	c, err := a.dial("tcp4", allowed, time.Second)
	if err == nil {
		err = roundTrip(c, []byte("again"))
		c.Close()
	}
	if err != nil {
		t.Fatalf("after allowing again: %v", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("allowing again took %v, want within 100 ms", d)
	} else {
		t.Logf("allowing again and a working connection: %v", d)
	}
}

// TestRestart: a node closed and opened again (a restarted keeper) keeps
// the links, refuses every connection until the policy is restored, and
// enforces it once it is; Destroy leaves no namespace.
func TestRestart(t *testing.T) {
	n := newTestNode(t)
	a, _ := n.attach(t, "sb-a", "allow=mirror")
	allowed := net.JoinHostPort(allowedIP, strconv.Itoa(n.echo.port()))
	lookup(t, a, "8.8.8.8:53", "allowed.test")
	est, err := a.dial("tcp4", allowed, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// The old proxy's connections end cleanly, not hang.
	est.SetDeadline(time.Now().Add(time.Second))
	if _, err := est.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("connection of the closed proxy: %v, want closed at once", err)
	}
	est.Close()
	n.Node = nil

	m, err := OpenNode(NodeConfig{Dir: n.dir, Catalogue: n.cat, Proxy: Config{Dial: n.world.dialer()}})
	if err != nil {
		t.Fatal(err)
	}
	n.Node = m
	if _, ok := m.Link("sb-a"); !ok {
		t.Fatal("the reopened node lost sb-a's link")
	}
	// Not restored yet: refused.
	refusedFast(t, a, allowed, []byte("x"))
	if _, ok, err := m.Restore("sb-a", n.policy(t, "allow=mirror")); !ok || err != nil {
		t.Fatalf("Restore = %v, %v", ok, err)
	}
	lookup(t, a, "8.8.8.8:53", "allowed.test")
	c, err := a.dial("tcp4", allowed, time.Second)
	if err == nil {
		err = roundTrip(c, []byte("back"))
		c.Close()
	}
	if err != nil {
		st, _ := m.Stats("sb-a")
		t.Errorf("after restore: %v (%+v)", err, st)
	}
	refusedFast(t, a, "169.254.169.254:80", []byte("x"))
	if err := m.Detach("sb-a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Link("sb-a"); ok {
		t.Error("link left after Detach")
	}
	// The sandbox has lo only.
	a.do(func() error {
		ls, _ := netlink.LinkList()
		if len(ls) != 1 {
			t.Errorf("sandbox links after Detach = %d, want lo only", len(ls))
		}
		return nil
	})
}

// TestFlood: a sandbox opening connections beyond its rate is refused
// (and told why in its denials) while another sandbox still connects.
func TestFlood(t *testing.T) {
	n := newTestNode(t)
	a, _ := n.attach(t, "sb-a", "allow=mirror")
	b, _ := n.attach(t, "sb-b", "allow=mirror")
	for _, ns := range []sandboxNS{a, b} {
		if _, err := lookup(t, ns, "8.8.8.8:53", "allowed.test"); err != nil {
			t.Fatal(err)
		}
	}
	allowed := net.JoinHostPort(allowedIP, strconv.Itoa(n.echo.port()))
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// One thread in a's namespace opens a burst's worth and more.
	refused := 0
	if err := a.do(func() error {
		for range 300 {
			c, err := net.DialTimeout("tcp4", allowed, time.Second)
			if err != nil {
				refused++
				continue
			}
			conns = append(conns, c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if roundTrip(c, []byte("x")) != nil {
			refused++
		}
	}
	if refused < 50 {
		t.Errorf("%d of 300 connections at once refused, want the ones beyond the burst of 200", refused)
	}
	st, _ := n.Stats("sb-a")
	if !strings.Contains(fmt.Sprint(st.Denials), "new connections a second") {
		t.Errorf("denials %v do not say the rate", st.Denials)
	}
	c, err := b.dial("tcp4", allowed, time.Second)
	if err == nil {
		err = roundTrip(c, []byte("fine"))
		c.Close()
	}
	if err != nil {
		t.Errorf("the other sandbox during the flood: %v", err)
	}
}

// pingAnswered sends an ICMP echo from a raw socket in ns to dst and
// reports whether an echo reply came back within 300 ms.
func pingAnswered(t *testing.T, ns sandboxNS, dst netip.Addr) bool {
	t.Helper()
	answered := false
	if err := ns.do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		// Type 8 (echo), code 0, checksum, id, seq.
		msg := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1}
		var sum uint32
		for i := 0; i < len(msg); i += 2 {
			sum += uint32(msg[i])<<8 | uint32(msg[i+1])
		}
		sum = (sum >> 16) + (sum & 0xffff)
		sum = ^sum & 0xffff
		msg[2], msg[3] = byte(sum>>8), byte(sum)
		if err := unix.Sendto(fd, msg, 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
			return err
		}
		tv := unix.NsecToTimeval((300 * time.Millisecond).Nanoseconds())
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		buf := make([]byte, 1500)
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return nil // timed out: no reply
			}
			// The IP header, then ICMP type 0 (echo reply) with our id.
			if n >= 28 && buf[20] == 0 && buf[24] == 0x12 && buf[25] == 0x34 {
				answered = true
				return nil
			}
		}
	}); err != nil {
		t.Fatalf("ping: %v", err)
	}
	return answered
}

// TestDNSFloodMetered: one sandbox's DNS datagrams beyond the firewall's
// per-source meter (bursts of 400, then 200 a second) are dropped before
// the resolver's shared socket, even from a single source port.
func TestDNSFloodMetered(t *testing.T) {
	n := newTestNode(t)
	a, _ := n.attach(t, "sb-a", "allow=mirror")
	c, err := a.dial("udp4", "8.8.8.8:53", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion("allowed.test.", dns.TypeA)
	wire, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	replies := make(chan int, 1)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	go func() {
		got := 0
		buf := make([]byte, 1500)
		for {
			if _, err := c.Read(buf); err != nil {
				if isTimeout(err) {
					replies <- got
					return
				}
				t.Logf("read: %v", err)
				continue
			}
			got++
		}
	}()
	sent := 1000
	if s := os.Getenv("DNSFLOOD_N"); s != "" {
		sent, _ = strconv.Atoi(s)
	}
	for i := range sent {
		if _, err := c.Write(wire); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			time.Sleep(time.Millisecond)
		}
	}
	// Replies still on their way get half a second.
	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	got := <-replies
	if got >= 800 || got < 100 {
		t.Errorf("%d of %d datagrams from one source answered, want about 500 (the meter's burst and rate)", got, sent)
	}
	st, _ := n.Stats("sb-a")
	t.Logf("%d of %d answered (resolver saw %d)", got, sent, st.DNSQueries)
}
