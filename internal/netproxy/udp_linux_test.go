package netproxy

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsecproject/dsec/internal/netns"
)

// Public addresses in the world namespace for UDP (a documentation range
// is always blocked, and only an operator's entry opens it, which is TCP
// only): the test reaches them through the injected dialer only.
const (
	udpAllowedIP = "11.0.0.1"
	udpDeniedIP  = "11.0.0.2"
)

// udpEcho is a UDP echo in the world, counting what arrives.
type udpEcho struct {
	pc   net.PacketConn
	mu   sync.Mutex
	got  int
	last time.Time
}

func newUDPEcho(t testing.TB, w sandboxNS, ip string) *udpEcho {
	t.Helper()
	e := &udpEcho{}
	if err := w.do(func() (err error) {
		e.pc, err = net.ListenPacket("udp4", ip+":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := e.pc.ReadFrom(buf)
			if err != nil {
				return
			}
			e.mu.Lock()
			e.got++
			e.last = time.Now()
			e.mu.Unlock()
			e.pc.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() { e.pc.Close() })
	return e
}

func (e *udpEcho) port() int { return e.pc.LocalAddr().(*net.UDPAddr).Port }

func (e *udpEcho) received() (int, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got, e.last
}

// udpNode is a test node with UDP echoes on udpAllowedIP and udpDeniedIP.
type udpNode struct {
	*testNode
	allowed, denied *udpEcho
}

func newUDPNode(t testing.TB) *udpNode {
	n := newTestNode(t)
	if err := n.world.do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, ip := range []string{udpAllowedIP, udpDeniedIP} {
			a, _ := netlink.ParseAddr(ip + "/32")
			if err := netlink.AddrAdd(lo, a); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return &udpNode{testNode: n, allowed: newUDPEcho(t, n.world, udpAllowedIP), denied: newUDPEcho(t, n.world, udpDeniedIP)}
}

func (n *udpNode) allowedAddr() string {
	return net.JoinHostPort(udpAllowedIP, strconv.Itoa(n.allowed.port()))
}

// allowFlag allows UDP to the allowed echo only.
func (n *udpNode) allowFlag() string {
	return fmt.Sprintf("allow=%s:%d/udp", udpAllowedIP, n.allowed.port())
}

// udpRoundTrip sends msg from a connected socket and reads the echo: a
// connected socket takes datagrams from its peer only, so an answer
// proves it came from the address and port it was sent to.
func udpRoundTrip(c net.Conn, msg string, wait time.Duration) error {
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, 65536)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		// An earlier datagram's late echo is skipped.
		if string(buf[:n]) == msg {
			return nil
		}
	}
}

// firstRoundTrip is udpRoundTrip tried a few times: a new link drops
// what is sent before the kernel has activated it (until its link watch
// runs, its queue discards), which a TCP client's retransmission hides and
// a UDP client retries.
func firstRoundTrip(c net.Conn, msg string) error {
	var err error
	for range 5 {
		if err = udpRoundTrip(c, msg, 300*time.Millisecond); err == nil {
			return nil
		}
	}
	return err
}

// noAnswer sends a datagram from ns to addr and checks nothing answers.
func noAnswer(t *testing.T, ns sandboxNS, addr string) {
	t.Helper()
	c, err := ns.dial("udp4", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := udpRoundTrip(c, "hello?", 200*time.Millisecond); err == nil {
		t.Errorf("UDP to %s answered, want dropped", addr)
	}
}

func hasDenial(st Stats, dest string) bool {
	for _, d := range st.Denials {
		if d.Dest == dest {
			return true
		}
	}
	return false
}

// TestUDP: UDP by a CIDR rule is relayed both ways, from the address it
// was sent to; UDP to a denied address or port, to the router, to another
// sandbox or under open goes nowhere and is recorded; a denial flood is
// counted but recorded within a rate.
func TestUDP(t *testing.T) {
	n := newUDPNode(t)
	a, aRouter := n.attach(t, "sb-a", n.allowFlag())
	wide, _ := n.attach(t, "sb-wide", "allow=0.0.0.0/0:1-65535/udp")
	o, _ := n.attach(t, "sb-open", "open")
	bNS, _ := n.attach(t, "sb-b", n.allowFlag())

	c, err := a.dial("udp4", n.allowedAddr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := firstRoundTrip(c, "ping 0"); err != nil {
		t.Fatalf("allowed UDP echo: %v", err)
	}
	for i := 1; i < 3; i++ {
		if err := udpRoundTrip(c, fmt.Sprintf("ping %d", i), time.Second); err != nil {
			t.Fatalf("allowed UDP echo #%d: %v", i, err)
		}
	}
	big := strings.Repeat("x", 8000) // fragmented on the way, whole at each end
	if err := udpRoundTrip(c, big, time.Second); err != nil {
		t.Errorf("8000-byte datagram: %v", err)
	}
	us, ok := n.UDPStats("sb-a")
	if !ok || us.Flows != 1 || us.DatagramsOut < 4 || us.DatagramsIn < 4 || us.BytesIn < int64(3*6+len(big)) {
		t.Errorf("UDP stats = %+v, %v; want one flow, 4 datagrams each way", us, ok)
	}
	if st, _ := n.Stats("sb-a"); st.BytesOut < int64(len(big)) || st.BytesIn < int64(len(big)) {
		t.Errorf("stats bytes = %d out, %d in; want the UDP bytes counted", st.BytesOut, st.BytesIn)
	}
	// DNS still goes to the resolver, not the relay.
	if _, err := lookup(t, a, "8.8.8.8:53", "allowed.test"); err != nil {
		t.Errorf("DNS with the UDP relay: %v", err)
	}

	deniedAddr := net.JoinHostPort(udpDeniedIP, strconv.Itoa(n.denied.port()))
	otherPort := net.JoinHostPort(udpAllowedIP, strconv.Itoa(n.denied.port()))
	noAnswer(t, a, deniedAddr)
	noAnswer(t, a, otherPort)
	noAnswer(t, o, n.allowedAddr()) // open allows no UDP
	st, _ := n.Stats("sb-a")
	for _, d := range []string{deniedAddr, otherPort} {
		if !hasDenial(st, d+"/udp") {
			t.Errorf("no denial for %s/udp in %v", d, st.Denials)
		}
	}
	if st, _ := n.Stats("sb-open"); !hasDenial(st, n.allowedAddr()+"/udp") {
		t.Errorf("open: no UDP denial in %v", st.Denials)
	}
	if got, _ := n.denied.received(); got != 0 {
		t.Errorf("the denied host received %d datagrams, want none", got)
	}

	// The router's own addresses and another sandbox: unreachable even
	// with a rule for every address, and the relay's port is no way in.
	bLink, _ := n.Link("sb-b")
	var bPC net.PacketConn
	if err := bNS.do(func() (err error) {
		bPC, err = net.ListenPacket("udp4", bLink.SandboxAddr.String()+":5000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer bPC.Close()
	bGot := make(chan struct{}, 10)
	go func() {
		buf := make([]byte, 1500)
		for {
			if _, _, err := bPC.ReadFrom(buf); err != nil {
				return
			}
			bGot <- struct{}{}
		}
	}()
	relayPort := strconv.Itoa(int(n.udp.port()))
	for _, ns := range []sandboxNS{a, wide} {
		for _, dst := range []string{
			bLink.SandboxAddr.String() + ":5000",
			aRouter.String() + ":5000",
			aRouter.String() + ":" + relayPort,
			"127.0.0.1:" + relayPort,
		} {
			noAnswer(t, ns, dst)
		}
	}
	select {
	case <-bGot:
		t.Errorf("sandbox b received a datagram from another sandbox")
	case <-time.After(50 * time.Millisecond):
	}
	if st, _ := n.Stats("sb-wide"); !hasDenial(st, bLink.SandboxAddr.String()+":5000/udp") || !hasDenial(st, aRouter.String()+":5000/udp") {
		t.Errorf("wide: no denials for the sandbox and the router in %v", st.Denials)
	}
	// Yet the wide rule reaches the world.
	wc, err := wide.dial("udp4", n.allowedAddr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := firstRoundTrip(wc, "wide"); err != nil {
		t.Errorf("0.0.0.0/0 UDP rule to a public address: %v", err)
	}
	wc.Close()

	// A flood of denied datagrams: every one counted, few recorded.
	before, _ := n.Stats("sb-a")
	if err := a.do(func() error {
		fc, err := net.Dial("udp4", deniedAddr)
		if err != nil {
			return err
		}
		defer fc.Close()
		for range 500 {
			fc.Write([]byte("flood"))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	after, _ := n.Stats("sb-a")
	recorded := 0
	for _, d := range after.Denials {
		if d.Dest == deniedAddr+"/udp" {
			recorded++
		}
	}
	if after.Denied-before.Denied < 400 {
		t.Errorf("denied counter rose by %d for 500 denied datagrams", after.Denied-before.Denied)
	}
	if recorded > 15 {
		t.Errorf("%d denials recorded for one flood, want the log rate-limited", recorded)
	}
}

// TestUDPRevoke: a policy update closes the flows it no longer allows at
// once: nothing more reaches the host, no reply comes back, and allowing
// again works.
func TestUDPRevoke(t *testing.T) {
	n := newUDPNode(t)
	a, _ := n.attach(t, "sb-a", n.allowFlag())
	c, err := a.dial("udp4", n.allowedAddr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := firstRoundTrip(c, "before"); err != nil {
		us, _ := n.UDPStats("sb-a")
		st, _ := n.Stats("sb-a")
		got, _ := n.allowed.received()
		t.Fatalf("%v; %+v %+v host got %d", err, us, st, got)
	}
	// Keep sending while the policy changes.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				c.Write([]byte("stream"))
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	cut, err := n.SetPolicy("sb-a", n.policy(t, "none"))
	if err != nil || cut != 1 {
		t.Errorf("SetPolicy(none) = %d, %v; want 1 flow cut", cut, err)
	}
	time.Sleep(150 * time.Millisecond)
	close(stop)
	<-done
	got, last := n.allowed.received()
	if last.After(start.Add(100 * time.Millisecond)) {
		t.Errorf("the host received datagrams %v after the revocation, want none after 100 ms", last.Sub(start))
	}
	t.Logf("%d datagrams reached the host; the last %v after the update began", got, last.Sub(start))
	// Replies already on their way are drained; a new datagram gets none.
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	for {
		if _, err := c.Read(make([]byte, 100)); err != nil {
			break
		}
	}
	if err := udpRoundTrip(c, "after", 200*time.Millisecond); err == nil {
		t.Errorf("UDP answered after revocation")
	}
	if us, _ := n.UDPStats("sb-a"); us.Flows != 0 {
		t.Errorf("flows after revocation = %d, want 0", us.Flows)
	}

	if _, err := n.SetPolicy("sb-a", n.policy(t, n.allowFlag())); err != nil {
		t.Fatal(err)
	}
	if err := udpRoundTrip(c, "again", time.Second); err != nil {
		t.Errorf("after allowing again: %v", err)
	}
	// An idle flow expires; the next datagram opens a new one.
	n.udp.mu.Lock()
	n.udp.cfg.Idle = 100 * time.Millisecond
	n.udp.mu.Unlock()
	ic, err := a.dial("udp4", n.allowedAddr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ic.Close()
	if err := udpRoundTrip(ic, "idle", time.Second); err != nil {
		t.Fatal(err)
	}
	before, _ := n.UDPStats("sb-a")
	time.Sleep(300 * time.Millisecond)
	if us, _ := n.UDPStats("sb-a"); us.Flows != before.Flows-1 {
		t.Errorf("flows %d after the idle time, want %d (the idle one expired)", us.Flows, before.Flows-1)
	}
	if err := udpRoundTrip(ic, "awake", time.Second); err != nil {
		t.Errorf("after expiry: %v", err)
	}
	if us, _ := n.UDPStats("sb-a"); us.FlowsTotal != before.FlowsTotal+1 {
		t.Errorf("flows opened %d, want %d (a new flow after expiry)", us.FlowsTotal, before.FlowsTotal+1)
	}
	// Detach closes the sandbox's flows.
	if err := n.Detach("sb-a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.UDPStats("sb-a"); ok {
		t.Errorf("UDP state kept after Detach")
	}
	if nf := n.udp.flows.Load(); nf != 0 {
		t.Errorf("node flows after Detach = %d, want 0", nf)
	}
}

// TestUDPFlood: one sandbox flooding UDP (one flow at full speed, and more
// flows than it may hold) does not stop another's allowed flow; the
// flooder is held to its rate and its flow bound.
func TestUDPFlood(t *testing.T) {
	n := newUDPNode(t)
	a, _ := n.attach(t, "sb-a", n.allowFlag())
	b, _ := n.attach(t, "sb-b", n.allowFlag())
	bc, err := b.dial("udp4", n.allowedAddr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	if err := firstRoundTrip(bc, "b"); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	flooding := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.do(func() error {
			fc, err := net.Dial("udp4", n.allowedAddr())
			if err != nil {
				flooding <- err
				return err
			}
			defer fc.Close()
			if err := firstRoundTrip(fc, "flood"); err != nil {
				flooding <- err
				return err
			}
			// More flows than a sandbox may hold: one per source port.
			for range 300 {
				c, err := net.Dial("udp4", n.allowedAddr())
				if err != nil {
					flooding <- err
					return err
				}
				defer c.Close()
				c.Write([]byte("new flow"))
			}
			flooding <- nil
			// Then one flow at full speed, from three threads.
			msg := make([]byte, 1000)
			var fw sync.WaitGroup
			for range 3 {
				fw.Add(1)
				go func() {
					defer fw.Done()
					for {
						select {
						case <-stop:
							return
						default:
							fc.Write(msg)
						}
					}
				}()
			}
			fw.Wait()
			return nil
		})
	}()
	if err := <-flooding; err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	ok := 0
	const tries = 20
	for i := range tries {
		if err := udpRoundTrip(bc, fmt.Sprintf("b %d", i), 300*time.Millisecond); err == nil {
			ok++
		} else if i == 0 || i == tries-1 {
			t.Logf("try %d: %v", i, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if ok < tries-2 {
		t.Errorf("the other sandbox's echo answered %d of %d during the flood", ok, tries)
	}
	us, _ := n.UDPStats("sb-a")
	if us.Dropped == 0 {
		t.Errorf("flooder's stats %+v: nothing dropped over its rate", us)
	}
	if us.FlowsTotal > int64(defaultUDPFlows()) {
		t.Errorf("flooder opened %d flows, want at most %d", us.FlowsTotal, defaultUDPFlows())
	}
	st, _ := n.Stats("sb-a")
	if !strings.Contains(fmt.Sprint(st.Denials), "UDP flows open") {
		t.Errorf("denials %v do not say the flow bound", st.Denials)
	}
	t.Logf("flooder %+v; other sandbox %d/%d", us, ok, tries)
}

func defaultUDPFlows() int {
	var c UDPConfig
	c.setDefaults()
	return c.MaxFlows
}

// TestUDPRestart: a node closed and opened again (a restarted keeper)
// relays nothing for a sandbox until its policy is restored, then relays
// its UDP again, on the same client socket.
func TestUDPRestart(t *testing.T) {
	n := newUDPNode(t)
	a, _ := n.attach(t, "sb-a", n.allowFlag())
	c, err := a.dial("udp4", n.allowedAddr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := firstRoundTrip(c, "before"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // late duplicates of the retries
	before, _ := n.allowed.received()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n.Node = nil
	if err := udpRoundTrip(c, "closed", 200*time.Millisecond); err == nil {
		t.Errorf("UDP answered with the node closed")
	}
	m, err := OpenNode(NodeConfig{Dir: n.dir, Catalogue: n.cat, Proxy: Config{Dial: n.world.dialer()}})
	if err != nil {
		// Nothing else would remove the namespace the first node left.
		if rerr := netns.Remove(n.dir); rerr != nil {
			t.Errorf("remove the router namespace: %v", rerr)
		}
		t.Fatal(err)
	}
	n.Node = m
	if err := udpRoundTrip(c, "unrestored", 200*time.Millisecond); err == nil {
		t.Errorf("UDP answered before the policy was restored")
	}
	if got, _ := n.allowed.received(); got != before {
		t.Errorf("the host received %d datagrams while the node was closed or unrestored, want none", got-before)
	}
	if _, ok, err := m.Restore("sb-a", n.policy(t, n.allowFlag())); !ok || err != nil {
		t.Fatalf("Restore = %v, %v", ok, err)
	}
	if err := udpRoundTrip(c, "after", time.Second); err != nil {
		t.Errorf("after restore: %v", err)
	}
}
