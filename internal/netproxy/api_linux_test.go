package netproxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/netpolicy"
)

// TestAPIRoute: a sandbox whose policy allows dsec-api reaches Config.API
// at its gateway's API port (here an echo behind it, told the sandbox's
// ID), the name resolves to that gateway for it alone, a sandbox without
// dsec-api is refused there, and a policy update without dsec-api cuts the
// open connection.
func TestAPIRoute(t *testing.T) {
	var (
		mu    sync.Mutex
		asked []string
	)
	var n *testNode
	n = newTestNode(t, func(c *Config) {
		c.API = func(ctx context.Context, sandbox string) (net.Conn, error) {
			mu.Lock()
			asked = append(asked, sandbox)
			mu.Unlock()
			return n.world.dialer()(ctx, "tcp4", fmt.Sprintf("%s:%d", allowedIP, n.echo.port()))
		}
	})
	nsA, gwA := n.attach(t, "sb-a", "allow=dsec-api")
	nsB, gwB := n.attach(t, "sb-b", "allow=mirror")
	api := netip.AddrPortFrom(gwA, netpolicy.APIPort).String()

	for _, tt := range []struct {
		ns   sandboxNS
		gw   netip.Addr
		want bool
	}{{nsA, gwA, true}, {nsB, gwB, false}} {
		m, err := lookup(t, tt.ns, tt.gw.String()+":53", netpolicy.APIName)
		got := err == nil && len(m.Answer) == 1 && strings.HasSuffix(m.Answer[0].String(), "\t"+tt.gw.String())
		if got != tt.want {
			t.Errorf("%s from behind %s: %v, %v; want an answer %v", netpolicy.APIName, tt.gw, m, err, tt.want)
		}
	}
	c, err := nsA.dial("tcp4", api, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatalf("the API from a sandbox allowed dsec-api: %v", err)
	}
	mu.Lock()
	if len(asked) != 1 || asked[0] != "sb-a" {
		t.Errorf("API dialled for %v, want [sb-a]", asked)
	}
	mu.Unlock()
	refusedFast(t, nsB, netip.AddrPortFrom(gwB, netpolicy.APIPort).String(), []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	// Another sandbox's gateway is a node address like any other.
	refusedFast(t, nsA, netip.AddrPortFrom(gwB, netpolicy.APIPort).String(), []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))

	// An update that keeps dsec-api keeps the connection.
	if cut, err := n.SetPolicy("sb-a", n.policy(t, "allow=dsec-api,mirror")); err != nil || cut != 0 {
		t.Errorf("SetPolicy keeping dsec-api = %d cut, %v; want none", cut, err)
	}
	if err := roundTrip(c, []byte("still")); err != nil {
		t.Errorf("the API connection after an update that keeps dsec-api: %v", err)
	}
	cut, err := n.SetPolicy("sb-a", n.policy(t, "allow=mirror"))
	if err != nil || cut != 1 {
		t.Errorf("SetPolicy without dsec-api = %d cut, %v; want the API connection cut", cut, err)
	}
	if err := roundTrip(c, []byte("x")); err == nil {
		t.Error("the API connection still works after dsec-api was revoked")
	}
}

// TestCutDialInFlight: deleting a sandbox ends its dials in flight at
// once, not after DialTimeout.
func TestCutDialInFlight(t *testing.T) {
	started, ended := make(chan struct{}, 1), make(chan time.Time, 1)
	n := newTestNode(t, func(c *Config) {
		c.DialTimeout = 20 * time.Second
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			started <- struct{}{}
			<-ctx.Done()
			ended <- time.Now()
			return nil, ctx.Err()
		}
	})
	ns, gw := n.attach(t, "sb-a", "allow=mirror")
	// The name resolved through the node resolver is what allows the
	// address.
	if _, err := lookup(t, ns, gw.String()+":53", "allowed.test"); err != nil {
		t.Fatal(err)
	}
	go func() {
		c, err := ns.dial("tcp4", fmt.Sprintf("%s:%d", allowedIP, n.echo.port()), time.Second)
		if err == nil {
			c.Write([]byte("hello"))
			c.SetReadDeadline(time.Now().Add(25 * time.Second))
			c.Read(make([]byte, 1))
			c.Close()
		}
	}()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy did not dial")
	}
	t0 := time.Now()
	if err := n.Detach("sb-a"); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ended:
		if d := at.Sub(t0); d > time.Second {
			t.Errorf("the dial ended %v after the sandbox was detached, want at once", d)
		}
	case <-time.After(5 * time.Second):
		t.Error("the dial in flight outlived its sandbox by 5 s")
	}
}
