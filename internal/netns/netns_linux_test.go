package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/testenv"
)

// hostState is what the tests must leave as they found it in the host's
// namespace.
type hostState struct {
	links     []string
	ipForward string
	rpFilter  string
}

func readHost(t *testing.T) hostState {
	t.Helper()
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var s hostState
	for _, l := range ls {
		s.links = append(s.links, l.Attrs().Name)
	}
	s.ipForward = readFile(t, "/proc/sys/net/ipv4/ip_forward")
	s.rpFilter = readFile(t, "/proc/sys/net/ipv4/conf/all/rp_filter")
	return s
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// setup returns a fresh dir for namespaces and checks, when the test ends,
// that nothing is left mounted there and that the host is as it was.
func setup(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	before := readHost(t)
	t.Cleanup(func() {
		if m := testenv.MountsUnder(t, dir); len(m) > 0 {
			t.Errorf("left mounted: %v", m)
			for _, p := range m {
				unix.Unmount(p, unix.MNT_DETACH)
			}
		}
		if diff := cmp.Diff(before, readHost(t), cmp.AllowUnexported(hostState{})); diff != "" {
			t.Errorf("host namespace changed (-before +after):\n%s", diff)
		}
	})
	return dir
}

// sandboxNS makes a network namespace standing for a sandbox's, removed
// when the test ends.
func sandboxNS(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := createNS(p); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", p, err)
		}
		os.Remove(p)
	})
	return p
}

// run runs fn in the namespace at path, on a thread thrown away after.
func run(t *testing.T, path string, fn func() error) error {
	t.Helper()
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	return inNS(ns, fn)
}

