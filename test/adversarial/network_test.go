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
