package netpolicy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// testCatalogue is the built-ins with an operator's pypi mirror on a
// private address, an internal service by CIDR and a [hosts] name.
const testCatalogue = `
version = 1

[services.pypi]
domains = ["pypi.org", "files.pythonhosted.org"]
ports = [443, 80]

[services.mirror]
cidrs = ["10.20.0.0/24"]
ports = ["8000-8100"]

[hosts]
"pypi.org" = ["10.20.0.5"]
"files.pythonhosted.org" = ["10.20.0.6"]
"registry.npmjs.org" = ["10.20.0.7"]
`

func mustCatalogue(t *testing.T) *Catalogue {
	t.Helper()
	c, err := ParseCatalogue("test.toml", []byte(testCatalogue))
	if err != nil {
		t.Fatalf("ParseCatalogue: %v", err)
	}
	c.Local = []netip.Prefix{netip.MustParsePrefix("203.0.114.0/24")}
	return c
}

func mustFlag(t testing.TB, cat *Catalogue, flag string) *Policy {
	t.Helper()
	f, err := ParseNetworkFlag(flag)
	if err != nil {
		t.Fatalf("ParseNetworkFlag(%q): %v", flag, err)
	}
	p, err := Compile(f.Spec, cat)
	if err != nil {
		t.Fatalf("Compile(%q): %v", flag, err)
	}
	return p
}

