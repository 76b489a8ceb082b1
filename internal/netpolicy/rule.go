package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Action is what a rule does with the connections it matches.
type Action string

// The actions.
const (
	Allow Action = "allow"
	Deny  Action = "deny"
)

// Protocol is a transport protocol. The zero value means TCP.
type Protocol string

// The protocols.
const (
	TCP Protocol = "tcp"
	UDP Protocol = "udp"
)

// proto returns p with the default applied.
func (p Protocol) proto() Protocol {
	if p == "" {
		return TCP
	}
	return p
}

// PortRange is the ports From through To, both included, 1 <= From <= To
// <= 65535. A single port has From == To.
type PortRange struct {
	From, To uint16
}

// width is the number of ports in r.
func (r PortRange) width() int { return int(r.To) - int(r.From) + 1 }

func (r PortRange) contains(p uint16) bool { return r.From <= p && p <= r.To }

// String returns "443" or "8000-8100".
func (r PortRange) String() string {
	if r.From == r.To {
		return strconv.Itoa(int(r.From))
	}
	return strconv.Itoa(int(r.From)) + "-" + strconv.Itoa(int(r.To))
}

// allPorts is what a rule without ports covers.
var allPorts = []PortRange{{1, 65535}}

// ParsePortRange parses "443" or "8000-8100".
func ParsePortRange(s string) (PortRange, error) {
	from, to, isRange := strings.Cut(s, "-")
	f, err := parsePort(from)
	if err != nil {
		return PortRange{}, err
	}
	t := f
	if isRange {
		if t, err = parsePort(to); err != nil {
			return PortRange{}, err
		}
		if t < f {
			return PortRange{}, invalid("port range %q runs backwards: write it low-high", s)
		}
	}
	return PortRange{f, t}, nil
}

func parsePort(s string) (uint16, error) {
	if s == "" || len(s) > 5 || strings.Trim(s, "0123456789") != "" {
		return 0, invalid("port %.20q is not a number from 1 to 65535", s)
	}
	n, _ := strconv.Atoi(s)
	if n < 1 || n > 65535 {
		return 0, invalid("port %s is out of range: ports run from 1 to 65535", s)
	}
	return uint16(n), nil
}

// checkPorts checks a rule's or a service's list of ranges and returns it
// sorted.
func checkPorts(ports []PortRange) ([]PortRange, error) {
	if len(ports) > MaxPorts {
		return nil, invalid("%d port ranges: at most %d", len(ports), MaxPorts)
	}
	out := slices.Clone(ports)
	for _, r := range out {
		if r.From < 1 || r.To < r.From {
			return nil, invalid("port range %d-%d is not within 1-65535 low to high", r.From, r.To)
		}
	}
	slices.SortFunc(out, func(a, b PortRange) int {
		if a.From != b.From {
			return int(a.From) - int(b.From)
		}
		return int(a.To) - int(b.To)
	})
	return slices.Compact(out), nil
}

// Bounds of what users and operators may write.
const (
	MaxRules    = 256     // rules in a policy
	MaxPorts    = 64      // port ranges in a rule or a service
	MaxAllPorts = 256     // port ranges in all the rules of a policy
	MaxDomains  = 256     // domains of a service
	MaxCIDRs    = 256     // CIDRs of a service
	MaxServices = 256     // services of a catalogue
	MaxHosts    = 1024    // names in [hosts]
	MaxHostAddr = 16      // addresses of one name in [hosts]
	MaxUpstream = 8       // resolver upstreams
	MaxDocBytes = 1 << 20 // a policy document, a catalogue file
)

// Rule is one line of a policy. Exactly one of Service, Domain and CIDR is
// set.
type Rule struct {
	Action Action
	// Service names a catalogue entry ("pypi").
	Service string
	// Domain is a lower-case name ("example.com") or a wildcard
	// ("*.example.com", which matches names below example.com but not
	// example.com itself).
	Domain string
	// CIDR is a network; an IPv4 network written in IPv6's mapped form
	// (::ffff:10.0.0.0/104) is kept as IPv4.
	CIDR netip.Prefix
	// Ports limits the rule to these ports. Empty means the service's
	// ports for a service rule, and every port otherwise.
	Ports []PortRange
	// Protocol is TCP (the default) or UDP; UDP only with a CIDR.
	Protocol Protocol
}

