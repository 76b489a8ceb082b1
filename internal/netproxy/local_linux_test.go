package netproxy

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// TestNodeAddressGainedLater: an address the host gains after the node
// opened (a new interface, a DHCP lease, a container bridge) is the
// node's own as much as those it had: a sandbox under open, or with a
// CIDR rule covering it, is refused, and told it is the node's, for TCP
// and UDP. Without the check at each connection the proxy dialled it and
// handed the sandbox the host's services on that address.
func TestNodeAddressGainedLater(t *testing.T) {
	n := newTestNode(t)
	a, _ := n.attach(t, "sb-a", "open,allow=11.9.9.0/24:5000/udp")
	const late = "11.9.9.9"
	// The host's new address, on a veth pair of the host's own (both
	// ends here, removed with the test).
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "dsnplate0"}, PeerName: "dsnplate1"}
	if err := netlink.LinkAdd(v); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netlink.LinkDel(v); err != nil {
			t.Errorf("remove the test's veth: %v", err)
		}
	})
	addr, _ := netlink.ParseAddr(late + "/32")
	if err := netlink.AddrAdd(v, addr); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(v); err != nil {
		t.Fatal(err)
	}
	// Something of the host's listens on it.
	ln, err := net.Listen("tcp4", late+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	tcp := ln.Addr().String()
	// Refused, however long it takes: how fast refusals are is checked
	// by the bypass tests (refusedFast), and here the host has just gained
	// a link (a first SYN lost under CI's load cost a 1 s retransmission).
	if c, err := a.dial("tcp4", tcp, 5*time.Second); err == nil {
		if roundTrip(c, []byte("hello")) == nil {
			t.Errorf("connect %s: echoed, want refused", tcp)
		}
		c.Close()
	}
	select {
	case <-accepted:
		t.Errorf("a sandbox under open reached the host's new address %s", tcp)
	case <-time.After(100 * time.Millisecond):
	}
	c, err := a.dial("udp4", late+":5000", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	udp := late + ":5000/udp"
	for i := 0; i < 10 && !hasDenial(n.statsOf(t, "sb-a"), udp); i++ {
		c.Write([]byte("hello?")) // a new link may drop the first
		time.Sleep(50 * time.Millisecond)
	}
	st := n.statsOf(t, "sb-a")
	for _, dest := range []string{tcp + "/tcp", udp} {
		found := false
		for _, d := range st.Denials {
			if d.Dest == dest && strings.Contains(d.Reason, "(node)") {
				found = true
			}
		}
		if !found {
			t.Errorf("no denial of %s naming the node in %+v", dest, st.Denials)
		}
	}
}

// statsOf returns the proxy's counters of sandbox id.
func (n *testNode) statsOf(t *testing.T, id string) Stats {
	t.Helper()
	st, ok := n.Stats(id)
	if !ok {
		t.Fatalf("no stats of %s", id)
	}
	return st
}