func TestDecide(t *testing.T) {
	cat := mustCatalogue(t)
	builtin := Builtin()
	pub := "151.101.0.223" // a public address a name resolved to
	pub2 := "140.82.112.3" // another public address
	type want struct {
		allow bool
		rule  int
		why   string // a part of Decision.String()
	}
	tests := []struct {
		name   string
		flag   string
		cat    *Catalogue
		d      Dest
		want   want
		reason Reason
	}{
		// Mode none: nothing.
		{"none denies", "none", builtin, Dest{Addr: ip(pub), Port: 443, Name: "pypi.org", Resolved: []string{"pypi.org"}}, want{false, 0, "no network"}, ReasonNone},

		// Built-in pypi, public addresses.
		{"pypi by SNI", "allow=pypi", builtin, Dest{Addr: ip(pub), Port: 443, Name: "pypi.org", Resolved: []string{"pypi.org"}}, want{true, 1, "allowed by rule 1 (allow pypi)"}, ReasonRule},
		{"pypi SNI with trailing dot and upper case", "allow=pypi", builtin, Dest{Addr: ip(pub), Port: 443, Name: "PyPI.org.", Resolved: []string{"pypi.org"}}, want{true, 1, ""}, ReasonRule},
		{"raw TCP to a name's address on its port", "allow=pypi", builtin, Dest{Addr: ip(pub), Port: 443, Resolved: []string{"files.pythonhosted.org"}}, want{true, 1, ""}, ReasonRule},
		{"raw IP to allowed host on another port", "allow=pypi", builtin, Dest{Addr: ip(pub), Port: 22, Resolved: []string{"pypi.org"}}, want{false, 0, "no rule allows it"}, ReasonNoRule},
		{"SNI allowed, port not", "allow=pypi", builtin, Dest{Addr: ip(pub), Port: 8443, Name: "pypi.org", Resolved: []string{"pypi.org"}}, want{false, 0, ""}, ReasonNoRule},
		{"allowed SNI, address the name did not resolve to", "allow=pypi", builtin, Dest{Addr: ip(pub2), Port: 443, Name: "pypi.org", Resolved: []string{"github.com"}}, want{false, 0, ""}, ReasonNoRule},
		{"allowed SNI, address never resolved", "allow=pypi", builtin, Dest{Addr: ip(pub2), Port: 443, Name: "pypi.org"}, want{false, 0, ""}, ReasonNoRule},
		{"denied SNI on an allowed name's address", "allow=pypi", builtin, Dest{Addr: ip(pub), Port: 443, Name: "evil.com", Resolved: []string{"pypi.org", "evil.com"}}, want{false, 0, ""}, ReasonNoRule},
		{"Host header an IP literal", "allow=pypi", builtin, Dest{Addr: ip(pub), Port: 443, Name: pub, Resolved: []string{pub}}, want{false, 0, ""}, ReasonNoRule},
		{"raw IP never resolved", "allow=pypi", builtin, Dest{Addr: ip(pub), Port: 443}, want{false, 0, ""}, ReasonNoRule},
		{"UDP to an allowed name", "allow=pypi", builtin, Dest{Addr: ip(pub), Port: 443, Protocol: UDP, Resolved: []string{"pypi.org"}}, want{false, 0, ""}, ReasonNoRule},
		{"npm denied by rule", "allow=pypi,deny=npm", builtin, Dest{Addr: ip(pub2), Port: 443, Name: "registry.npmjs.org", Resolved: []string{"registry.npmjs.org"}}, want{false, 2, "denied by rule 2 (deny npm)"}, ReasonRule},

		// Wildcards.
		{"wildcard matches a subdomain", "allow=*.example.com", builtin, Dest{Addr: ip(pub), Port: 443, Name: "a.b.example.com", Resolved: []string{"a.b.example.com"}}, want{true, 1, ""}, ReasonRule},
		{"wildcard does not match the bare suffix", "allow=*.example.com", builtin, Dest{Addr: ip(pub), Port: 443, Name: "example.com", Resolved: []string{"example.com"}}, want{false, 0, ""}, ReasonNoRule},
		{"wildcard does not match evilexample.com", "allow=*.example.com", builtin, Dest{Addr: ip(pub), Port: 443, Name: "evilexample.com", Resolved: []string{"evilexample.com"}}, want{false, 0, ""}, ReasonNoRule},
		{"exact does not match a subdomain", "allow=example.com", builtin, Dest{Addr: ip(pub), Port: 443, Name: "x.example.com", Resolved: []string{"x.example.com"}}, want{false, 0, ""}, ReasonNoRule},
		{"example.com.evil.net", "allow=example.com,*.example.com", builtin, Dest{Addr: ip(pub), Port: 443, Name: "example.com.evil.net", Resolved: []string{"example.com.evil.net"}}, want{false, 0, ""}, ReasonNoRule},

		// Specificity.
		{"exact allow beats wildcard deny", "deny=*.example.com,allow=api.example.com", builtin, Dest{Addr: ip(pub), Port: 443, Name: "api.example.com", Resolved: []string{"api.example.com"}}, want{true, 2, ""}, ReasonRule},
		{"longer wildcard beats shorter", "allow=*.example.com,deny=*.x.example.com", builtin, Dest{Addr: ip(pub), Port: 443, Name: "a.x.example.com", Resolved: []string{"a.x.example.com"}}, want{false, 2, ""}, ReasonRule},
		{"shorter wildcard applies beside", "allow=*.example.com,deny=*.x.example.com", builtin, Dest{Addr: ip(pub), Port: 443, Name: "a.y.example.com", Resolved: []string{"a.y.example.com"}}, want{true, 1, ""}, ReasonRule},
		{"rule with ports beats rule without", "deny=example.com,allow=example.com:443", builtin, Dest{Addr: ip(pub), Port: 443, Name: "example.com", Resolved: []string{"example.com"}}, want{true, 2, ""}, ReasonRule},
		{"rule without ports decides other ports", "deny=example.com,allow=example.com:443", builtin, Dest{Addr: ip(pub), Port: 80, Name: "example.com", Resolved: []string{"example.com"}}, want{false, 1, ""}, ReasonRule},
		{"deny wins at equal specificity (service vs domain)", "allow=files.pythonhosted.org,deny=pypi", builtin, Dest{Addr: ip(pub), Port: 443, Name: "files.pythonhosted.org", Resolved: []string{"files.pythonhosted.org"}}, want{false, 2, "denied by rule 2 (deny pypi)"}, ReasonRule},
		{"deny wins at equal specificity, order reversed", "deny=pypi,allow=files.pythonhosted.org", builtin, Dest{Addr: ip(pub), Port: 443, Name: "files.pythonhosted.org", Resolved: []string{"files.pythonhosted.org"}}, want{false, 1, ""}, ReasonRule},
		{"/32 beats /24", "allow=151.101.0.0/24,deny=151.101.0.223/32", builtin, Dest{Addr: ip(pub), Port: 443}, want{false, 2, ""}, ReasonRule},
		{"/24 decides beside the /32", "allow=151.101.0.0/24,deny=151.101.0.223/32", builtin, Dest{Addr: ip("151.101.0.1"), Port: 443}, want{true, 1, ""}, ReasonRule},
		{"a name rule beats a CIDR rule", "deny=0.0.0.0/0,allow=pypi", builtin, Dest{Addr: ip(pub), Port: 443, Name: "pypi.org", Resolved: []string{"pypi.org"}}, want{true, 2, ""}, ReasonRule},
		{"narrower port range wins", "allow=example.com:1-1000,deny=example.com:400-500", builtin, Dest{Addr: ip(pub), Port: 443, Name: "example.com", Resolved: []string{"example.com"}}, want{false, 2, ""}, ReasonRule},
		{"UDP by CIDR", "allow=151.101.0.0/16:5000/udp", builtin, Dest{Addr: ip(pub), Port: 5000, Protocol: UDP}, want{true, 1, ""}, ReasonRule},
		{"UDP CIDR rule does not open TCP", "allow=151.101.0.0/16:5000/udp", builtin, Dest{Addr: ip(pub), Port: 5000}, want{false, 0, ""}, ReasonNoRule},
		{"IPv6 CIDR", "allow=[2001:4860::/32]:443", builtin, Dest{Addr: ip("2001:4860::8888"), Port: 443}, want{true, 1, ""}, ReasonRule},

		// Special addresses under rules.
		{"CIDR rule cannot open private", "allow=10.0.0.0/8", builtin, Dest{Addr: ip("10.0.0.1"), Port: 443}, want{false, 1, "(private)"}, ReasonSpecial},
		{"IPv6-mapped private", "allow=0.0.0.0/0", builtin, Dest{Addr: ip("::ffff:10.0.0.1"), Port: 443}, want{false, 1, "10.0.0.1 (private)"}, ReasonSpecial},
		{"metadata address", "allow=0.0.0.0/0", builtin, Dest{Addr: ip("169.254.169.254"), Port: 80}, want{false, 1, "link-local"}, ReasonSpecial},
		{"0.0.0.0", "allow=0.0.0.0/0", builtin, Dest{Addr: ip("0.0.0.0"), Port: 80}, want{false, 1, "unspecified"}, ReasonSpecial},
		{"loopback", "allow=0.0.0.0/0", builtin, Dest{Addr: ip("127.0.0.1"), Port: 7420}, want{false, 1, "loopback"}, ReasonSpecial},
		{"IPv6 loopback", "allow=::/0", builtin, Dest{Addr: ip("::1"), Port: 7420}, want{false, 1, "loopback"}, ReasonSpecial},
		{"multicast", "allow=0.0.0.0/0:5353/udp", builtin, Dest{Addr: ip("224.0.0.251"), Port: 5353, Protocol: UDP}, want{false, 1, "multicast"}, ReasonSpecial},
		{"IPv6 link-local", "allow=::/0", builtin, Dest{Addr: ip("fe80::1"), Port: 80}, want{false, 1, "link-local"}, ReasonSpecial},
		{"NAT64 of a private address", "allow=::/0", builtin, Dest{Addr: ip("64:ff9b::a00:1"), Port: 80}, want{false, 1, "NAT64"}, ReasonSpecial},
		{"public name resolved to private (rebinding)", "allow=example.com", builtin, Dest{Addr: ip("192.168.1.1"), Port: 443, Name: "example.com", Resolved: []string{"example.com"}}, want{false, 1, "private"}, ReasonSpecial},
		{"node's own address", "allow=0.0.0.0/0", cat, Dest{Addr: ip("203.0.114.9"), Port: 22}, want{false, 1, "(node)"}, ReasonSpecial},
		{"a public address the node gained after its catalogue was taken", "open", builtin, Dest{Addr: ip(pub), Port: 22, Local: true}, want{false, 0, "(node)"}, ReasonSpecial},
		{"a node's later address under a CIDR allow", "allow=151.101.0.0/16", builtin, Dest{Addr: ip(pub), Port: 443, Local: true}, want{false, 1, "(node)"}, ReasonSpecial},
		{"an operator entry still opens a node's later address", "allow=mirror", cat, Dest{Addr: ip("10.20.0.99"), Port: 8080, Local: true}, want{true, 1, ""}, ReasonRule},
		{"deny still decides a private address", "deny=10.0.0.0/8", builtin, Dest{Addr: ip("10.0.0.1"), Port: 443}, want{false, 1, "denied by rule 1"}, ReasonRule},

		// Operator entries open private addresses.
		{"operator pypi mirror", "allow=pypi", cat, Dest{Addr: ip("10.20.0.5"), Port: 443, Name: "pypi.org", Resolved: []string{"pypi.org"}}, want{true, 1, ""}, ReasonRule},
		{"operator pypi mirror over its extra port", "allow=pypi", cat, Dest{Addr: ip("10.20.0.6"), Port: 80, Resolved: []string{"files.pythonhosted.org"}}, want{true, 1, ""}, ReasonRule},
		{"operator mirror by CIDR", "allow=mirror", cat, Dest{Addr: ip("10.20.0.99"), Port: 8080}, want{true, 1, ""}, ReasonRule},
		{"operator mirror CIDR, port outside", "allow=mirror", cat, Dest{Addr: ip("10.20.0.99"), Port: 22}, want{false, 0, ""}, ReasonSpecial},
		{"operator mirror is not 10.20.1.0", "allow=mirror", cat, Dest{Addr: ip("10.20.1.1"), Port: 8080}, want{false, 0, "private"}, ReasonSpecial},
		{"[hosts] name through a built-in", "allow=npm", cat, Dest{Addr: ip("10.20.0.7"), Port: 443, Name: "registry.npmjs.org", Resolved: []string{"registry.npmjs.org"}}, want{true, 1, ""}, ReasonRule},
		{"[hosts] name, other private address", "allow=npm", cat, Dest{Addr: ip("10.20.0.8"), Port: 443, Name: "registry.npmjs.org", Resolved: []string{"registry.npmjs.org"}}, want{false, 1, "private"}, ReasonSpecial},
		{"user CIDR still cannot open the mirror", "allow=10.20.0.0/24", cat, Dest{Addr: ip("10.20.0.99"), Port: 8080}, want{false, 1, ""}, ReasonSpecial},

		// Open.
		{"open allows public TCP", "open", builtin, Dest{Addr: ip(pub), Port: 443}, want{true, 0, "open"}, ReasonOpen},
		{"open blocks private", "open", builtin, Dest{Addr: ip("10.0.0.1"), Port: 443}, want{false, 0, "private"}, ReasonSpecial},
		{"open blocks mapped private", "open", builtin, Dest{Addr: ip("::ffff:192.168.0.1"), Port: 443}, want{false, 0, "private"}, ReasonSpecial},
		{"open blocks metadata", "open", builtin, Dest{Addr: ip("169.254.169.254"), Port: 80}, want{false, 0, "link-local"}, ReasonSpecial},
		{"open blocks loopback", "open", builtin, Dest{Addr: ip("127.0.0.1"), Port: 7420}, want{false, 0, "loopback"}, ReasonSpecial},
		{"open blocks 0.0.0.0", "open", builtin, Dest{Addr: ip("0.0.0.0"), Port: 7420}, want{false, 0, ""}, ReasonSpecial},
		{"open blocks multicast", "open", builtin, Dest{Addr: ip("239.1.1.1"), Port: 7420}, want{false, 0, "multicast"}, ReasonSpecial},
		{"open blocks the node", "open", cat, Dest{Addr: ip("203.0.114.1"), Port: 7420}, want{false, 0, "node"}, ReasonSpecial},
		{"open blocks unique-local IPv6", "open", builtin, Dest{Addr: ip("fd00::1"), Port: 443}, want{false, 0, "private"}, ReasonSpecial},
		{"open refuses UDP", "open", builtin, Dest{Addr: ip(pub), Port: 443, Protocol: UDP}, want{false, 0, ""}, ReasonNoRule},
		{"open with deny", "open,deny=npm", builtin, Dest{Addr: ip(pub), Port: 443, Name: "registry.npmjs.org", Resolved: []string{"registry.npmjs.org"}}, want{false, 1, "deny npm"}, ReasonRule},
		{"open with deny, other names", "open,deny=npm", builtin, Dest{Addr: ip(pub), Port: 443, Name: "pypi.org", Resolved: []string{"pypi.org"}}, want{true, 0, ""}, ReasonOpen},
		{"open does not open the mirror without a rule", "open", cat, Dest{Addr: ip("10.20.0.5"), Port: 443, Name: "pypi.org", Resolved: []string{"pypi.org"}}, want{false, 0, "private"}, ReasonSpecial},
		{"open with the operator's mirror", "open,allow=pypi", cat, Dest{Addr: ip("10.20.0.5"), Port: 443, Name: "pypi.org", Resolved: []string{"pypi.org"}}, want{true, 1, ""}, ReasonRule},

		// Malformed destinations.
		{"invalid address", "allow=0.0.0.0/0", builtin, Dest{Port: 443}, want{false, 0, ""}, ReasonNoRule},
		{"port 0", "allow=0.0.0.0/0", builtin, Dest{Addr: ip(pub), Port: 0}, want{false, 0, ""}, ReasonNoRule},
		{"zoned address", "allow=::/0", builtin, Dest{Addr: ip("fe80::1%eth0"), Port: 80}, want{false, 0, "invalid"}, ReasonSpecial},
		{"malformed SNI", "allow=*.example.com", builtin, Dest{Addr: ip(pub), Port: 443, Name: "a..example.com", Resolved: []string{"a..example.com"}}, want{false, 0, ""}, ReasonNoRule},
		{"SNI with a NUL", "allow=*.example.com", builtin, Dest{Addr: ip(pub), Port: 443, Name: "a.example.com\x00.evil", Resolved: []string{"a.example.com\x00.evil"}}, want{false, 0, ""}, ReasonNoRule},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustFlag(t, tt.cat, tt.flag)
			got := p.Decide(tt.d)
			if got.Allow != tt.want.allow || got.Rule != tt.want.rule || got.Reason != tt.reason || !strings.Contains(got.String(), tt.want.why) {
				t.Errorf("%q: Decide(%+v) = %+v (%q), want allow %v, rule %d, reason %d, saying %q",
					tt.flag, tt.d, got, got, tt.want.allow, tt.want.rule, tt.reason, tt.want.why)
			}
		})
	}
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestAllowName(t *testing.T) {
	cat := mustCatalogue(t)
	tests := []struct {
		flag string
		name string
		want bool
	}{
		{"none", "pypi.org", false},
		{"allow=pypi", "pypi.org", true},
		{"allow=pypi", "PYPI.ORG.", true},
		{"allow=pypi", "files.pythonhosted.org", true},
		{"allow=pypi", "registry.npmjs.org", false},
		{"allow=pypi,deny=npm", "registry.npmjs.org", false},
		{"allow=*.example.com", "example.com", false},
		{"allow=*.example.com", "evilexample.com", false},
		{"allow=*.example.com", "a.example.com", true},
		{"allow=*.example.com,deny=a.example.com", "a.example.com", false},
		{"deny=example.com,allow=example.com:443", "example.com", true},
		{"allow=example.com:443,deny=example.com:443-444", "example.com", true},
		{"allow=example.com:443,deny=example.com:400-500", "example.com", true}, // the narrower allow decides 443
		{"allow=example.com:443,deny=example.com", "example.com", true},
		{"allow=example.com,deny=example.com:1-65535", "example.com", false},
		{"open", "anything.example", true},
		{"open,deny=npm", "registry.npmjs.org", false},
		{"open,deny=registry.npmjs.org:443", "registry.npmjs.org", true}, // other ports stay open
		{"allow=0.0.0.0/0:443", "anything.example", true},
		{"allow=0.0.0.0/0:443,deny=*.example.org", "anything.example.org", false},
		{"allow=dsec-api", "anything.example", false},
		{"allow=pypi", "", false},
		{"allow=pypi", "pypi.org..", false},
		{"allow=mirror", "x.example", true}, // a CIDR service: its addresses may have names
	}
	for _, tt := range tests {
		p := mustFlag(t, cat, tt.flag)
		if got := p.AllowName(tt.name); got != tt.want {
			t.Errorf("%q: AllowName(%q) = %v, want %v", tt.flag, tt.name, got, tt.want)
		}
	}
}