// target returns the rule's target as users write it.
func (r Rule) target() string {
	switch {
	case r.Service != "":
		return r.Service
	case r.Domain != "":
		return r.Domain
	case r.CIDR.IsValid():
		return r.CIDR.String()
	default:
		return ""
	}
}

// String returns the rule in the CLI's clause form: "allow pypi",
// "deny *.example.com:443", "allow 10.0.0.0/8:53/udp".
func (r Rule) String() string {
	var b strings.Builder
	b.WriteString(string(r.Action))
	b.WriteByte(' ')
	b.WriteString(r.flagTarget())
	return b.String()
}

// flagTarget returns the target as ParseTarget reads it back:
// "*.example.com:443", "[2001:db8::/32]:80+443", "10.0.0.0/8:53/udp".
func (r Rule) flagTarget() string {
	var b strings.Builder
	t := r.target()
	if r.CIDR.IsValid() && r.CIDR.Addr().Is6() && len(r.Ports) > 0 {
		t = "[" + t + "]"
	}
	b.WriteString(t)
	for i, p := range r.Ports {
		if i == 0 {
			b.WriteByte(':')
		} else {
			b.WriteByte('+')
		}
		b.WriteString(p.String())
	}
	if r.Protocol.proto() == UDP {
		b.WriteString("/udp")
	}
	return b.String()
}

// sameTarget reports whether a and b name the same target with the same
// ports and protocol.
func sameTarget(a, b Rule) bool {
	return a.Service == b.Service && a.Domain == b.Domain && a.CIDR == b.CIDR &&
		a.Protocol.proto() == b.Protocol.proto() && slices.Equal(a.Ports, b.Ports)
}

// normalize checks r on its own (not against a catalogue) and returns it
// in canonical form: the domain lower-case without a trailing dot, the CIDR
// masked, the ports sorted, the protocol spelled out.
func (r Rule) normalize() (Rule, error) {
	switch r.Action {
	case Allow, Deny:
	default:
		return r, invalid("action %.20q: want allow or deny", r.Action)
	}
	n := 0
	if r.Service != "" {
		n++
		if err := checkServiceName(r.Service); err != nil {
			return r, err
		}
	}
	if r.Domain != "" {
		n++
		d, err := normalizeDomainRule(r.Domain)
		if err != nil {
			return r, err
		}
		r.Domain = d
	}
	if r.CIDR.IsValid() {
		n++
		r.CIDR = normalizePrefix(r.CIDR)
	}
	if n != 1 {
		return r, invalid("a rule names exactly one of a service, a domain or a CIDR")
	}
	ports, err := checkPorts(r.Ports)
	if err != nil {
		return r, err
	}
	if len(ports) == 0 {
		ports = nil
	}
	r.Ports = ports
	switch r.Protocol {
	case "", TCP:
		r.Protocol = TCP
	case UDP:
		if !r.CIDR.IsValid() {
			return r, invalid("UDP is allowed only to a CIDR (DNS goes through the node resolver): write the network, e.g. 192.0.2.0/24:5000/udp")
		}
	default:
		return r, invalid("protocol %.20q: want tcp or udp", r.Protocol)
	}
	if r.Service == ServiceAPI && r.Ports != nil {
		return r, invalid("%s takes no ports: the proxy knows the platform's API", ServiceAPI)
	}
	return r, nil
}

