package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Mode is a policy's kind.
type Mode string

// The modes.
const (
	// ModeNone is loopback only, the default: no rule applies.
	ModeNone Mode = "none"
	// ModeRules allows what its rules allow and nothing else.
	ModeRules Mode = "rules"
	// ModeOpen allows all public TCP egress except what its rules deny;
	// special addresses stay blocked (see Special).
	ModeOpen Mode = "open"
)

// Spec is a policy as users write it: a mode and its rules, in order (rule
// numbers in decisions count from 1 in this order).
type Spec struct {
	Mode  Mode
	Rules []Rule
}

// Normalize checks s on its own (services are checked by Compile) and
// returns it in canonical form. An empty mode is none without rules and
// rules with them; mode rules without rules is none. The same target (service, domain or CIDR with the same
// ports and protocol) both allowed and denied is an error naming both
// rules: such a policy says two things and the writer meant one.
func (s Spec) Normalize() (Spec, error) {
	switch s.Mode {
	case "":
		s.Mode = ModeNone
		if len(s.Rules) > 0 {
			s.Mode = ModeRules
		}
	case ModeNone:
		if len(s.Rules) > 0 {
			return s, invalid("network mode none takes no rules: use allow and deny rules, or open")
		}
	case ModeRules, ModeOpen:
	default:
		return s, invalid("network mode %.20q: want none, rules or open", s.Mode)
	}
	if len(s.Rules) > MaxRules {
		return s, invalid("%d network rules: at most %d", len(s.Rules), MaxRules)
	}
	rules := make([]Rule, len(s.Rules))
	nports := 0
	for i, r := range s.Rules {
		n, err := r.normalize()
		if err != nil {
			return s, ruleError(i, r, err)
		}
		if nports += len(n.Ports); nports > MaxAllPorts {
			return s, ruleError(i, r, invalid("more than %d port ranges in all the rules: join them into wider ranges", MaxAllPorts))
		}
		for j, o := range rules[:i] {
			if o.Action != n.Action && sameTarget(o, n) {
				return s, invalid("network rules %d (%s) and %d (%s) both allow and deny the same target: remove one", j+1, o, i+1, n)
			}
		}
		rules[i] = n
	}
	if len(rules) == 0 {
		rules = nil
		if s.Mode == ModeRules {
			s.Mode = ModeNone // no rule allows anything: that is none
		}
	}
	s.Rules = rules
	return s, nil
}

// Policy is a Spec compiled against a catalogue: what Decide runs.
type Policy struct {
	spec    Spec
	cat     *Catalogue
	entries []entry
	api     bool
}

// entry is one thing a rule matches: a domain or a CIDR of the rule itself
// or of the service it names.
type entry struct {
	rule     int // index in spec.Rules
	action   Action
	domain   string       // or
	cidr     netip.Prefix // one of them
	ports    []PortRange  // never empty
	proto    Protocol
	operator bool // from an operator's catalogue entry
}

// Compile checks s against cat and returns the policy. Errors are
// InvalidArgument naming the rule, or FailedPrecondition for mode open on
// a node whose operator forbids it.
func Compile(s Spec, cat *Catalogue) (*Policy, error) {
	s, err := s.Normalize()
	if err != nil {
		return nil, err
	}
	if s.Mode == ModeOpen && cat.NoOpen {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "this node's operator does not permit open network: allow the services or domains the sandbox needs")
	}
	p := &Policy{spec: s, cat: cat}
rules:
	for i, r := range s.Rules {
		for _, o := range s.Rules[:i] {
			if o.Action == r.Action && sameTarget(o, r) {
				continue rules // the same rule again: the first decides
			}
		}
		ports := r.Ports
		if r.Service == "" {
			if ports == nil {
				ports = allPorts
			}
			e := entry{rule: i, action: r.Action, domain: r.Domain, cidr: r.CIDR, ports: ports, proto: r.Protocol}
			p.entries = append(p.entries, e)
			continue
		}
		svc, ok := cat.services[r.Service]
		if !ok {
			return nil, ruleError(i, r, invalid("unknown service: the services are %s; or name a domain or a CIDR", strings.Join(cat.Services(), ", ")))
		}
		if svc.API {
			if r.Action == Allow {
				p.api = true
			}
			continue
		}
		if ports == nil && r.Action == Allow {
			ports = svc.Ports // allow narrowly, deny broadly
		}
		if len(ports) == 0 {
			ports = allPorts
		}
		for _, d := range svc.Domains {
			p.entries = append(p.entries, entry{rule: i, action: r.Action, domain: d, ports: ports, proto: TCP, operator: svc.Operator})
		}
		for _, c := range svc.CIDRs {
			p.entries = append(p.entries, entry{rule: i, action: r.Action, cidr: c, ports: ports, proto: TCP, operator: svc.Operator})
		}
	}
	for _, r := range s.Rules {
		if r.Service == ServiceAPI && r.Action == Deny {
			p.api = false
		}
	}
	return p, nil
}