func TestAllowAPI(t *testing.T) {
	cat := Builtin()
	for flag, want := range map[string]bool{
		"allow=dsec-api":           true,
		"allow=pypi,dsec-api":      true,
		"allow=pypi":               false,
		"open":                     false,
		"open,deny=dsec-api":       false,
		"allow=pypi,deny=dsec-api": false,
	} {
		if got := mustFlag(t, cat, flag).AllowAPI(); got != want {
			t.Errorf("%q: AllowAPI() = %v, want %v", flag, got, want)
		}
	}
	// dsec-api opens no address.
	p := mustFlag(t, cat, "allow=dsec-api")
	if d := p.Decide(Dest{Addr: ip("151.101.0.1"), Port: 443}); d.Allow {
		t.Errorf("allow=dsec-api: Decide(public) = %v, want deny", d)
	}
}

func TestCompileErrors(t *testing.T) {
	cat := Builtin()
	tests := []struct {
		spec Spec
		kind error
		want string
	}{
		{Spec{Rules: []Rule{{Action: Allow, Service: "pypi"}, {Action: Allow, Service: "pipy"}}}, errdefs.ErrInvalidArgument, `network rule 2 (allow "pipy"): unknown service`},
		{Spec{Mode: ModeNone, Rules: []Rule{{Action: Allow, Service: "pypi"}}}, errdefs.ErrInvalidArgument, "mode none takes no rules"},
		{Spec{Mode: "closed"}, errdefs.ErrInvalidArgument, "want none, rules or open"},
	}
	for _, tt := range tests {
		_, err := Compile(tt.spec, cat)
		if !errors.Is(err, tt.kind) || err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Compile(%+v) = %v, want %v saying %q", tt.spec, err, tt.kind, tt.want)
		}
	}
	noOpen, err := ParseCatalogue("x.toml", []byte("version = 1\nallow_open = false\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Compile(Spec{Mode: ModeOpen}, noOpen); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Compile(open) where the operator forbids it = %v, want FailedPrecondition", err)
	}
	if _, err := Compile(Spec{Mode: ModeRules, Rules: []Rule{{Action: Allow, Service: "pypi"}}}, noOpen); err != nil {
		t.Errorf("Compile(allow pypi) where open is forbidden = %v", err)
	}
}

