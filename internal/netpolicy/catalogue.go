package netpolicy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/BurntSushi/toml"
)

// Service is an entry of the catalogue: what a rule naming it opens.
type Service struct {
	Name string
	// Domains are exact names or "*.suffix" wildcards, normalized.
	Domains []string
	// CIDRs are networks the service is reached at directly.
	CIDRs []netip.Prefix
	// Ports are the ports the service is reached on; empty means every
	// port.
	Ports []PortRange
	// Operator is true for an entry of the operator's file: only such an
	// entry may reach private and other special addresses.
	Operator bool
	// API is true for dsec-api, which the proxy handles itself.
	API bool
}

// Catalogue is the set of services rules may name, with the node
// resolver's settings. The zero value is not usable; start from Builtin or
// ParseCatalogue. A Catalogue is not changed once policies are compiled
// against it.
type Catalogue struct {
	services map[string]*Service
	// Upstreams are the resolvers (host:port) the node resolver forwards
	// to; empty means the host's own (resolv.conf).
	Upstreams []string
	// Hosts maps names to the addresses the node resolver answers for
	// them, without asking upstream. A name here is internal: its
	// addresses, even private ones, are reachable by any rule allowing the
	// name.
	Hosts map[string][]netip.Addr
	// NoOpen is true when the operator forbids mode open.
	NoOpen bool
	// Local lists the node's own addresses and its sandboxes' networks,
	// which are blocked like private addresses. The keeper sets it before
	// compiling policies.
	Local []netip.Prefix
}

// builtins are the services every node knows, with the public domains
// each really uses (redirect targets included). Keep docs/network.md in
// step.
var builtins = []Service{
	// pip: the simple index and the files it links to.
	{Name: "pypi", Domains: []string{"pypi.org", "files.pythonhosted.org"}, Ports: []PortRange{{443, 443}}},
	// npm: the registry serves metadata and tarballs from one host.
	{Name: "npm", Domains: []string{"registry.npmjs.org"}, Ports: []PortRange{{443, 443}}},
	// git over HTTPS and SSH, the API, raw files, archives and release
	// assets (objects.githubusercontent.com and friends).
	{Name: "github", Domains: []string{"github.com", "*.github.com", "*.githubusercontent.com"}, Ports: []PortRange{{22, 22}, {443, 443}}},
	// The Go module proxy and checksum database; the proxy redirects some
	// module zips to Google Cloud Storage.
	{Name: "goproxy", Domains: []string{"proxy.golang.org", "sum.golang.org", "storage.googleapis.com"}, Ports: []PortRange{{443, 443}}},
	// Debian's and Ubuntu's archives; apt speaks plain HTTP by default.
	{Name: "apt", Domains: []string{
		"deb.debian.org", "security.debian.org",
		"archive.ubuntu.com", "*.archive.ubuntu.com", "security.ubuntu.com", "ports.ubuntu.com",
	}, Ports: []PortRange{{80, 80}, {443, 443}}},
	// The Hub and its LFS and Xet content hosts.
	{Name: "huggingface", Domains: []string{"huggingface.co", "*.huggingface.co", "*.hf.co"}, Ports: []PortRange{{443, 443}}},
	// The registry, its token service and the blob CDNs.
	{Name: "dockerhub", Domains: []string{
		"docker.io", "index.docker.io", "registry-1.docker.io", "auth.docker.io",
		"production.cloudflare.docker.com",
		"docker-images-prod.6aa30f8b08e16409b46e0173d6de2f56.r2.cloudflarestorage.com",
	}, Ports: []PortRange{{443, 443}}},
	{Name: ServiceAPI, API: true},
}

// Builtin returns the catalogue of the built-in services alone.
func Builtin() *Catalogue {
	c := &Catalogue{services: make(map[string]*Service, len(builtins))}
	for _, s := range builtins {
		s.Domains = slices.Clone(s.Domains)
		s.CIDRs = slices.Clone(s.CIDRs)
		s.Ports = slices.Clone(s.Ports)
		c.services[s.Name] = &s
	}
	return c
}

