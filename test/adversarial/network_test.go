package adversarial

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestNoNetwork checks a sandbox with the default network (none) has only
// loopback, and reaches nothing past it over TCP or raw ICMP: not the
// internet, not the cloud metadata address, not the host's own addresses,
// not the platform's API on the host's loopback, not a port another
// sandbox listens on. Protection: each sandbox's own network namespace
// with only lo up (a raw socket there, allowed by CAP_NET_RAW, has nowhere
// to send).
func TestNoNetwork(t *testing.T) {
	p := Env(t)
	t.Parallel()
	sb, other := Shared(t), NewSandbox(t, dsec.CreateOptions{})
	InstallProbe(t, sb)
	if r := Sh(t, sb, "ip -o link | cut -d: -f2 | tr -d ' '; ip -o addr | awk '{print $4}'"); r.Stdout != "lo\n127.0.0.1/8\n::1/128\n" && r.Stdout != "lo\n127.0.0.1/8\n" {
		t.Errorf("links and addresses in a sandbox = %q, want lo with 127.0.0.1/8 (and ::1) only", r.Stdout)
	}
	// Another sandbox listens on its loopback; this one must not reach it.
	if _, err := other.ExecDetached(Ctx(t, time.Minute), dsec.ExecRequest{Shell: "nc -lk -p 8000 -e cat", Timeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	_, apiPort, _ := net.SplitHostPort(p.Addr)
	targets := map[string]string{
		"1.1.1.1:80":           "ENETUNREACH",
		"169.254.169.254:80":   "ENETUNREACH",
		"127.0.0.1:" + apiPort: "ECONNREFUSED",
		"127.0.0.1:8000":       "ECONNREFUSED",
		"[2606:4700::1111]:80": "ENETUNREACH",
	}
	for _, ip := range hostAddrs(t) {
		targets[net.JoinHostPort(ip, apiPort)] = "ENETUNREACH"
	}
	want := map[string]string{}
	var args []string
	for a, w := range targets {
		want["connect:"+a] = w
		args = append(args, a)
	}
	if d := cmp.Diff(want, probe(t, sb, "connect", args...)); d != "" {
		t.Errorf("TCP connects from a sandbox (-want +got):\n%s", d)
	}
	raw := probe(t, sb, "raw", "1.1.1.1", "169.254.169.254")
	if d := cmp.Diff(map[string]string{"raw:1.1.1.1": "ENETUNREACH", "raw:169.254.169.254": "ENETUNREACH"}, raw); d != "" {
		t.Errorf("raw ICMP from a sandbox (-want +got):\n%s", d)
	}
}

// hostAddrs lists the host's global IPv4 addresses.
func hostAddrs(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !strings.HasPrefix(ipn.IP.String(), "169.254.") {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}

// TestNetworkSpoofAnotherSandbox: a sandbox with a narrow policy forges
// packets with the source address of a sandbox whose policy is open, so
// that the egress proxy and the node resolver, which know a sandbox by its
// source address, would judge, answer and count them as the other
// sandbox's. It cannot re-address its eth0 (no CAP_NET_ADMIN, checked
// here), but it holds CAP_NET_RAW in its own namespace: a raw IP socket
// sends DNS queries (no handshake needed) from the victim's address to its
// own and the victim's router ends. Protection: strict reverse-path
// filtering in the router namespace drops a packet whose source belongs to
// another link before the resolver sees it, so none counts for the victim.
// The same queries from the attacker's own address do count (the test can
// tell a resolver that saw nothing from one that saw the forgeries).
func TestNetworkSpoofAnotherSandbox(t *testing.T) {
	Env(t)
	t.Parallel()
	ctx := Ctx(t, 2*time.Minute)
	attacker := NewSandbox(t, dsec.CreateOptions{Network: dsec.NetworkFlag("allow=192.0.2.1:9")})
	victim := NewSandbox(t, dsec.CreateOptions{Network: dsec.NetworkFlag("open")})
	InstallProbe(t, attacker)
	a, err := attacker.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, err := victim.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a.Address == "" || v.Address == "" || a.Gateway == "" || a.Address == v.Address {
		t.Fatalf("addresses: attacker %+v, victim %+v", a, v)
	}
	if r := Sh(t, attacker, "ip addr add "+v.Address+"/32 dev eth0"); r.Code() == 0 {
		t.Errorf("the sandbox gave its eth0 another sandbox's address: it holds CAP_NET_ADMIN")
	}
	send := func(src string) map[string]string {
		t.Helper()
		var got map[string]string
		for i := 0; i < 3; i++ {
			got = probe(t, attacker, "spoofdns", src, a.Gateway, v.Gateway)
		}
		time.Sleep(200 * time.Millisecond) // the resolver counts as it answers
		return got
	}
	// From its own address: sent, answered, counted as the attacker's.
	if got := send(a.Address); got["spoofdns:"+a.Gateway] != "ok" {
		t.Fatalf("raw DNS queries from the sandbox's own address: %v, want sent", got)
	}
	a2, err := attacker.Network(ctx)
	if err != nil || a2.DNSQueries < a.DNSQueries+3 {
		t.Fatalf("the attacker's own raw queries were not counted: before %+v, after %+v %v", a, a2, err)
	}
	before, err := victim.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := send(v.Address)
	after, err := victim.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.DNSQueries != before.DNSQueries || after.Denied != before.Denied || after.ConnectionsOut != before.ConnectionsOut {
		t.Errorf("queries forged with the victim's source (sends: %v) counted for the victim: before %+v, after %+v", got, before, after)
	}
	if a3, _ := attacker.Network(ctx); a3.DNSQueries != a2.DNSQueries {
		t.Errorf("forged queries counted for the attacker: %d then %d", a2.DNSQueries, a3.DNSQueries)
	}
}

// TestNetworkNodeAddressGainedLater: the host gains an address after the
// node's network opened (a new interface, a DHCP lease, a container
// bridge), and one of its services listens there. A sandbox under open
// must not reach it: it is the node's own address, like those the node
// had when its network opened. A public host beside it, on the same new
// link, is reached (so the refusal is the policy's, not a missing route).
// Protection: the egress proxy asks the host's routing table, for every
// connection, whether the destination is local. Seen failing before: the
// proxy knew only the addresses the host had when the node opened and
// dialled the new one.
func TestNetworkNodeAddressGainedLater(t *testing.T) {
	Env(t)
	t.Parallel()
	ctx := Ctx(t, 2*time.Minute)
	// Created first, so that the node's network is open before the host
	// gains the address.
	sb := NewSandbox(t, dsec.CreateOptions{Network: dsec.NetworkFlag("open")})
	InstallProbe(t, sb)
	w := newWorld(t, "dsadvlate", "11.0.0.2", "11.0.0.3")
	hostSvc := (*world)(nil).listenTCP(t, w.hostAddr)
	worldSvc := w.listenTCP(t, w.addr)
	got := probe(t, sb, "banner", hostSvc.addr(), worldSvc.addr())
	if got["banner:"+worldSvc.addr()] != "ok" {
		t.Errorf("a public host beside the node (%s) from a sandbox under open: %q, want reached", worldSvc.addr(), got["banner:"+worldSvc.addr()])
	}
	if got["banner:"+hostSvc.addr()] == "ok" || hostSvc.accepted() != 0 {
		t.Errorf("a service on the host's new address %s reached from a sandbox under open (%q, %d accepted)", hostSvc.addr(), got["banner:"+hostSvc.addr()], hostSvc.accepted())
	}
	info, err := sb.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !hasDenial(info, hostSvc.addr()+"/tcp", "(node)") {
		t.Errorf("no denial of %s/tcp naming the node in %+v", hostSvc.addr(), info.Denials)
	}
}

// TestNetworkUDP: UDP from a real sandbox (crun, its own network
// namespace) by a CIDR rule: an echo on the allowed address and port
// answers, through the node's UDP relay, from the address it was sent
// to; another port of that address, and a port of the node's own address
// that a rule names, get nothing (nothing arrives there) and are logged;
// mode open allows no UDP, and the allowed port answers again when the
// rule is back.
func TestNetworkUDP(t *testing.T) {
	Env(t)
	t.Parallel()
	ctx := Ctx(t, 2*time.Minute)
	// The sandbox first (its network opens the node's), then the world:
	// the node's address on the world's link is one it gains later.
	sb := NewSandbox(t, dsec.CreateOptions{Network: dsec.NetworkFlag("open")})
	InstallProbe(t, sb)
	w := newWorld(t, "dsadvudp", "11.0.0.0", "11.0.0.1")
	allowed, denied := w.listenUDP(t, w.addr), w.listenUDP(t, w.addr)
	node := (*world)(nil).listenUDP(t, w.hostAddr)
	port := func(e *udpEcho) string { _, p, _ := net.SplitHostPort(e.addr()); return p }
	flag := dsec.NetworkFlag(fmt.Sprintf("allow=%s:%s/udp,%s:%s/udp", w.addr, port(allowed), w.hostAddr, port(node)))
	if _, err := sb.UpdateNetwork(ctx, flag, false); err != nil {
		t.Fatal(err)
	}

	got := probe(t, sb, "udp", allowed.addr(), denied.addr(), node.addr())
	want := map[string]string{"udp:" + allowed.addr(): "ok", "udp:" + denied.addr(): "timeout", "udp:" + node.addr(): "timeout"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("UDP from a sandbox allowed to %s (-want +got):\n%s", allowed.addr(), d)
	}
	if denied.received() != 0 || node.received() != 0 {
		t.Errorf("datagrams arrived where no rule allows: %d at %s, %d at the node's %s", denied.received(), denied.addr(), node.received(), node.addr())
	}
	info, err := sb.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !hasDenial(info, denied.addr()+"/udp", "no rule allows it") || !hasDenial(info, node.addr()+"/udp", "(node)") {
		t.Errorf("denials %+v; want %s/udp (no rule) and %s/udp (the node's)", info.Denials, denied.addr(), node.addr())
	}
	if info.BytesOut == 0 || info.BytesIn == 0 {
		t.Errorf("counters after a relayed echo: out %d, in %d bytes; want both counted", info.BytesOut, info.BytesIn)
	}

	if _, err := sb.UpdateNetwork(ctx, dsec.NetworkFlag("open"), false); err != nil {
		t.Fatal(err)
	}
	before := allowed.received()
	if got := probe(t, sb, "udp", allowed.addr()); got["udp:"+allowed.addr()] != "timeout" {
		t.Errorf("UDP under mode open: %v, want dropped (open allows TCP only)", got)
	}
	if n := allowed.received(); n != before {
		t.Errorf("%d datagrams reached %s under mode open", n-before, allowed.addr())
	}
	if _, err := sb.UpdateNetwork(ctx, flag, false); err != nil {
		t.Fatal(err)
	}
	if got := probe(t, sb, "udp", allowed.addr()); got["udp:"+allowed.addr()] != "ok" {
		t.Errorf("UDP once the rule is back: %v, want answered", got)
	}
}

// hasDenial reports whether info holds a denial of dest whose reason
// says why.
func hasDenial(info *dsec.NetworkInfo, dest, why string) bool {
	for _, d := range info.Denials {
		if d.Destination == dest && strings.Contains(d.Reason, why) {
			return true
		}
	}
	return false
}
