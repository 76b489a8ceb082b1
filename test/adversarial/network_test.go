package adversarial

import (
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
