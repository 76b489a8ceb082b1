package netproxy

import (
	"net"
	"strings"
	"testing"
	"time"
)

// BenchmarkUDP: a 1,000-byte datagram's echo, from inside a sandbox
// through the router and the relay, against the same from the world's own
// namespace (no veth, no relay); and the first datagram of a new flow.
// go test -run X -bench UDP -benchtime 1000x ./internal/netproxy
func BenchmarkUDP(b *testing.B) {
	n := newUDPNode(b)
	a, _ := n.attach(b, "sb-a", n.allowFlag())
	// Flows of closed sockets stay until idle: no bound on them here.
	// (The firewall's meter still holds a sandbox to 1,000 datagrams a
	// second after a burst of 2,000: use -benchtime 1000x.)
	n.udp.mu.Lock()
	n.udp.cfg.MaxFlows, n.udp.cfg.MaxNodeFlows, n.udp.cfg.Rate = 1<<20, 1<<20, 1e9
	n.udp.mu.Unlock()
	msg := strings.Repeat("x", 1000)
	dial := map[string]func() (net.Conn, error){
		"relay":  func() (net.Conn, error) { return a.dial("udp4", n.allowedAddr(), time.Second) },
		"direct": func() (net.Conn, error) { return n.world.dial("udp4", n.allowedAddr(), time.Second) },
	}
	for _, name := range []string{"direct", "relay"} {
		b.Run(name+"/echo", func(b *testing.B) {
			c, err := dial[name]()
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if err := firstRoundTrip(c, msg); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(msg)))
			for b.Loop() {
				if err := udpRoundTrip(c, msg, time.Second); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/new-flow", func(b *testing.B) {
			for b.Loop() {
				c, err := dial[name]()
				if err != nil {
					b.Fatal(err)
				}
				if err := udpRoundTrip(c, "x", time.Second); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}