// Spec returns the policy as written, normalized.
func (p *Policy) Spec() Spec {
	return Spec{Mode: p.spec.Mode, Rules: slices.Clone(p.spec.Rules)}
}

// Mode returns the policy's mode.
func (p *Policy) Mode() Mode { return p.spec.Mode }

// AllowAPI reports whether the policy allows dsec-api, the platform's API
// through the proxy. Mode open does not include it: it is the host.
func (p *Policy) AllowAPI() bool { return p.api }

// Dest is a connection the sandbox makes, as the proxy knows it.
type Dest struct {
	// Addr is the original destination address; an IPv4-mapped IPv6
	// address is taken as the IPv4 address.
	Addr netip.Addr
	Port uint16
	// Protocol is TCP or UDP (zero: TCP).
	Protocol Protocol
	// Name is the name the connection says it is for: the TLS SNI or the
	// HTTP Host (without a port), or "" when it says none. When the proxy
	// sees both and they differ, it asks once for each and allows only
	// when both are allowed.
	Name string
	// Resolved are the names the sandbox resolved to Addr through the
	// node resolver, still within their TTL, as the resolver recorded
	// them.
	Resolved []string
	// Local says that the node's kernel delivers Addr to the node itself
	// (one of its own addresses, loopback, a broadcast), as the caller
	// found when it judged the connection. It makes Addr special as
	// Catalogue.Local does, for an address the node gained after its
	// catalogue's Local was taken.
	Local bool
}

// Reason says why a decision was made.
type Reason int

// The reasons.
const (
	// ReasonRule: a rule matched and decided (Decision.Rule says which).
	ReasonRule Reason = iota + 1
	// ReasonNoRule: no rule matched, and the default is deny.
	ReasonNoRule
	// ReasonOpen: no rule matched, and mode open allows public TCP.
	ReasonOpen
	// ReasonNone: the policy is mode none.
	ReasonNone
	// ReasonSpecial: the address is special (private, loopback, the
	// node's...) and no operator entry opens it; Decision.Rule, when not
	// zero, is an allow rule that matched but cannot open it.
	ReasonSpecial
	// ReasonAPI: a connection to the platform's API (the gateway's
	// APIPort), allowed exactly when the policy allows dsec-api.
	ReasonAPI
	// ReasonNoAPI: the same, on a node that does not serve the API to
	// sandboxes.
	ReasonNoAPI
)

// Decision is the verdict on one Dest.
type Decision struct {
	Allow  bool
	Reason Reason
	// Rule is the number (from 1) of the rule that decided, 0 when none
	// did.
	Rule int
	// RuleText is that rule as the CLI writes it ("deny npm").
	RuleText string
	// Class names the special address class for ReasonSpecial.
	Class string
	// Addr is the destination decided on.
	Addr netip.Addr
}

// String explains d for users (dsec net log).
func (d Decision) String() string {
	switch d.Reason {
	case ReasonRule:
		if d.Allow {
			return fmt.Sprintf("allowed by rule %d (%s)", d.Rule, d.RuleText)
		}
		return fmt.Sprintf("denied by rule %d (%s)", d.Rule, d.RuleText)
	case ReasonOpen:
		return "allowed: the policy is open"
	case ReasonAPI:
		if d.Allow {
			return "allowed: the policy allows dsec-api, the platform's API"
		}
		return "denied: the policy does not allow dsec-api, the platform's API"
	case ReasonNoAPI:
		return "denied: this node does not serve the platform's API to sandboxes"
	case ReasonNone:
		return "denied: the sandbox has no network (mode none)"
	case ReasonSpecial:
		s := fmt.Sprintf("denied: %s (%s) is not a public address; only an operator's catalogue entry opens it", d.Addr, d.Class)
		if d.Rule > 0 {
			s = fmt.Sprintf("denied: rule %d (%s) matches, but %s (%s) is not a public address; only an operator's catalogue entry opens it", d.Rule, d.RuleText, d.Addr, d.Class)
		}
		return s
	default:
		return "denied: no rule allows it"
	}
}