// Service returns a copy of the entry named name.
func (c *Catalogue) Service(name string) (Service, bool) {
	s, ok := c.services[name]
	if !ok {
		return Service{}, false
	}
	out := *s
	out.Domains = slices.Clone(s.Domains)
	out.CIDRs = slices.Clone(s.CIDRs)
	out.Ports = slices.Clone(s.Ports)
	return out, true
}

// Services returns the names of the services, sorted.
func (c *Catalogue) Services() []string {
	names := make([]string, 0, len(c.services))
	for n := range c.services {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Internal reports whether the operator says name is internal: its
// addresses may be private. The resolver uses it against DNS rebinding.
func (c *Catalogue) Internal(name string) bool {
	n, err := NormalizeName(name)
	if err != nil {
		return false
	}
	if _, ok := c.Hosts[n]; ok {
		return true
	}
	for _, s := range c.services {
		if !s.Operator {
			continue
		}
		for _, d := range s.Domains {
			if _, _, ok := domainMatch(d, n); ok {
				return true
			}
		}
	}
	return false
}

// fileCatalogue is the operator's file as TOML decodes it.
type fileCatalogue struct {
	Version   *int                   `toml:"version"`
	AllowOpen *bool                  `toml:"allow_open"`
	Services  map[string]fileService `toml:"services"`
	Resolver  struct {
		Upstreams []string `toml:"upstreams"`
	} `toml:"resolver"`
	Hosts map[string][]string `toml:"hosts"`
}

type fileService struct {
	Domains []string `toml:"domains"`
	CIDRs   []string `toml:"cidrs"`
	Ports   []any    `toml:"ports"`
}

// LoadCatalogue reads the operator's network config file (dsec up
// --network-config) and returns the built-in catalogue with its entries
// applied.
func LoadCatalogue(path string) (*Catalogue, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("network config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxDocBytes+1))
	if err != nil {
		return nil, fmt.Errorf("network config %s: %w", path, err)
	}
	return ParseCatalogue(path, data)
}

// ParseCatalogue parses the operator's file; name is what errors call it.
//
// The file is TOML:
//
//	version = 1             # required
//	allow_open = true       # may sandboxes ask for mode open (default true)
//	[services.NAME]         # a new service, or one replacing a built-in
//	domains = ["mirror.internal", "*.mirror.internal"]
//	cidrs   = ["10.20.0.0/24"]
//	ports   = [443, "8000-8100"]
//	[resolver]
//	upstreams = ["10.0.0.53:53"]
//	[hosts]
//	"pypi.org" = ["10.20.0.5"]
//
// Unknown keys are errors.
func ParseCatalogue(name string, data []byte) (*Catalogue, error) {
	bad := func(format string, args ...any) error {
		return invalid("network config %s: "+format, append([]any{name}, args...)...)
	}
	if len(data) > MaxDocBytes {
		return nil, bad("larger than %d bytes", MaxDocBytes)
	}
	var fc fileCatalogue
	md, derr := toml.Decode(string(data), &fc)
	if derr != nil {
		var pe toml.ParseError
		if errors.As(derr, &pe) {
			return nil, bad("line %d: %s", pe.Position.Line, pe.Message)
		}
		return nil, bad("%s", tomlMessage(derr.Error()))
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, bad("unknown key %q: the keys are version, allow_open, services.NAME.{domains,cidrs,ports}, resolver.upstreams and hosts", und[0].String())
	}
	if fc.Version == nil {
		return nil, bad("no version: start the file with version = 1")
	}
	if *fc.Version != 1 {
		return nil, bad("version %d: this dsec reads version 1", *fc.Version)
	}
	c := Builtin()
	if fc.AllowOpen != nil {
		c.NoOpen = !*fc.AllowOpen
	}
	if len(fc.Services) > MaxServices {
		return nil, bad("%d services: at most %d", len(fc.Services), MaxServices)
	}
	for _, sn := range sortedKeys(fc.Services) {
		fs := fc.Services[sn]
		key := "services." + sn
		if err := checkServiceName(sn); err != nil {
			return nil, bad("[%s]: %s", key, err.Error())
		}
		switch sn {
		case string(Allow), string(Deny), string(ModeNone), string(ModeOpen), "policy":
			return nil, bad("[%s]: %s is a word of the --network value: name the service otherwise", key, sn)
		}
		if sn == ServiceAPI {
			return nil, bad("[%s]: %s is the platform's own API and cannot be redefined", key, ServiceAPI)
		}
		s := &Service{Name: sn, Operator: true}
		if len(fs.Domains) > MaxDomains || len(fs.CIDRs) > MaxCIDRs {
			return nil, bad("[%s]: at most %d domains and %d cidrs", key, MaxDomains, MaxCIDRs)
		}
		for i, d := range fs.Domains {
			n, err := normalizeDomainRule(d)
			if err != nil {
				return nil, bad("%s.domains[%d]: %s", key, i, err.Error())
			}
			s.Domains = append(s.Domains, n)
		}
		for i, v := range fs.CIDRs {
			p, err := parseCIDR(v)
			if err != nil {
				return nil, bad("%s.cidrs[%d]: %s", key, i, err.Error())
			}
			s.CIDRs = append(s.CIDRs, p)
		}
		if len(s.Domains) == 0 && len(s.CIDRs) == 0 {
			return nil, bad("[%s]: give domains or cidrs", key)
		}
		if len(fs.Ports) > MaxPorts {
			return nil, bad("%s.ports: at most %d", key, MaxPorts)
		}
		for i, v := range fs.Ports {
			pr, err := portValue(v)
			if err != nil {
				return nil, bad("%s.ports[%d]: %s", key, i, err.Error())
			}
			s.Ports = append(s.Ports, pr)
		}
		s.Ports, _ = checkPorts(s.Ports)
		s.Domains = slices.Compact(slices.Sorted(slices.Values(s.Domains)))
		c.services[sn] = s
	}
	if len(fc.Resolver.Upstreams) > MaxUpstream {
		return nil, bad("resolver.upstreams: at most %d", MaxUpstream)
	}
	for i, u := range fc.Resolver.Upstreams {
		host, port, err := net.SplitHostPort(u)
		if err == nil {
			var a netip.Addr
			if a, err = netip.ParseAddr(host); err == nil && a.Zone() == "" {
				_, err = parsePort(port)
			} else {
				err = errors.New("not an address")
			}
		}
		if err != nil {
			return nil, bad("resolver.upstreams[%d] = %.80q: want ADDRESS:PORT, e.g. 10.0.0.53:53", i, u)
		}
		c.Upstreams = append(c.Upstreams, u)
	}
	if len(fc.Hosts) > MaxHosts {
		return nil, bad("[hosts]: at most %d names", MaxHosts)
	}
	for _, hn := range sortedKeys(fc.Hosts) {
		addrs := fc.Hosts[hn]
		n, err := NormalizeName(hn)
		if err != nil {
			return nil, bad("hosts.%q: %s", hn, err.Error())
		}
		if len(addrs) == 0 || len(addrs) > MaxHostAddr {
			return nil, bad("hosts.%q: give 1 to %d addresses", hn, MaxHostAddr)
		}
		if c.Hosts == nil {
			c.Hosts = make(map[string][]netip.Addr)
		}
		if _, dup := c.Hosts[n]; dup {
			return nil, bad("hosts.%q: the name is given twice", hn)
		}
		for i, v := range addrs {
			a, err := netip.ParseAddr(v)
			if err != nil || a.Zone() != "" {
				return nil, bad("hosts.%q[%d] = %.80q: not an IP address", hn, i, v)
			}
			c.Hosts[n] = append(c.Hosts[n], a.Unmap())
		}
	}
	return c, nil
}

// portValue reads a port of the TOML file: 443 or "8000-8100".
func portValue(v any) (PortRange, error) {
	switch v := v.(type) {
	case int64:
		if v < 1 || v > 65535 {
			return PortRange{}, invalid("port %d is out of range: ports run from 1 to 65535", v)
		}
		return PortRange{uint16(v), uint16(v)}, nil
	case string:
		return ParsePortRange(v)
	default:
		return PortRange{}, invalid("want a port number or a \"LOW-HIGH\" string")
	}
}

// tomlMessage keeps the first line of the decoder's message: its own
// words on the file's text, with no host path in them.
func tomlMessage(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	s = strings.TrimPrefix(s, "toml: ")
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f || r == utf8.RuneError {
			return '?'
		}
		return r
	}, s)
	return clip(s, 200)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
