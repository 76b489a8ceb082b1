package netdns

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/netpolicy"
)

func TestIsPublic(t *testing.T) {
	for _, tt := range []struct {
		addr string
		want bool
	}{
		{"93.184.216.34", true},
		{"8.8.8.8", true},
		{"2606:2800:220:1::1", true},
		{"10.0.0.5", false},
		{"172.16.0.1", false},
		{"172.31.255.255", false},
		{"172.32.0.1", true},
		{"192.168.1.1", false},
		{"100.64.0.1", false},
		{"100.127.255.255", false},
		{"100.128.0.1", true},
		{"127.0.0.1", false},
		{"127.1.2.3", false},
		{"169.254.169.254", false},
		{"0.0.0.0", false},
		{"0.1.2.3", false},
		{"224.0.0.1", false},
		{"239.255.255.250", false},
		{"255.255.255.255", false},
		{"198.18.0.1", false},
		{"::", false},
		{"::1", false},
		{"fe80::1", false},
		{"fc00::1", false},
		{"fd12:3456::1", false},
		{"ff02::1", false},
		{"::ffff:10.0.0.5", false},
		{"::ffff:127.0.0.1", false},
		{"::ffff:93.184.216.34", true},
		{"::10.0.0.5", false},
		{"64:ff9b::a00:5", false},        // NAT64 of 10.0.0.5
		{"64:ff9b::5db8:d822", true},     // NAT64 of 93.184.216.34
		{"2002:a00:5::1", false},         // 6to4 of 10.0.0.5
		{"2002:5db8:d822::1", true},      // 6to4 of 93.184.216.34
		{"2001:0:1:2::80ff:fefe", false}, // Teredo of 127.0.1.1
		{"2001:0:1:2::a247:29dd", true},  // Teredo of 93.184.214.34
		{"fe80::1%eth0", false},
	} {
		if got := isPublic(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("isPublic(%s) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}

func TestCanonical(t *testing.T) {
	for _, tt := range []struct {
		in, want string
		ok       bool
	}{
		{"PyPI.org.", "pypi.org", true},
		{"files.pythonhosted.org", "files.pythonhosted.org", true},
		{"_dmarc.x-y.example.", "_dmarc.x-y.example", true},
		{".", "", false},
		{"", "", false},
		{"a..b.", "", false},
		{`a\.b.example.`, "", false},
		{`a\000.example.`, "", false},
		{"a b.example.", "", false},
		{"a*.example.", "", false},
		{strings.Repeat("a", 64) + ".example.", "", false},
		{strings.Repeat("a", 63) + ".example.", strings.Repeat("a", 63) + ".example", true},
	} {
		got, ok := canonical(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("canonical(%q) = %q, %v, want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
	long := strings.Repeat(strings.Repeat("a", 63)+".", 4) // 255 bytes without the final dot
	if _, ok := canonical(long); ok {
		t.Errorf("canonical of a %d-byte name: ok, want refused", len(long))
	}
}

// TestNonPublicAgreesWithPolicy: every IPv4 address the policy holds to be
// special (out of a user's rules' reach) is one a public name never
// resolves to here, so the resolver does not hand out addresses the proxy
// then refuses. (IPv6 forms that embed an IPv4 address are judged by it
// here, and refused whole by the policy.)
func TestNonPublicAgreesWithPolicy(t *testing.T) {
	for _, s := range []string{
		"0.0.0.1", "10.1.2.3", "100.64.0.1", "127.0.0.2", "169.254.169.254", "172.16.5.4", "192.0.0.9",
		"192.0.2.99", "192.168.1.1", "198.18.0.1", "198.19.255.255", "198.51.100.7", "203.0.113.200",
		"224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
	} {
		a := netip.MustParseAddr(s)
		class, special := netpolicy.Special(a)
		if !special {
			t.Errorf("netpolicy.Special(%s) = false: this test's sample is wrong", s)
			continue
		}
		if isPublic(a) {
			t.Errorf("isPublic(%s) = true, but the policy holds it %s: a public name could resolve to an address no rule reaches", s, class)
		}
	}
}