// spec is how specific a match is; a greater spec decides. It compares
// the kind of target (exact domain over wildcard over CIDR), then how
// much of it is fixed (labels of the wildcard's suffix, bits of the
// prefix), then the port range (fewer ports is more specific).
type spec struct {
	rank   int // 3 exact domain, 2 wildcard domain, 1 CIDR
	length int // labels of the domain or its suffix, bits of the prefix
	width  int // ports in the range that matched
}

// cmp returns >0 when a is more specific than b.
func (a spec) cmp(b spec) int {
	if a.rank != b.rank {
		return a.rank - b.rank
	}
	if a.length != b.length {
		return a.length - b.length
	}
	return b.width - a.width
}

// narrowest returns the width of the narrowest of ports holding port.
func narrowest(ports []PortRange, port uint16) (int, bool) {
	w, ok := 0, false
	for _, r := range ports {
		if r.contains(port) && (!ok || r.width() < w) {
			w, ok = r.width(), true
		}
	}
	return w, ok
}

type match struct {
	e    *entry
	spec spec
}

// better reports whether m decides over the best so far: it is more
// specific, or as specific and a deny where best allows.
func (m match) better(best match) bool {
	if best.e == nil {
		return true
	}
	if c := m.spec.cmp(best.spec); c != 0 {
		return c > 0
	}
	return m.e.action == Deny && best.e.action == Allow
}

// Decide decides on one connection. The contract for callers:
//   - Addr is the real destination (the original destination of the
//     redirected connection), never a name's address the caller looked up
//     itself.
//   - A domain rule matches only when a name matches it and Addr is an
//     address that name resolved to: with Name set, Name must be among
//     Resolved; with Name empty (raw TCP), any of Resolved may match. So an
//     allowed SNI with an address the name did not resolve to is denied,
//     and a raw connection to an allowed name's address is held to the
//     rule's ports.
//   - A CIDR rule matches on Addr alone.
//   - UDP (other than DNS, which the node resolver answers) matches CIDR
//     rules only; mode open does not allow it.
//   - Special addresses (Special, Catalogue.Local, Dest.Local) are allowed only by an
//     operator catalogue entry's match, or by a match on a name of the
//     operator's [hosts] whose listed addresses hold Addr.
func (p *Policy) Decide(d Dest) Decision {
	a := d.Addr.Unmap()
	dec := Decision{Addr: a}
	if p.spec.Mode == ModeNone || !a.IsValid() || d.Port == 0 {
		dec.Reason = ReasonNone
		if p.spec.Mode != ModeNone {
			dec.Reason = ReasonNoRule
		}
		return dec
	}
	proto := d.Protocol.proto()
	class, special := Special(a)
	if !special && d.Local {
		class, special = "node", true
	}
	if !special {
		for _, l := range p.cat.Local {
			if l.Contains(a) {
				class, special = "node", true
				break
			}
		}
	}
	names := p.destNames(d)
	var best, blocked match
	for i := range p.entries {
		e := &p.entries[i]
		if e.proto != proto {
			continue
		}
		w, ok := narrowest(e.ports, d.Port)
		if !ok {
			continue
		}
		var m match
		operator := e.operator
		if e.domain != "" {
			for _, n := range names {
				exact, labels, ok := domainMatch(e.domain, n)
				if !ok {
					continue
				}
				s := spec{rank: 2, length: labels, width: w}
				if exact {
					s.rank = 3
				}
				c := match{e: e, spec: s}
				if m.e == nil || c.spec.cmp(m.spec) > 0 {
					m = c
					operator = e.operator || slices.Contains(p.cat.Hosts[n], a)
				}
			}
		} else if e.cidr.Contains(a) {
			m = match{e: e, spec: spec{rank: 1, length: e.cidr.Bits(), width: w}}
		}
		if m.e == nil {
			continue
		}
		if special && e.action == Allow && !operator {
			if blocked.e == nil || m.spec.cmp(blocked.spec) > 0 {
				blocked = m
			}
			continue
		}
		if m.better(best) {
			best = m
		}
	}
	switch {
	case best.e != nil:
		dec.Allow = best.e.action == Allow
		dec.Reason = ReasonRule
		dec.Rule = best.e.rule + 1
		dec.RuleText = p.spec.Rules[best.e.rule].String()
	case special:
		dec.Reason, dec.Class = ReasonSpecial, class
		if blocked.e != nil {
			dec.Rule = blocked.e.rule + 1
			dec.RuleText = p.spec.Rules[blocked.e.rule].String()
		}
	case p.spec.Mode == ModeOpen && proto == TCP:
		dec.Allow, dec.Reason = true, ReasonOpen
	default:
		dec.Reason = ReasonNoRule
	}
	return dec
}