// listen opens a TCP listener in the namespace at path that accepts and
// closes connections until the test ends.
func listen(t *testing.T, path, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := run(t, path, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", path, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln
}

func dial(t *testing.T, path string, addr netip.AddrPort, timeout time.Duration) error {
	t.Helper()
	return run(t, path, func() error {
		c, err := net.DialTimeout("tcp4", addr.String(), timeout)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

func open(t *testing.T, dir string, pool netip.Prefix) *Router {
	t.Helper()
	r, err := Open(filepath.Join(dir, "run"), pool)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		r.mu.Lock()
		closed := r.closed
		r.mu.Unlock()
		if closed {
			return
		}
		if err := r.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return r
}

// handleAt is a netlink handle in the namespace at path.
func handleAt(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// sandboxLinks lists the links in the namespace at path.
func sandboxLinks(t *testing.T, path string) []string {
	t.Helper()
	h := handleAt(t, path)
	defer h.Close()
	ls, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		out = append(out, l.Attrs().Name)
	}
	return out
}

func TestAttachMany(t *testing.T) {
	dir := setup(t)
	r := open(t, dir, netip.Prefix{})
	const n = 50
	paths := make([]string, n)
	links := make([]Link, n)
	start := time.Now()
	for i := range paths {
		paths[i] = sandboxNS(t, dir, fmt.Sprintf("sb%d", i))
		l, err := r.Attach(fmt.Sprintf("sandbox-%d", i), paths[i])
		if err != nil {
			t.Fatalf("Attach(%d) = %v", i, err)
		}
		links[i] = l
	}
	attach := time.Since(start) / n

	ln := listen(t, r.path, "0.0.0.0:0")
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	seen := make(map[netip.Addr]bool)
	for i, l := range links {
		if !DefaultPool.Contains(l.RouterAddr) || !DefaultPool.Contains(l.SandboxAddr) || seen[l.RouterAddr] || seen[l.SandboxAddr] {
			t.Fatalf("link %d: addresses %v, %v: outside the pool or given twice", i, l.RouterAddr, l.SandboxAddr)
		}
		seen[l.RouterAddr], seen[l.SandboxAddr] = true, true
		if len(l.RouterName) > unix.IFNAMSIZ-1 {
			t.Errorf("link %d: name %q is longer than IFNAMSIZ allows", i, l.RouterName)
		}
		if err := dial(t, paths[i], netip.AddrPortFrom(l.RouterAddr, port), time.Second); err != nil {
			t.Errorf("sandbox %d: connect to its router address %v: %v", i, l.RouterAddr, err)
		}
	}

	// Everything else a sandbox sends goes to its router end, where the
	// node's proxy will take it.
	if err := run(t, paths[0], func() error {
		rs, err := netlink.RouteGet(net.IPv4(192, 0, 2, 1))
		if err != nil {
			return err
		}
		if len(rs) != 1 || !rs[0].Gw.Equal(links[0].RouterAddr.AsSlice()) {
			return fmt.Errorf("route to 192.0.2.1 = %v, want via %v", rs, links[0].RouterAddr)
		}
		return nil
	}); err != nil {
		t.Errorf("sandbox 0: %v", err)
	}

	// Another sandbox's address is unreachable, though it listens.
	peer := listen(t, paths[1], "0.0.0.0:0")
	to := netip.AddrPortFrom(links[1].SandboxAddr, uint16(peer.Addr().(*net.TCPAddr).Port))
	if err := dial(t, paths[1], to, time.Second); err != nil {
		t.Fatalf("sandbox 1 cannot reach its own listener: %v", err)
	}
	t0 := time.Now()
	if err := dial(t, paths[0], to, 300*time.Millisecond); err == nil {
		t.Errorf("sandbox 0 connected to sandbox 1 at %v", to)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("connecting to another sandbox took %v to fail, want under 1s", d)
	}

	// The router end is not in the sandbox's namespace: nothing there can
	// rename or delete it. Only lo and eth0 are visible.
	if got, want := sandboxLinks(t, paths[0]), []string{"lo", SandboxIfName}; !cmp.Equal(got, want) {
		t.Errorf("links in sandbox 0 = %v, want %v", got, want)
	}

	// A sandbox that takes another's address cannot send from it: the
	// router's reverse-path filter drops what does not match its link.
	// (TCP would fail anyway, as the answer goes to the other link; UDP
	// shows the datagram itself is dropped.)
	var pc net.PacketConn
	if err := run(t, r.path, func() (err error) {
		pc, err = net.ListenPacket("udp4", "0.0.0.0:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	udp := netip.AddrPortFrom(links[2].RouterAddr, uint16(pc.LocalAddr().(*net.UDPAddr).Port))
	if !sendUDP(t, paths[2], pc, udp) {
		t.Fatalf("sandbox 2's datagram from its own address did not reach the router")
	}
	spoof(t, paths[2], links[1].SandboxAddr, links[2].RouterAddr)
	if sendUDP(t, paths[2], pc, udp) {
		t.Errorf("sandbox 2, claiming sandbox 1's address, reached the router")
	}

	// Half one by one, half at once.
	start = time.Now()
	for i, l := range links[:n/2] {
		if err := r.Detach(l.ID); err != nil {
			t.Fatalf("Detach(%d) = %v", i, err)
		}
	}
	detach := time.Since(start) / (n / 2)
	start = time.Now()
	errs := make(chan error, n)
	for _, l := range links[n/2:] {
		go func() { errs <- r.Detach(l.ID) }()
	}
	for range links[n/2:] {
		if err := <-errs; err != nil {
			t.Errorf("Detach = %v", err)
		}
	}
	detachConc := time.Since(start) / (n - n/2)
	t.Logf("per sandbox: attach %v, detach %v one by one, %v each when %d run at once", attach, detach, detachConc, n-n/2)

	for i, p := range paths {
		if got, want := sandboxLinks(t, p), []string{"lo"}; !cmp.Equal(got, want) {
			t.Errorf("links in sandbox %d after Detach = %v, want %v", i, got, want)
		}
	}
	if got := routerLinks(t, r); len(got) != 0 {
		t.Errorf("router links after Detach = %v, want none", got)
	}
	if err := r.Detach(links[0].ID); err != nil {
		t.Errorf("second Detach = %v, want nil", err)
	}
}

// sendUDP sends a datagram from the namespace at path to the router's
// socket pc at to, and reports whether pc got it within 300 ms.
func sendUDP(t *testing.T, path string, pc net.PacketConn, to netip.AddrPort) bool {
	t.Helper()
	if err := run(t, path, func() error {
		c, err := net.Dial("udp4", to.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	}); err != nil {
		t.Fatalf("send from %s: %v", path, err)
	}
	pc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, _, err := pc.ReadFrom(make([]byte, 16))
	return err == nil
}

// spoof gives the namespace at path addr instead of its own, as a hostile
// sandbox with CAP_NET_ADMIN in its namespace could.
func spoof(t *testing.T, path string, addr, gw netip.Addr) {
	t.Helper()
	h := handleAt(t, path)
	defer h.Close()
	l, err := h.LinkByName(SandboxIfName)
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := h.AddrList(l, netlink.FAMILY_V4)
	for _, a := range addrs {
		h.AddrDel(l, &a)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
}

func routerLinks(t *testing.T, r *Router) []string {
	t.Helper()
	ls, err := r.h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		if n := l.Attrs().Name; n != "lo" {
			out = append(out, n)
		}
	}
	return out
}

func TestRouterSysctls(t *testing.T) {
	dir := setup(t)
	r := open(t, dir, netip.Prefix{})
	l, err := r.Attach("sb", sandboxNS(t, dir, "sb"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	if err := inNS(r.ns, func() error {
		for _, f := range []string{"ipv4/ip_forward", "ipv4/conf/all/rp_filter", "ipv6/conf/" + l.RouterName + "/disable_ipv6"} {
			b, err := os.ReadFile("/proc/sys/net/" + f)
			if err != nil {
				return err
			}
			got[f] = strings.TrimSpace(string(b))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ipv4/ip_forward": "0", "ipv4/conf/all/rp_filter": "1", "ipv6/conf/" + l.RouterName + "/disable_ipv6": "1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("router sysctls (-want +got):\n%s", diff)
	}
}

func TestReopenAfterCrash(t *testing.T) {
	dir := setup(t)
	r := open(t, dir, netip.Prefix{})
	var before []Link
	for i := range 3 {
		l, err := r.Attach(fmt.Sprintf("sb%d", i), sandboxNS(t, dir, fmt.Sprintf("sb%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, l)
	}
	// Leftovers a crash could leave: a link of ours with no alias, and
	// one whose address is not the pool's.
	junk := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: namePrefix + "junk"}, PeerName: "junkpeer"}
	if err := r.h.LinkAdd(junk); err != nil {
		t.Fatal(err)
	}
	stray, err := r.Attach("stray", sandboxNS(t, dir, "stray"))
	if err != nil {
		t.Fatal(err)
	}
	sl, _ := r.h.LinkByName(stray.RouterName)
	addrs, _ := r.h.AddrList(sl, netlink.FAMILY_V4)
	r.h.AddrDel(sl, &addrs[0])
	r.h.AddrAdd(sl, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 9, 9, 8), Mask: net.CIDRMask(31, 32)}})
	r.Close() // the keeper dies: nothing removed

	r2 := open(t, dir, netip.Prefix{})
	if diff := cmp.Diff(before, r2.Links(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("adopted links (-before +after):\n%s", diff)
	}
	if got := routerLinks(t, r2); len(got) != 3 {
		t.Errorf("router links after reopen = %v, want the 3 adopted", got)
	}
	l, err := r2.Attach("sb3", sandboxNS(t, dir, "sb3"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range before {
		if l.RouterAddr == b.RouterAddr || l.SandboxAddr == b.SandboxAddr {
			t.Errorf("new link %v reuses the addresses of %v", l, b)
		}
	}
	if _, err := r2.Attach("sb0", sandboxNS(t, dir, "again")); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Attach of an attached ID = %v, want AlreadyExists", err)
	}

	removed, err := r2.Sweep(func(id string) bool { return id != "sb1" })
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"sb1"}; !cmp.Equal(removed, want) {
		t.Errorf("Sweep removed %v, want %v", removed, want)
	}

	if err := r2.Destroy(); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := os.Stat(r2.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("router namespace file after Destroy: %v", err)
	}
	for _, p := range []string{"sb0", "sb2", "sb3"} {
		if got := sandboxLinks(t, filepath.Join(dir, p)); !cmp.Equal(got, []string{"lo"}) {
			t.Errorf("links in %s after Destroy = %v, want [lo]", p, got)
		}
	}
}

func TestNamesAndBounds(t *testing.T) {
	dir := setup(t)
	r := open(t, dir, netip.MustParsePrefix("10.200.0.0/30")) // two links

	// IDs longer than IFNAMSIZ that differ only at the end.
	long := strings.Repeat("x", MaxIDLen-1)
	a, err := r.Attach(long+"a", sandboxNS(t, dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	// A link we do not know holds the name the next ID's hash gives.
	if err := r.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: linkName(long+"b", 0)}, PeerName: "junkpeer"}); err != nil {
		t.Fatal(err)
	}
	b, err := r.Attach(long+"b", sandboxNS(t, dir, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if a.RouterName == b.RouterName || len(a.RouterName) > 15 || len(b.RouterName) > 15 || b.RouterName == linkName(long+"b", 0) {
		t.Errorf("names %q and %q: want distinct, at most 15 bytes, not the taken one", a.RouterName, b.RouterName)
	}

	cf, err := os.Open(sandboxNS(t, dir, "c"))
	if err != nil {
		t.Fatal(err)
	}
	defer cf.Close()
	_, err = r.AttachFd("c", int(cf.Fd()))
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("Attach beyond the pool = %v, want ResourceExhausted", err)
	}
	for _, tc := range []struct{ id, ns string }{
		{"", filepath.Join(dir, "c")},
		{strings.Repeat("y", MaxIDLen+1), filepath.Join(dir, "c")},
		{"host", fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())},
		{"router", r.path},
		{"file", filepath.Join(dir, "plain")},
	} {
		os.WriteFile(filepath.Join(dir, "plain"), nil, 0o600)
		if err := r.Detach(a.ID); err != nil { // make room, so only the input is wrong
			t.Fatal(err)
		}
		if _, err := r.Attach(tc.id, tc.ns); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Attach(%.20q, %s) = %v, want InvalidArgument", tc.id, tc.ns, err)
		}
	}

	// By fd: a namespace works, anything else is refused.
	if err := r.Detach(a.ID); err != nil {
		t.Fatal(err)
	}
	l, err := r.AttachFd("c", int(cf.Fd()))
	if err != nil {
		t.Fatalf("AttachFd = %v", err)
	}
	if got := sandboxLinks(t, cf.Name()); !cmp.Equal(got, []string{"lo", SandboxIfName}) {
		t.Errorf("links after AttachFd = %v, want [lo eth0]", got)
	}
	if err := r.Detach(l.ID); err != nil {
		t.Fatal(err)
	}
	pf, err := os.Open(filepath.Join(dir, "plain"))
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	for _, fd := range []int{int(pf.Fd()), -1} {
		if _, err := r.AttachFd("d", fd); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("AttachFd(%d) = %v, want InvalidArgument", fd, err)
		}
	}
}

func TestRemove(t *testing.T) {
	dir := setup(t)
	run := filepath.Join(dir, "run")
	if err := Remove(run); err != nil {
		t.Fatalf("Remove with no router = %v", err)
	}
	if _, err := os.Stat(filepath.Join(run, routerFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Remove made a router namespace: %v", err)
	}
	r := open(t, dir, netip.Prefix{})
	sb := sandboxNS(t, dir, "sb")
	if _, err := r.Attach("sb", sb); err != nil {
		t.Fatal(err)
	}
	r.Close() // as after a crash: purge finds it there
	if err := Remove(run); err != nil {
		t.Fatalf("Remove = %v", err)
	}
	if got := sandboxLinks(t, sb); !cmp.Equal(got, []string{"lo"}) {
		t.Errorf("links in the sandbox after Remove = %v, want [lo]", got)
	}
	if _, err := os.Stat(filepath.Join(run, routerFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("router namespace file after Remove: %v", err)
	}
}

// BenchmarkAttachDetach is the plumbing's cost per sandbox with network:
// one Attach and one Detach, one at a time.
func BenchmarkAttachDetach(b *testing.B) {
	testenv.RequireRoot(b)
	dir := b.TempDir()
	r, err := Open(filepath.Join(dir, "run"), netip.Prefix{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Destroy()
	p := filepath.Join(dir, "sb")
	if err := createNS(p); err != nil {
		b.Fatal(err)
	}
	defer os.Remove(p)
	defer unix.Unmount(p, unix.MNT_DETACH)
	for b.Loop() {
		if _, err := r.Attach("sb", p); err != nil {
			b.Fatal(err)
		}
		if err := r.Detach("sb"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLinkMTU: both ends of a sandbox's link have the large MTU, so a
// sandbox's TCP to the proxy moves 64 KiB segments, not 1,500-byte ones.
func TestLinkMTU(t *testing.T) {
	dir := setup(t)
	r := open(t, dir, netip.Prefix{})
	path := sandboxNS(t, dir, "sb")
	l, err := r.Attach("sandbox-mtu", path)
	if err != nil {
		t.Fatalf("Attach = %v", err)
	}
	router, err := r.h.LinkByName(l.RouterName)
	if err != nil {
		t.Fatal(err)
	}
	h := handleAt(t, path)
	defer h.Close()
	eth, err := h.LinkByName(SandboxIfName)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []netlink.Link{router, eth} {
		if got := l.Attrs().MTU; got != LinkMTU {
			t.Errorf("%s: MTU %d, want %d", l.Attrs().Name, got, LinkMTU)
		}
	}
}
