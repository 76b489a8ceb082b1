package netpolicy

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestBuiltin(t *testing.T) {
	c := Builtin()
	want := []string{"apt", "dockerhub", "dsec-api", "github", "goproxy", "huggingface", "npm", "pypi"}
	if diff := cmp.Diff(want, c.Services()); diff != "" {
		t.Errorf("Builtin().Services() (-want +got):\n%s", diff)
	}
	for _, name := range want {
		s, _ := c.Service(name)
		if s.Operator {
			t.Errorf("built-in %s is marked Operator", name)
		}
		if name == ServiceAPI {
			if !s.API || len(s.Domains)+len(s.CIDRs) != 0 {
				t.Errorf("%s = %+v, want the API and no address", name, s)
			}
			continue
		}
		for _, d := range s.Domains {
			if n, err := normalizeDomainRule(d); err != nil || n != d {
				t.Errorf("built-in %s domain %q: normalizes to %q, %v", name, d, n, err)
			}
		}
		if len(s.Ports) == 0 {
			t.Errorf("built-in %s has no ports", name)
		}
	}
	pypi, _ := c.Service("pypi")
	if !cmp.Equal(pypi.Domains, []string{"pypi.org", "files.pythonhosted.org"}) || !cmp.Equal(pypi.Ports, []PortRange{{443, 443}}) {
		t.Errorf("pypi = %+v", pypi)
	}
	// Service returns a copy, and Builtin a fresh value: changing one does
	// not change another.
	pypi.Domains[0] = "evil.com"
	if p2, _ := c.Service("pypi"); p2.Domains[0] != "pypi.org" {
		t.Errorf("Service shares its entry: pypi.Domains[0] = %q", p2.Domains[0])
	}
	if p2, _ := Builtin().Service("pypi"); p2.Domains[0] != "pypi.org" {
		t.Errorf("Builtin shares its entries: pypi.Domains[0] = %q", p2.Domains[0])
	}
}

func TestParseCatalogue(t *testing.T) {
	c := mustCatalogue(t)
	pypi, _ := c.Service("pypi")
	if !pypi.Operator || !cmp.Equal(pypi.Ports, []PortRange{{80, 80}, {443, 443}}) {
		t.Errorf("overridden pypi = %+v, want operator's with ports 80, 443", pypi)
	}
	mirror, ok := c.Service("mirror")
	if !ok || !cmp.Equal(mirror.CIDRs, []netip.Prefix{netip.MustParsePrefix("10.20.0.0/24")}, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })) {
		t.Errorf("mirror = %+v, %v", mirror, ok)
	}
	if got := c.Hosts["pypi.org"]; !cmp.Equal(got, []netip.Addr{netip.MustParseAddr("10.20.0.5")}, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })) {
		t.Errorf("Hosts[pypi.org] = %v", got)
	}
	if !c.Internal("PYPI.org.") || !c.Internal("registry.npmjs.org") || c.Internal("example.com") || Builtin().Internal("pypi.org") {
		t.Errorf("Internal: operator and [hosts] names are internal, others not")
	}
	if npm, _ := c.Service("npm"); npm.Operator {
		t.Errorf("npm, not in the file, became an operator entry")
	}

	full := `
version = 1
allow_open = false
[services.internal-git]
domains = ["git.corp.example", "*.git.corp.example"]
cidrs = ["fd00:1::/64", "10.9.0.1"]
[resolver]
upstreams = ["10.0.0.53:53", "[fd00::53]:5353"]
[hosts]
"git.corp.example" = ["10.9.0.1", "::ffff:10.9.0.2"]
`
	c, err := ParseCatalogue("full.toml", []byte(full))
	if err != nil {
		t.Fatalf("ParseCatalogue(full) = %v", err)
	}
	if !c.NoOpen || len(c.Upstreams) != 2 || c.Hosts["git.corp.example"][1] != netip.MustParseAddr("10.9.0.2") {
		t.Errorf("ParseCatalogue(full) = %+v", c)
	}
	g, _ := c.Service("internal-git")
	if len(g.Ports) != 0 || len(g.CIDRs) != 2 || g.CIDRs[1] != netip.MustParsePrefix("10.9.0.1/32") {
		t.Errorf("internal-git = %+v", g)
	}
	p, err := Compile(Spec{Rules: []Rule{{Action: Allow, Service: "internal-git"}}}, c)
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Decide(Dest{Addr: netip.MustParseAddr("10.9.0.1"), Port: 2222}); !d.Allow {
		t.Errorf("internal-git (no ports: every port) on 10.9.0.1:2222 = %v, want allowed", d)
	}
}

func TestParseCatalogueErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{``, "no version: start the file with version = 1"},
		{`version = 2`, "version 2: this dsec reads version 1"},
		{`version = "1"`, "network config f.toml: "},
		{"version = 1\nversion = 1", "line 2"},
		{"version = 1\n[services.pypi\n", "line 3: expected"},
		{"version = 1\nfoo = 1", `unknown key "foo"`},
		{"version = 1\n[services.pypi]\ndomain = [\"a.com\"]", `unknown key "services.pypi.domain"`},
		{"version = 1\n[resolver]\nupstream = []", `unknown key "resolver.upstream"`},
		{"version = 1\n[services.Bad_Name]\ndomains = [\"a.com\"]", `[services.Bad_Name]: service name`},
		{"version = 1\n[services.dsec-api]\ndomains = [\"a.com\"]", "cannot be redefined"},
		{"version = 1\n[services.x]\n", "[services.x]: give domains or cidrs"},
		{"version = 1\n[services.open]\ndomains = [\"a.com\"]", "[services.open]: open is a word of the --network value"},
		{`version = "1"`, `line 1 (last key "version"): incompatible types`},
		{"version = 1\n[services.x]\ndomains = [\"a..com\"]", "services.x.domains[0]: name"},
		{"version = 1\n[services.x]\ndomains = [\"*.com\"]", "services.x.domains[0]: domain \"*.com\": a domain has at least two labels"},
		{"version = 1\n[services.x]\ncidrs = [\"10.0.0.0/40\"]", "services.x.cidrs[0]: CIDR"},
		{"version = 1\n[services.x]\ncidrs = [\"a.com\"]", "services.x.cidrs[0]: address"},
		{"version = 1\n[services.x]\ndomains = [\"a.com\"]\nports = [0]", "services.x.ports[0]: port 0 is out of range"},
		{"version = 1\n[services.x]\ndomains = [\"a.com\"]\nports = [\"9-1\"]", "services.x.ports[0]: port range"},
		{"version = 1\n[services.x]\ndomains = [\"a.com\"]\nports = [1.5]", "services.x.ports[0]: want a port number"},
		{"version = 1\n[resolver]\nupstreams = [\"dns.example:53\"]", `resolver.upstreams[0] = "dns.example:53": want ADDRESS:PORT`},
		{"version = 1\n[resolver]\nupstreams = [\"10.0.0.1\"]", `resolver.upstreams[0]`},
		{"version = 1\n[resolver]\nupstreams = [\"10.0.0.1:0\"]", `resolver.upstreams[0]`},
		{"version = 1\n[hosts]\n\"a..b\" = [\"10.0.0.1\"]", `hosts."a..b": name`},
		{"version = 1\n[hosts]\n\"a.b\" = []", `hosts."a.b": give 1 to 16 addresses`},
		{"version = 1\n[hosts]\n\"a.b\" = [\"a.b\"]", `hosts."a.b"[0] = "a.b": not an IP address`},
		{"version = 1\n[hosts]\n\"A.b\" = [\"10.0.0.1\"]\n\"a.b.\" = [\"10.0.0.2\"]", `the name is given twice`},
		{"version = 1\n" + strings.Repeat("#", MaxDocBytes), "larger than"},
	}
	for _, tt := range tests {
		_, err := ParseCatalogue("f.toml", []byte(tt.in))
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "network config f.toml: ") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseCatalogue(%.60q) = %v, want InvalidArgument naming the file and saying %q", tt.in, err, tt.want)
		}
	}
}

func TestLoadCatalogue(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "network.toml")
	if err := os.WriteFile(path, []byte(testCatalogue), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadCatalogue(path)
	if err != nil {
		t.Fatalf("LoadCatalogue = %v", err)
	}
	if _, ok := c.Service("mirror"); !ok {
		t.Errorf("LoadCatalogue lost the mirror")
	}
	if _, err := LoadCatalogue(filepath.Join(dir, "missing.toml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadCatalogue(missing) = %v, want not exist", err)
	}
	big := filepath.Join(dir, "big.toml")
	if err := os.WriteFile(big, []byte("version = 1\n"+strings.Repeat("#", MaxDocBytes+10)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCatalogue(big); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("LoadCatalogue(big) = %v, want too large", err)
	}
}
