package netproxy

import (
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// fetch asks the world's source for n bytes over c and reads them.
func fetch(b *testing.B, c net.Conn, n int64) {
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], uint64(n))
	if _, err := c.Write(req[:]); err != nil {
		b.Fatal(err)
	}
	got, err := io.Copy(io.Discard, c)
	if err != nil || got != n {
		b.Fatalf("read %d bytes, %v; want %d", got, err, n)
	}
}

// BenchmarkTransfer: one large download from a host of the world, from
// inside a sandbox through the router and the proxy, against the same
// download from the host's namespace straight to the world (no veth, no
// proxy). go test -run X -bench Transfer ./internal/netproxy
func BenchmarkTransfer(b *testing.B) {
	const size = 256 << 20
	n := newTestNode(b)
	a, _ := n.attach(b, "sb-a", "allow=mirror")
	if _, err := lookup(b, a, "8.8.8.8:53", "allowed.test"); err != nil {
		b.Fatal(err)
	}
	addr := net.JoinHostPort(allowedIP, strconv.Itoa(n.source))
	dial := map[string]func() (net.Conn, error){
		"proxy":  func() (net.Conn, error) { return a.dial("tcp4", addr, time.Second) },
		"direct": func() (net.Conn, error) { return n.world.dial("tcp4", addr, time.Second) },
	}
	for _, name := range []string{"direct", "proxy"} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				c, err := dial[name]()
				if err != nil {
					b.Fatal(err)
				}
				fetch(b, c, size)
				c.Close()
			}
		})
	}
}

// BenchmarkConnect: a new connection and a 1-byte exchange, through the
// proxy (firewall redirect, SO_ORIGINAL_DST, peek, policy, dial) against
// direct.
func BenchmarkConnect(b *testing.B) {
	n := newTestNode(b)
	a, _ := n.attach(b, "sb-a", "allow=mirror")
	if _, err := lookup(b, a, "8.8.8.8:53", "allowed.test"); err != nil {
		b.Fatal(err)
	}
	addr := net.JoinHostPort(allowedIP, strconv.Itoa(n.source))
	dial := map[string]func() (net.Conn, error){
		"proxy":  func() (net.Conn, error) { return a.dial("tcp4", addr, time.Second) },
		"direct": func() (net.Conn, error) { return n.world.dial("tcp4", addr, time.Second) },
	}
	for _, name := range []string{"direct", "proxy"} {
		b.Run(name, func(b *testing.B) {
			// Under the proxy's per-sandbox rate (100/s, bursts of 200).
			p := n.proxy
			p.cfg.Rate, p.cfg.Burst = 1e9, 1<<30
			for b.Loop() {
				c, err := dial[name]()
				if err != nil {
					b.Fatal(err)
				}
				fetch(b, c, 1)
				c.Close()
			}
		})
	}
}
