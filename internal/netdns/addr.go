package netdns

import (
	"net/netip"
	"strings"
)

// nonPublic lists the ranges a public name never resolves to: a sandbox
// that could make a public name point at one of them (DNS rebinding) would
// reach the node, its neighbours or the cloud's metadata service through
// a rule that allows the name. Addresses that embed an IPv4 address
// (IPv4-mapped, IPv4-compatible, NAT64, 6to4) are judged by the address
// they embed, in isPublic.
var nonPublic = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8",       // this network, unspecified
		"10.0.0.0/8",      // private
		"100.64.0.0/10",   // carrier-grade NAT
		"127.0.0.0/8",     // loopback
		"169.254.0.0/16",  // link-local, cloud metadata
		"172.16.0.0/12",   // private
		"192.0.0.0/24",    // IETF protocol assignments
		"192.0.2.0/24",    // documentation (TEST-NET-1)
		"192.168.0.0/16",  // private
		"198.18.0.0/15",   // benchmarking, fake-IP resolvers
		"198.51.100.0/24", // documentation (TEST-NET-2)
		"203.0.113.0/24",  // documentation (TEST-NET-3)
		"224.0.0.0/4",     // multicast
		"240.0.0.0/4",     // reserved, broadcast
		"::/96",           // unspecified, loopback, IPv4-compatible
		"100::/64",        // discard
		"fc00::/7",        // unique local
		"fe80::/10",       // link-local
		"fec0::/10",       // site-local (deprecated)
		"ff00::/8",        // multicast
		"2001:db8::/32",   // documentation, never routed
		"64:ff9b:1::/48",  // local-use NAT64
	} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()

var (
	nat64   = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4  = netip.MustParsePrefix("2002::/16")
	teredo  = netip.MustParsePrefix("2001::/32")
	mapped4 = netip.MustParsePrefix("::ffff:0:0/96")
)

// isPublic reports whether a may be returned for a name that is not
// internal.
func isPublic(a netip.Addr) bool {
	if !a.IsValid() || a.Zone() != "" {
		return false
	}
	if mapped4.Contains(a) {
		return isPublic(a.Unmap())
	}
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a):
			return isPublic(netip.AddrFrom4([4]byte(b[12:16])))
		case sixTo4.Contains(a):
			return isPublic(netip.AddrFrom4([4]byte(b[2:6])))
		case teredo.Contains(a):
			// The client's address is the last 32 bits, inverted.
			return isPublic(netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}))
		}
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// canonical returns the name of a DNS question as the policy sees it:
// lower case, without the final dot. It refuses names the policy could
// misread: the root, labels with characters other than letters, digits,
// '-' and '_' (miekg/dns shows such bytes, and dots inside a label, as
// escapes such as `\.` or `\000`), empty labels and over-long names.
func canonical(fqdn string) (string, bool) {
	name := strings.TrimSuffix(fqdn, ".")
	if name == "" || len(name) > 253 {
		return "", false
	}
	label := 0
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '.':
			if label == 0 {
				return "", false
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		case c >= 'A' && c <= 'Z':
		default:
			return "", false
		}
		label++
		if label > 63 {
			return "", false
		}
	}
	if label == 0 {
		return "", false
	}
	return strings.ToLower(name), true
}