// destNames returns the normalized names a domain rule may match for d.
func (p *Policy) destNames(d Dest) []string {
	resolved := make([]string, 0, len(d.Resolved))
	for _, r := range d.Resolved {
		if n, err := NormalizeName(r); err == nil {
			resolved = append(resolved, n)
		}
	}
	if d.Name == "" {
		return resolved
	}
	n, err := NormalizeName(d.Name)
	if err != nil || !slices.Contains(resolved, n) {
		return nil
	}
	return []string{n}
}

// AllowName reports whether some connection to an address of name could
// be allowed: whether the node resolver answers it (NXDOMAIN otherwise).
// It is true when, on some port, the most specific rule matching the name
// allows, or no name rule matches and mode open or a CIDR allow rule could
// allow the name's addresses. The proxy still decides each connection.
func (p *Policy) AllowName(name string) bool {
	if p.spec.Mode == ModeNone {
		return false
	}
	n, err := NormalizeName(name)
	if err != nil {
		return false
	}
	// The entries that could decide for the name: those of its domain, and
	// the CIDR allows (its addresses may lie in them).
	var cands []match // their spec without the width
	for i := range p.entries {
		e := &p.entries[i]
		if e.domain == "" {
			if e.action == Allow {
				cands = append(cands, match{e: e})
			}
			continue
		}
		if exact, labels, ok := domainMatch(e.domain, n); ok {
			s := spec{rank: 2, length: labels}
			if exact {
				s.rank = 3
			}
			cands = append(cands, match{e: e, spec: s})
		}
	}
	// The decision is constant between the bounds of the ranges, so the
	// ports where a range starts or ends decide for all.
	ports := []uint16{1}
	for _, c := range cands {
		for _, r := range c.e.ports {
			ports = append(ports, r.From)
			if r.To < 65535 {
				ports = append(ports, r.To+1)
			}
		}
	}
	slices.Sort(ports)
	for _, port := range slices.Compact(ports) {
		var best match
		cidrAllow := false
		for _, c := range cands {
			w, ok := narrowest(c.e.ports, port)
			if !ok {
				continue
			}
			if c.e.domain == "" {
				cidrAllow = true
				continue
			}
			m := c
			m.spec.width = w
			if m.better(best) {
				best = m
			}
		}
		if best.e != nil {
			if best.e.action == Allow {
				return true
			}
			continue
		}
		if cidrAllow || p.spec.Mode == ModeOpen {
			return true
		}
	}
	return false
}

// specialNets are the address ranges no rule of a user opens: only an
// operator's catalogue entry does.
var specialNets = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (carrier NAT)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "NAT64"},
	{netip.MustParsePrefix("100::/64"), "discard"},
	{netip.MustParsePrefix("2001::/32"), "Teredo"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("2002::/16"), "6to4"},
	{netip.MustParsePrefix("fc00::/7"), "private"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// Special reports whether a is not a public unicast address, and its
// class ("private", "loopback", "link-local", ...). An IPv4-mapped IPv6
// address is judged as its IPv4 address; an invalid address is special.
func Special(a netip.Addr) (string, bool) {
	a = a.Unmap()
	if !a.IsValid() || a.Zone() != "" {
		return "invalid", true
	}
	class, bits := "", -1
	for _, s := range specialNets {
		if s.prefix.Contains(a) && s.prefix.Bits() > bits {
			class, bits = s.class, s.prefix.Bits()
		}
	}
	return class, bits >= 0
}