// normalizePrefix masks p and turns an IPv4-mapped IPv6 prefix into IPv4.
func normalizePrefix(p netip.Prefix) netip.Prefix {
	a := p.Addr()
	if a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// ParseTarget parses one target as the CLI and the SDK write it, with the
// action given: a service ("pypi"), a domain ("example.com",
// "*.example.com"), an address or CIDR ("192.0.2.1", "10.0.0.0/8",
// "2001:db8::/32"), optionally followed by ":PORT" or ":LOW-HIGH" (for IPv6,
// bracket the network: "[2001:db8::/32]:443"; several ports join with "+":
// ":80+443") and "/udp" or "/tcp". A
// target without a dot, a colon or a slash is a service name.
func ParseTarget(action Action, s string) (Rule, error) {
	r := Rule{Action: action}
	rest := s
	if base, ok := strings.CutSuffix(rest, "/udp"); ok {
		r.Protocol, rest = UDP, base
	} else if base, ok := strings.CutSuffix(rest, "/tcp"); ok {
		r.Protocol, rest = TCP, base
	}
	host, port := rest, ""
	if strings.HasPrefix(rest, "[") {
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return r, invalid("%.80q: missing ] after the IPv6 network", s)
		}
		host, port = rest[1:end], rest[end+1:]
		if port != "" {
			var ok bool
			if port, ok = strings.CutPrefix(port, ":"); !ok || port == "" {
				return r, invalid("%.80q: want [NETWORK]:PORT", s)
			}
		}
		if !strings.Contains(host, ":") {
			return r, invalid("%.80q: brackets are for IPv6 networks only", s)
		}
	} else if strings.Count(rest, ":") == 1 {
		host, port, _ = strings.Cut(rest, ":")
		if port == "" {
			return r, invalid("%.80q: a port after the colon", s)
		}
	}
	if port != "" {
		parts := strings.Split(port, "+")
		if len(parts) > MaxPorts {
			return r, invalid("%d port ranges: at most %d", len(parts), MaxPorts)
		}
		for _, part := range parts {
			pr, err := ParsePortRange(part)
			if err != nil {
				return r, err
			}
			r.Ports = append(r.Ports, pr)
		}
	}
	switch {
	case host == "":
		return r, invalid("empty target: name a service, a domain or a CIDR")
	case strings.ContainsAny(host, "/:") || isIPv4Literal(host):
		p, err := parseCIDR(host)
		if err != nil {
			return r, err
		}
		r.CIDR = p
	case strings.Contains(host, "."):
		r.Domain = host
	default:
		r.Service = host
	}
	return r.normalize()
}

// isIPv4Literal reports whether s looks like a dotted IPv4 address (digits
// and dots only), so that "10.0.0.1" is read as an address, not a domain.
func isIPv4Literal(s string) bool {
	return s != "" && strings.Trim(s, "0123456789.") == ""
}

// parseCIDR parses a network or a single address (a /32 or /128).
func parseCIDR(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Zone() != "" {
			return netip.Prefix{}, invalid("CIDR %.80q is malformed: write it as 10.0.0.0/8 or 2001:db8::/32", s)
		}
		return normalizePrefix(p), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, invalid("address %.80q is malformed: write it as 192.0.2.1 or 2001:db8::1", s)
	}
	return normalizePrefix(netip.PrefixFrom(a, a.BitLen())), nil
}

// ServiceAPI is the built-in service that means the platform's own API,
// reached through the proxy with the sandbox's own scoped key. It has no
// domain or address: the proxy recognises it (see Policy.AllowAPI).
const ServiceAPI = "dsec-api"

// APIName and APIPort are where a sandbox whose policy allows dsec-api
// finds the platform's API: the node resolver answers APIName with the
// sandbox's gateway, and the proxy takes the gateway's APIPort to the API
// (plain HTTP inside the node; the sandbox's own key goes with it).
const (
	APIName = "api.dsec.internal"
	APIPort = 80
)

// checkServiceName checks a service's name: a lower-case letter, then up
// to 62 lower-case letters, digits and hyphens, not ending in a hyphen.
func checkServiceName(s string) error {
	ok := len(s) >= 1 && len(s) <= 63 && s[0] >= 'a' && s[0] <= 'z' && s[len(s)-1] != '-'
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-'
	}
	if !ok {
		return invalid("service name %.80q: want lower-case letters, digits and hyphens, starting with a letter", s)
	}
	return nil
}

