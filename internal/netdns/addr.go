package netdns

import (
	"net/netip"
	"strings"

	"github.com/dsecproject/dsec/internal/netpolicy"
)

var (
	nat64   = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4  = netip.MustParsePrefix("2002::/16")
	teredo  = netip.MustParsePrefix("2001::/32")
	mapped4 = netip.MustParsePrefix("::ffff:0:0/96")
)

// isPublic reports whether a may be returned for a name that is not
// internal: a sandbox that could make a public name point at a
// non-public address (DNS rebinding) would reach the node, its neighbours
// or the cloud's metadata service through a rule that allows the name.
// Addresses that embed an IPv4 address (IPv4-mapped, NAT64, 6to4, Teredo)
// are judged by the address they embed.
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
	// Every other range out of a user's rules' reach (netpolicy's own
	// list: private, loopback, link-local and metadata, CGNAT,
	// documentation, multicast, reserved, ...) is out of a public name's.
	_, special := netpolicy.Special(a)
	return !special
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
