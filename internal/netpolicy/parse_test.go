package netpolicy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/dsecproject/dsec/internal/errdefs"
)

var cmpSpec = cmp.Options{cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }), cmpopts.EquateEmpty()}

func TestParseNetworkFlag(t *testing.T) {
	tests := []struct {
		in   string
		want NetworkFlag
	}{
		{"none", NetworkFlag{Spec: Spec{Mode: ModeNone}}},
		{"open", NetworkFlag{Spec: Spec{Mode: ModeOpen}}},
		{"policy=p.json", NetworkFlag{File: "p.json"}},
		{"policy=dir/a=b,c.json", NetworkFlag{File: "dir/a=b,c.json"}},
		{"allow=pypi", NetworkFlag{Spec: Spec{Mode: ModeRules, Rules: []Rule{{Action: Allow, Service: "pypi", Protocol: TCP}}}}},
		{"allow=pypi,github,deny=npm", NetworkFlag{Spec: Spec{Mode: ModeRules, Rules: []Rule{
			{Action: Allow, Service: "pypi", Protocol: TCP},
			{Action: Allow, Service: "github", Protocol: TCP},
			{Action: Deny, Service: "npm", Protocol: TCP},
		}}}},
		{"open,deny=*.Example.COM.:443", NetworkFlag{Spec: Spec{Mode: ModeOpen, Rules: []Rule{
			{Action: Deny, Domain: "*.example.com", Ports: []PortRange{{443, 443}}, Protocol: TCP},
		}}}},
		{"allow=10.1.2.3/8:53/udp,192.0.2.7,[2001:db8::/32]:80+443,2001:db8::1", NetworkFlag{Spec: Spec{Mode: ModeRules, Rules: []Rule{
			{Action: Allow, CIDR: netip.MustParsePrefix("10.0.0.0/8"), Ports: []PortRange{{53, 53}}, Protocol: UDP},
			{Action: Allow, CIDR: netip.MustParsePrefix("192.0.2.7/32"), Protocol: TCP},
			{Action: Allow, CIDR: netip.MustParsePrefix("2001:db8::/32"), Ports: []PortRange{{80, 80}, {443, 443}}, Protocol: TCP},
			{Action: Allow, CIDR: netip.MustParsePrefix("2001:db8::1/128"), Protocol: TCP},
		}}}},
		{"allow=[::ffff:10.0.0.0/104]:8000-8100", NetworkFlag{Spec: Spec{Mode: ModeRules, Rules: []Rule{
			{Action: Allow, CIDR: netip.MustParsePrefix("10.0.0.0/8"), Ports: []PortRange{{8000, 8100}}, Protocol: TCP},
		}}}},
		{"deny=npm", NetworkFlag{Spec: Spec{Mode: ModeRules, Rules: []Rule{{Action: Deny, Service: "npm", Protocol: TCP}}}}},
		{"allow=pypi,pypi", NetworkFlag{Spec: Spec{Mode: ModeRules, Rules: []Rule{{Action: Allow, Service: "pypi", Protocol: TCP}, {Action: Allow, Service: "pypi", Protocol: TCP}}}}},
		{"allow=xn--bcher-kva.example", NetworkFlag{Spec: Spec{Mode: ModeRules, Rules: []Rule{{Action: Allow, Domain: "xn--bcher-kva.example", Protocol: TCP}}}}},
	}
	for _, tt := range tests {
		got, err := ParseNetworkFlag(tt.in)
		if err != nil {
			t.Errorf("ParseNetworkFlag(%q) = %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got, cmpSpec); diff != "" {
			t.Errorf("ParseNetworkFlag(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestParseNetworkFlagErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "--network is empty"},
		{"pypi", `"pypi": start the rules with allow=`},
		{"allow=", `network rule 1 (allow ""): empty target`},
		{"allow=pypi,,npm", `network rule 2 (allow ""): empty target`},
		{"permit=pypi", `want allow=TARGET or deny=TARGET`},
		{"allow=pypi,deny=pypi", "network rules 1 (allow pypi) and 2 (deny pypi) both allow and deny the same target"},
		{"allow=example.com:443,deny=EXAMPLE.com.:443", "network rules 1 (allow example.com:443) and 2 (deny example.com:443) both allow"},
		{"allow=example.com:0", `network rule 1 (allow "example.com:0"): port 0 is out of range`},
		{"allow=example.com:65536", `port 65536 is out of range`},
		{"allow=example.com:99999999999", `is not a number from 1 to 65535`},
		{"allow=example.com:-1", `is not a number`},
		{"allow=example.com:200-100", `runs backwards`},
		{"allow=example.com:", `a port after the colon`},
		{"allow=10.0.0.0/33", `CIDR "10.0.0.0/33" is malformed`},
		{"allow=10.0.0/8", `CIDR "10.0.0/8" is malformed`},
		{"allow=300.1.1.1", `address "300.1.1.1" is malformed`},
		{"allow=fe80::1%eth0/64", `is malformed`},
		{"allow=[10.0.0.0/8]:80", `brackets are for IPv6`},
		{"allow=[2001:db8::/32", `missing ]`},
		{"allow=example.com/udp", `UDP is allowed only to a CIDR`},
		{"allow=pypi/udp", `UDP is allowed only to a CIDR`},
		{"allow=*.com", `a domain has at least two labels`},
		{"allow=*", `network rule 1 (allow "*")`},
		{"allow=a*.example.com", `a wildcard is only a whole first label`},
		{"allow=*.*.example.com", `a wildcard is only a whole first label`},
		{"allow=example..com", `labels are 1 to 63 characters`},
		{"allow=example.com..", `labels are 1 to 63`},
		{"allow=-a.example.com", `starts or ends with a hyphen`},
		{"allow=ex_ample.com", `holds '_'`},
		{"allow=bücher.example", `not ASCII: write it in punycode`},
		{"allow=example.123", `ends in a number`},
		{"allow=" + strings.Repeat("a", 64) + ".com", `labels are 1 to 63`},
		{"allow=Pypi", `service name "Pypi"`},
		{"allow=dsec-api:443", `dsec-api takes no ports`},
		{"none,allow=pypi", `"none": start the rules with allow=`},
		{"policy=", "policy= needs a file"},
		{"allow=" + strings.Repeat("x,", 300), "more than 256 rules"},
		{strings.Repeat("a", MaxFlagBytes+1), "longer than"},
	}
	for _, tt := range tests {
		_, err := ParseNetworkFlag(tt.in)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseNetworkFlag(%.60q) = %v, want InvalidArgument saying %q", tt.in, err, tt.want)
		}
	}
}

func TestFormatNetworkFlagRoundTrip(t *testing.T) {
	for _, in := range []string{"none", "open", "allow=pypi,github,deny=npm", "open,deny=*.example.com:443", "allow=10.0.0.0/8:53/udp,[2001:db8::/32]:80+443,192.0.2.7"} {
		f, err := ParseNetworkFlag(in)
		if err != nil {
			t.Fatalf("ParseNetworkFlag(%q) = %v", in, err)
		}
		out := FormatNetworkFlag(f.Spec)
		g, err := ParseNetworkFlag(out)
		if err != nil {
			t.Fatalf("ParseNetworkFlag(FormatNetworkFlag(%q) = %q) = %v", in, out, err)
		}
		if diff := cmp.Diff(f.Spec, g.Spec, cmpSpec); diff != "" {
			t.Errorf("%q -> %q (-first +again):\n%s", in, out, diff)
		}
	}
}

func TestParseServiceMap(t *testing.T) {
	got, err := ParseServiceMap([]byte(`{"pypi": true, "npm": false}`))
	if err != nil {
		t.Fatalf("ParseServiceMap = %v", err)
	}
	want := Spec{Mode: ModeRules, Rules: []Rule{{Action: Allow, Service: "pypi", Protocol: TCP}, {Action: Deny, Service: "npm", Protocol: TCP}}}
	if diff := cmp.Diff(want, got, cmpSpec); diff != "" {
		t.Errorf("ParseServiceMap (-want +got):\n%s", diff)
	}
	p, err := Compile(got, Builtin())
	if err != nil {
		t.Fatal(err)
	}
	if !p.AllowName("pypi.org") || p.AllowName("registry.npmjs.org") {
		t.Errorf(`{"pypi": true, "npm": false}: AllowName(pypi.org), AllowName(registry.npmjs.org) = %v, %v, want true, false`, p.AllowName("pypi.org"), p.AllowName("registry.npmjs.org"))
	}
	if got, err := ParseServiceMap([]byte(` {} `)); err != nil || got.Mode != ModeNone {
		t.Errorf("ParseServiceMap({}) = %+v, %v, want mode none", got, err)
	}

	for in, want := range map[string]string{
		``:                                  "network_rules is empty",
		`[]`:                                "want an object",
		`"pypi"`:                            "want an object",
		`{"pypi": 1}`:                       `network_rules["pypi"]: want true (allow) or false (deny)`,
		`{"pypi": "true"}`:                  `want true (allow) or false`,
		`{"pypi": null}`:                    `want true (allow) or false`,
		`{"pypi": true, "pypi": false}`:     `key "pypi" is given twice`,
		`{"pypi": true} {}`:                 "more than one JSON value",
		`{"pypi": true`:                     "not valid JSON",
		`{"pipy": true}`:                    "", // syntax is fine; Compile names the service
		`{"Pypi": true}`:                    `network rule 1 (allow "Pypi"): service name`,
		`{"pypi": true, "example..com": 0}`: "want true",
		`{"a": {"b": {"c": 1}}}`:            "want true",
	} {
		_, err := ParseServiceMap([]byte(in))
		if want == "" {
			if err != nil {
				t.Errorf("ParseServiceMap(%q) = %v, want no error", in, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseServiceMap(%q) = %v, want InvalidArgument saying %q", in, err, want)
		}
	}
	spec, _ := ParseServiceMap([]byte(`{"pipy": true}`))
	if _, err := Compile(spec, Builtin()); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `network rule 1 (allow "pipy"): unknown service: the services are apt, dockerhub, dsec-api, github, goproxy, huggingface, npm, pypi`) {
		t.Errorf(`Compile({"pipy": true}) = %v, want the unknown service named`, err)
	}
}

func TestParsePolicyJSON(t *testing.T) {
	in := `{"version": 1, "mode": "rules", "rules": [
		{"action": "allow", "service": "pypi"},
		{"action": "deny", "domain": "*.Example.com", "ports": [443, "8000-8100"]},
		{"action": "allow", "cidr": "192.0.2.0/24", "ports": [5000], "protocol": "udp"}]}`
	got, err := ParsePolicyJSON([]byte(in))
	if err != nil {
		t.Fatalf("ParsePolicyJSON = %v", err)
	}
	want := Spec{Mode: ModeRules, Rules: []Rule{
		{Action: Allow, Service: "pypi", Protocol: TCP},
		{Action: Deny, Domain: "*.example.com", Ports: []PortRange{{443, 443}, {8000, 8100}}, Protocol: TCP},
		{Action: Allow, CIDR: netip.MustParsePrefix("192.0.2.0/24"), Ports: []PortRange{{5000, 5000}}, Protocol: UDP},
	}}
	if diff := cmp.Diff(want, got, cmpSpec); diff != "" {
		t.Errorf("ParsePolicyJSON (-want +got):\n%s", diff)
	}
	again, err := ParsePolicyJSON(MarshalPolicyJSON(got))
	if err != nil {
		t.Fatalf("ParsePolicyJSON(MarshalPolicyJSON) = %v; %s", err, MarshalPolicyJSON(got))
	}
	if diff := cmp.Diff(got, again, cmpSpec); diff != "" {
		t.Errorf("round trip (-first +again):\n%s", diff)
	}

	for in, want := range map[string]string{
		`{"rules": [{"action": "allow", "service": "pypi", "extra": 1}]}`:       `unknown field "extra"`,
		`{"rules": [{"action": "allow", "service": "pypi", "action": "deny"}]}`: `key "action" is given twice`,
		`{"version": 2}`: "version 2",
		`{"mode": "open", "rules": [], "mode": "none"}`:                                               `key "mode" is given twice`,
		`{"rules": [{"action": "permit", "service": "pypi"}]}`:                                        `network rule 1 (permit "pypi"): action "permit"`,
		`{"rules": [{"action": "allow"}]}`:                                                            `network rule 1 (allow ""): a rule names exactly one`,
		`{"rules": [{"action": "allow", "service": "pypi", "domain": "pypi.org"}]}`:                   "exactly one",
		`{"rules": [{"action": "allow", "cidr": "10.0.0.0/99"}]}`:                                     `network rule 1 (allow "10.0.0.0/99"): CIDR`,
		`{"rules": [{"action": "allow", "domain": "a.com", "ports": [0]}]}`:                           "port 0 is out of range",
		`{"rules": [{"action": "allow", "domain": "a.com", "ports": [65536]}]}`:                       "port 65536 is out of range",
		`{"rules": [{"action": "allow", "domain": "a.com", "ports": [1.5]}]}`:                         "want a number",
		`{"rules": [{"action": "allow", "domain": "a.com", "ports": [-1]}]}`:                          "want a number",
		`{"rules": [{"action": "allow", "domain": "a.com", "ports": ["2-1"]}]}`:                       "runs backwards",
		`{"rules": [{"action": "allow", "domain": "a.com", "protocol": "sctp"}]}`:                     `protocol "sctp"`,
		`{"rules": [{"action": "allow", "domain": "a.com", "protocol": "udp"}]}`:                      "UDP is allowed only to a CIDR",
		`{"rules": [{"action": "allow", "domain": "a.com"}, {"action": "deny", "domain": "A.com."}]}`: "network rules 1 (allow a.com) and 2 (deny a.com)",
		`{"mode": "none", "rules": [{"action": "allow", "service": "pypi"}]}`:                         "mode none takes no rules",
		`[1]`: "an array is not allowed at the top",
		`{"rules": [{"action": "allow", "domain": "a.com", "ports": "443"}]}`:                `field "rules.ports": a string is not allowed there`,
		`{"rules": [{"action": 1, "domain": "a.com"}]}`:                                      `field "rules.action": a number is not allowed there`,
		`{"rules": [` + strings.Repeat(`{"action":"allow","service":"pypi"},`, 300) + `{}]}`: "at most 256",
		strings.Repeat("[", 40) + strings.Repeat("]", 40):                                    "nested deeper",
		`{"rules": []} trailing`: "",
	} {
		_, err := ParsePolicyJSON([]byte(in))
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePolicyJSON(%.70q) = %v, want InvalidArgument saying %q", in, err, want)
		}
	}
}