// NormalizeName returns a host name as the policy compares it: lower-case
// ASCII, without one trailing dot. It fails for names that are not valid
// DNS host names (LDH labels of 1-63 characters, at most 253 in all, a last
// label that is not all digits); a name in Unicode must be given in its
// punycode form (xn--...), as the resolver and TLS see it.
func NormalizeName(s string) (string, error) {
	if len(s) > 254 {
		return "", invalid("name %.80q... is longer than 253 characters", s)
	}
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return "", invalid("empty name")
	}
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case c >= 0x80:
			return "", invalid("name %.80q is not ASCII: write it in punycode (xn--...)", s)
		}
	}
	s = string(b)
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return "", fmt.Errorf("name %.80q: %w", s, err)
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return "", invalid("name %.80q ends in a number: write an address as a CIDR", s)
	}
	return s, nil
}

func checkLabel(l string) error {
	if l == "" || len(l) > 63 {
		return invalid("labels are 1 to 63 characters")
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return invalid("label %.63q starts or ends with a hyphen", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return invalid("label %.63q holds %q: use letters, digits and hyphens", l, c)
		}
	}
	return nil
}

// normalizeDomainRule checks a rule's domain: a name of at least two labels,
// or "*." followed by one.
func normalizeDomainRule(s string) (string, error) {
	base, wild := strings.CutPrefix(s, "*.")
	if strings.Contains(base, "*") {
		return "", invalid("domain %.80q: a wildcard is only a whole first label, as in *.example.com", s)
	}
	n, err := NormalizeName(base)
	if err != nil {
		return "", err
	}
	if !strings.Contains(n, ".") {
		return "", invalid("domain %.80q: a domain has at least two labels (example.com, *.example.com)", s)
	}
	if wild {
		return "*." + n, nil
	}
	return n, nil
}

// domainMatch reports whether the rule domain d (normalized) matches the
// normalized name n, and how many labels of n it fixes (the specificity).
func domainMatch(d, n string) (exact bool, labels int, ok bool) {
	if suffix, wild := strings.CutPrefix(d, "*."); wild {
		if strings.HasSuffix(n, "."+suffix) {
			return false, strings.Count(suffix, ".") + 1, true
		}
		return false, 0, false
	}
	if d == n {
		return true, strings.Count(d, ".") + 1, true
	}
	return false, 0, false
}

// ruleError is the InvalidArgument error naming rule i (0-based) of a
// policy.
func ruleError(i int, r Rule, err error) error {
	return tokenError(i, r.Action, r.flagTarget(), err)
}

// invalid returns an InvalidArgument error with a message for users.
func invalid(format string, args ...any) error {
	return errdefs.Newf(errdefs.ErrInvalidArgument, format, args...)
}

// The preamble of a connection to the platform's API for sandboxes: the
// node's proxy, the only client of that socket, writes it before the
// sandbox's bytes; the API takes the connection's calls as the sandbox's.
const (
	apiPreambleMagic = "DSEC-SANDBOX-API 1 "
	// MaxAPIPreamble bounds the preamble's line, its newline included.
	MaxAPIPreamble = len(apiPreambleMagic) + 128 + 1
)

// SandboxAPIPreamble returns the preamble for sandbox id.
func SandboxAPIPreamble(id string) []byte { return []byte(apiPreambleMagic + id + "\n") }

// ParseSandboxAPIPreamble returns the sandbox a preamble line (its newline
// included) names.
func ParseSandboxAPIPreamble(line []byte) (string, error) {
	s := string(line)
	id, ok := strings.CutPrefix(s, apiPreambleMagic)
	if !ok || !strings.HasSuffix(id, "\n") {
		return "", fmt.Errorf("not a sandbox API preamble")
	}
	id = strings.TrimSuffix(id, "\n")
	if id == "" || len(id) > 128 || strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return "", fmt.Errorf("sandbox API preamble: bad sandbox ID %.80q", id)
	}
	return id, nil
}
