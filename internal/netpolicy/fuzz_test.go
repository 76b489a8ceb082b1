package netpolicy

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// checkSpec holds an accepted Spec to what the parsers promise: it
// re-validates unchanged, it round-trips through both written forms, it
// compiles against the built-ins or fails with InvalidArgument, and the
// compiled policy decides without panicking.
func checkSpec(t *testing.T, spec Spec) {
	t.Helper()
	again, err := spec.Normalize()
	if err != nil {
		t.Fatalf("accepted %+v does not re-validate: %v", spec, err)
	}
	if diff := cmp.Diff(spec, again, cmpSpec); diff != "" {
		t.Fatalf("Normalize is not idempotent (-first +again):\n%s", diff)
	}
	flag := FormatNetworkFlag(spec)
	f, err := ParseNetworkFlag(flag)
	if err != nil {
		t.Fatalf("FormatNetworkFlag(%+v) = %q, which does not parse: %v", spec, flag, err)
	}
	if diff := cmp.Diff(spec, f.Spec, cmpSpec); diff != "" {
		t.Fatalf("flag %q round trip (-first +again):\n%s", flag, diff)
	}
	doc := MarshalPolicyJSON(spec)
	j, err := ParsePolicyJSON(doc)
	if err != nil {
		t.Fatalf("MarshalPolicyJSON(%+v) = %s, which does not parse: %v", spec, doc, err)
	}
	if diff := cmp.Diff(spec, j, cmpSpec); diff != "" {
		t.Fatalf("JSON %s round trip (-first +again):\n%s", doc, diff)
	}
	p, err := Compile(spec, Builtin())
	if err != nil {
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("Compile(%+v) = %v, want InvalidArgument or nothing", spec, err)
		}
		return
	}
	for _, d := range []Dest{
		{Addr: netip.MustParseAddr("151.101.0.223"), Port: 443, Name: "pypi.org", Resolved: []string{"pypi.org"}},
		{Addr: netip.MustParseAddr("10.0.0.1"), Port: 53, Protocol: UDP},
		{Addr: netip.MustParseAddr("::ffff:127.0.0.1"), Port: 7420},
		{Addr: netip.MustParseAddr("169.254.169.254"), Port: 80, Resolved: []string{"a.example.com"}},
	} {
		dec := p.Decide(d)
		if dec.Allow {
			if _, special := Special(d.Addr); special {
				t.Fatalf("%q allows the special address %v: %v", flag, d.Addr, dec)
			}
		}
		_ = dec.String()
	}
	_ = p.AllowName("pypi.org")
	_ = p.AllowName("a.example.com")
}

func FuzzParseNetworkFlag(f *testing.F) {
	for _, s := range []string{
		"none", "open", "policy=x.json", "allow=pypi,github,deny=npm", "open,deny=*.example.com:443",
		"allow=10.0.0.0/8:53/udp,[2001:db8::/32]:80+443,192.0.2.7", "allow=[::ffff:10.0.0.0/104]:8000-8100",
		"allow=example.com:0", "allow=*.com", "allow=pypi,deny=pypi", "allow=dsec-api", "deny=a.b:1-65535/tcp",
		"allow=bücher.example", "allow=xn--bcher-kva.example.", "allow=,", "allow=[", "allow=[::]:", "allow=1.2.3.4:5:6",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fl, err := ParseNetworkFlag(s)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("ParseNetworkFlag(%q) = %v, want InvalidArgument", s, err)
			}
			return
		}
		if fl.File != "" {
			return
		}
		checkSpec(t, fl.Spec)
	})
}

func FuzzParsePolicyJSON(f *testing.F) {
	for _, s := range []string{
		`{"version": 1, "mode": "rules", "rules": [{"action": "allow", "service": "pypi"}, {"action": "deny", "domain": "*.example.com", "ports": [443, "8000-8100"]}, {"action": "allow", "cidr": "192.0.2.0/24", "ports": [5000], "protocol": "udp"}]}`,
		`{"mode": "open", "rules": [{"action": "deny", "service": "npm"}]}`,
		`{"rules": [{"action": "allow", "cidr": "::ffff:10.0.0.0/104"}]}`,
		`{"rules": [{"action": "allow", "service": "pypi", "action": "deny"}]}`,
		`{"rules": [{"action": "allow", "domain": "a.com", "ports": [1e3]}]}`,
		`{}`, `[]`, `null`, `{"pypi": true}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := ParsePolicyJSON(data)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("ParsePolicyJSON(%q) = %v, want InvalidArgument", data, err)
			}
			return
		}
		checkSpec(t, spec)
		// The SDK's map form shares the checker and the targets.
		if s, err := ParseServiceMap(data); err == nil {
			checkSpec(t, s)
		}
	})
}

func FuzzLoadCatalogue(f *testing.F) {
	f.Add([]byte(testCatalogue))
	for _, s := range []string{
		"version = 1\nallow_open = false\n[services.git]\ndomains = [\"*.git.corp.example\"]\ncidrs = [\"fd00:1::/64\", \"10.9.0.1\"]\n[resolver]\nupstreams = [\"[fd00::53]:5353\"]\n",
		"version = 1\n[hosts]\n\"A.b\" = [\"10.0.0.1\"]\n\"a.b.\" = [\"10.0.0.2\"]",
		"version = 2", "", "version = 1\n[services.dsec-api]\ndomains = [\"a.com\"]",
		"version = 1\n[services.x]\ndomains = [\"a.com\"]\nports = [1.5, \"1-2\", 3]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCatalogue("fuzz.toml", data)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("ParseCatalogue(%q) = %v, want InvalidArgument", data, err)
			}
			return
		}
		// Every entry re-validates, and a policy naming it compiles and
		// decides.
		var rules []Rule
		for _, name := range c.Services() {
			s, _ := c.Service(name)
			for _, d := range s.Domains {
				if n, err := normalizeDomainRule(d); err != nil || n != d {
					t.Fatalf("entry %s domain %q normalizes to %q, %v", name, d, n, err)
				}
			}
			if _, err := checkPorts(s.Ports); err != nil {
				t.Fatalf("entry %s ports %v: %v", name, s.Ports, err)
			}
			rules = append(rules, Rule{Action: Allow, Service: name})
		}
		for n, addrs := range c.Hosts {
			if nn, err := NormalizeName(n); err != nil || nn != n || len(addrs) == 0 {
				t.Fatalf("hosts %q = %v: %q, %v", n, addrs, nn, err)
			}
		}
		p, err := Compile(Spec{Rules: rules}, c)
		if err != nil {
			t.Fatalf("Compile(allow every service) = %v", err)
		}
		for n, addrs := range c.Hosts {
			_ = p.Decide(Dest{Addr: addrs[0], Port: 443, Name: n, Resolved: []string{n}})
			_ = p.AllowName(n)
		}
	})
}