func TestSpecial(t *testing.T) {
	for _, s := range []string{"10.1.2.3", "172.31.255.255", "192.168.0.1", "127.0.0.1", "169.254.169.254", "0.0.0.0", "255.255.255.255", "224.0.0.1", "100.64.0.1", "::", "::1", "fe80::1", "fd12::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "2002:a00:1::1", "::10.0.0.1"} {
		if _, ok := Special(ip(s)); !ok {
			t.Errorf("Special(%s) = false, want true", s)
		}
	}
	for _, s := range []string{"8.8.8.8", "151.101.0.223", "172.32.0.1", "2606:4700::1111", "::ffff:8.8.8.8"} {
		if c, ok := Special(ip(s)); ok {
			t.Errorf("Special(%s) = %q, true, want false", s, c)
		}
	}
}

// worstPolicy is a policy at the bounds, every rule matching one name:
// what a hostile sandbox owner could make the resolver and the proxy run.
func worstPolicy(tb testing.TB) *Policy {
	tb.Helper()
	domains := []string{"a.b.c.example.com", "*.b.c.example.com", "*.c.example.com", "*.example.com"}
	var spec Spec
	for i := range MaxRules {
		a := Allow
		if i%2 == 1 {
			a = Deny
		}
		p := uint16(1 + i*200)
		spec.Rules = append(spec.Rules, Rule{Action: a, Domain: domains[i%4], Ports: []PortRange{{p, p + uint16(i%7)*50}}})
	}
	p, err := Compile(spec, Builtin())
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func TestBounds(t *testing.T) {
	p := worstPolicy(t)
	if !p.AllowName("a.b.c.example.com") {
		t.Errorf("worst policy: AllowName = false, want true")
	}
	spec := p.Spec()
	spec.Rules = append(spec.Rules[:255], Rule{Action: Allow, Domain: "x.example.com", Ports: []PortRange{{1, 1}, {3, 3}}})
	if _, err := Compile(spec, Builtin()); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "network rule 256 (allow \"x.example.com:1+3\"): more than 256 port ranges") {
		t.Errorf("Compile(257 port ranges) = %v, want InvalidArgument naming rule 256", err)
	}
}

func BenchmarkAllowNameWorst(b *testing.B) {
	p := worstPolicy(b)
	for b.Loop() {
		p.AllowName("a.b.c.example.com")
	}
}

func BenchmarkDecideWorst(b *testing.B) {
	p := worstPolicy(b)
	d := Dest{Addr: ip("151.101.0.223"), Port: 30001, Name: "a.b.c.example.com", Resolved: []string{"a.b.c.example.com"}}
	for b.Loop() {
		p.Decide(d)
	}
}

func BenchmarkDecidePypi(b *testing.B) {
	p := mustFlag(b, Builtin(), "allow=pypi,github,deny=npm")
	d := Dest{Addr: ip("151.101.0.223"), Port: 443, Name: "files.pythonhosted.org", Resolved: []string{"files.pythonhosted.org"}}
	for b.Loop() {
		p.Decide(d)
	}
}
