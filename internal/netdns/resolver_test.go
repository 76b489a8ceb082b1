package netdns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// suffixPolicy allows the names it lists and every name below them.
type suffixPolicy []string

func (p suffixPolicy) AllowName(name string) bool {
	for _, s := range p {
		if name == s || strings.HasSuffix(name, "."+s) {
			return true
		}
	}
	return false
}

// testPolicy allows the names of the fake upstream's records, not
// denied.test.
var testPolicy = suffixPolicy{"test"}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time // guarded by mu
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// env is a resolver serving on loopback, in front of a fake upstream.
type env struct {
	up  *fakeUpstream
	r   *Resolver
	udp string // the resolver's address, UDP and TCP
}

// sandboxByIP attributes queries by source address: 127.0.0.1 is
// sandbox "a", 127.0.0.2 is "b", with their policies.
type sandboxByIP map[string]Sandbox

func (v sandboxByIP) Sandbox(remote net.Addr) (Sandbox, bool) {
	host, _, err := net.SplitHostPort(remote.String())
	if err != nil {
		return Sandbox{}, false
	}
	sb, ok := v[host]
	return sb, ok
}

// newEnv starts a resolver with cfg (its Upstreams default to the fake
// upstream) and serves it on loopback for sandboxes "a" (127.0.0.1,
// policy pa) and "b" (127.0.0.2, testPolicy).
// A non-nil clk is the resolver's clock.
func newEnv(t *testing.T, cfg Config, pa Policy, clk *fakeClock) *env {
	t.Helper()
	up := newUpstream(t)
	if cfg.Upstreams == nil {
		cfg.Upstreams = []string{up.addr}
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if clk != nil {
		r.now = clk.Now
	}
	t.Cleanup(r.Close)
	e := &env{up: up, r: r}
	e.udp = e.serve(t, sandboxByIP{
		"127.0.0.1": {ID: "a", Policy: pa},
		"127.0.0.2": {ID: "b", Policy: testPolicy},
	})
	return e
}

// serve serves the resolver on a new loopback port (UDP and TCP) for view
// until the test ends, and returns the port's address.
func (e *env) serve(t *testing.T, view SandboxView) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.r.Serve(ctx, pc, ln, view) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return pc.LocalAddr().String()
}

// ask sends one question from source address src ("127.0.0.1") over
// network ("udp" or "tcp") and returns the reply.
func (e *env) ask(t *testing.T, src, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	return e.exchange(t, src, network, m)
}

func (e *env) exchange(t *testing.T, src, network string, m *dns.Msg) *dns.Msg {
	t.Helper()
	var local net.Addr = &net.UDPAddr{IP: net.ParseIP(src)}
	if network == "tcp" {
		local = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	c := &dns.Client{Net: network, Timeout: 3 * time.Second, Dialer: &net.Dialer{LocalAddr: local, Timeout: 3 * time.Second}}
	resp, _, err := c.Exchange(m, e.udp)
	if err != nil {
		t.Fatalf("ask %s %s over %s: %v", m.Question[0].Name, dns.TypeToString[m.Question[0].Qtype], network, err)
	}
	return resp
}

// addrs returns the addresses of an answer, as strings, and checks that
// each record is of the question's name (the chain is flattened).
func addrs(t *testing.T, m *dns.Msg) []string {
	t.Helper()
	var out []string
	for _, rr := range m.Answer {
		if !strings.EqualFold(rr.Header().Name, m.Question[0].Name) {
			t.Errorf("answer record %v: owner is not the question's name %s", rr, m.Question[0].Name)
		}
		switch rr := rr.(type) {
		case *dns.A:
			out = append(out, rr.A.String())
		case *dns.AAAA:
			out = append(out, rr.AAAA.String())
		default:
			t.Errorf("answer record %v: want only A and AAAA", rr)
		}
	}
	slices.Sort(out)
	return out
}

func TestAnswers(t *testing.T) {
	e := newEnv(t, Config{
		Hosts:    map[string][]netip.Addr{"DB.Corp.test.": {netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd00::3")}},
		Internal: func(name string) bool { return strings.HasSuffix(name, ".internal.test") },
	}, testPolicy, nil)
	tests := []struct {
		name      string
		qtype     uint16
		network   string
		rcode     int
		want      []string
		upstreams map[string]int // queries the upstream must have seen
	}{
		{"pypi.test", dns.TypeA, "udp", dns.RcodeSuccess, []string{"93.184.216.34"}, map[string]int{"pypi.test A udp": 1}},
		{"PyPI.Test", dns.TypeAAAA, "udp", dns.RcodeSuccess, []string{"2606:2800:220:1::1"}, map[string]int{"pypi.test AAAA udp": 1}},
		{"pypi.test", dns.TypeA, "tcp", dns.RcodeSuccess, []string{"93.184.216.34"}, map[string]int{"pypi.test A": 1}}, // cached
		// DNS rebinding: a public name never maps to a non-public address.
		{"rebind.test", dns.TypeA, "udp", dns.RcodeSuccess, []string{"93.184.216.35"}, nil},
		{"rebind-only.test", dns.TypeA, "udp", dns.RcodeSuccess, nil, nil},
		{"meta.test", dns.TypeA, "udp", dns.RcodeSuccess, nil, nil},
		{"mapped.test", dns.TypeAAAA, "udp", dns.RcodeSuccess, nil, nil},
		// Internal names may.
		{"mirror.internal.test", dns.TypeA, "udp", dns.RcodeSuccess, []string{"10.0.0.7"}, nil},
		{"db.corp.test", dns.TypeA, "udp", dns.RcodeSuccess, []string{"10.1.2.3"}, map[string]int{"db.corp.test": 0}},
		{"db.corp.test", dns.TypeAAAA, "udp", dns.RcodeSuccess, []string{"fd00::3"}, map[string]int{"db.corp.test": 0}},
		// A CNAME chain is followed and flattened; records off the chain are ignored.
		{"cdn.test", dns.TypeA, "udp", dns.RcodeSuccess, []string{"93.184.216.40"}, map[string]int{"cdn.test A udp": 1, "b.edge.test": 0}},
		// An incomplete chain is followed upstream.
		{"partial.test", dns.TypeA, "udp", dns.RcodeSuccess, []string{"93.184.216.41"}, map[string]int{"target.test A udp": 1}},
		{"loop.test", dns.TypeA, "udp", dns.RcodeServerFailure, nil, nil},
		// A truncated UDP answer is asked again over TCP.
		{"big.test", dns.TypeA, "udp", dns.RcodeSuccess, []string{"93.184.216.50"}, map[string]int{"big.test A udp": 1, "big.test A tcp": 1}},
		// An answer to another question is not taken.
		{"spoof.test", dns.TypeA, "udp", dns.RcodeServerFailure, nil, nil},
		{"missing.test", dns.TypeA, "udp", dns.RcodeNameError, nil, map[string]int{"missing.test A udp": 1}},
		// Only addresses are forwarded.
		{"pypi.test", dns.TypeMX, "udp", dns.RcodeSuccess, nil, map[string]int{"pypi.test MX": 0}},
		{"pypi.test", dns.TypeTXT, "tcp", dns.RcodeSuccess, nil, map[string]int{"pypi.test TXT": 0}},
	}
	for _, tt := range tests {
		resp := e.ask(t, "127.0.0.1", tt.network, tt.name, tt.qtype)
		q := tt.name + " " + dns.TypeToString[tt.qtype] + " over " + tt.network
		if resp.Rcode != tt.rcode {
			t.Errorf("%s: rcode %s, want %s", q, dns.RcodeToString[resp.Rcode], dns.RcodeToString[tt.rcode])
		}
		if diff := cmp.Diff(tt.want, addrs(t, resp)); diff != "" {
			t.Errorf("%s: addresses (-want +got):\n%s", q, diff)
		}
		if !resp.RecursionAvailable {
			t.Errorf("%s: reply without RA", q)
		}
		for k, n := range tt.upstreams {
			if got := e.up.count(k); got != n {
				t.Errorf("%s: upstream saw %q %d times, want %d", q, k, got, n)
			}
		}
	}
	if got := e.r.Resolved("a", netip.MustParseAddr("10.0.0.5")); got != nil {
		t.Errorf("Resolved(a, 10.0.0.5) = %v, want none: the address was not given to the sandbox", got)
	}
}

func TestDeniedNeverForwarded(t *testing.T) {
	var (
		mu     sync.Mutex
		denied []string
	)
	e := newEnv(t, Config{Denied: func(sandbox, name string) {
		mu.Lock()
		denied = append(denied, sandbox+" "+name)
		mu.Unlock()
	}}, suffixPolicy{"allowed.test"}, nil)
	for _, tt := range []struct {
		name  string
		qtype uint16
	}{
		{"denied.test", dns.TypeA},
		{"pypi.test", dns.TypeAAAA},
		{"pypi.test", dns.TypeMX},
		{"allowed.test.evil.test", dns.TypeA},
		// A dot inside a label: a naive policy would read x.allowed.test.
		{`x\.allowed.test`, dns.TypeA},
		{`x\000.allowed.test`, dns.TypeA},
	} {
		resp := e.ask(t, "127.0.0.1", "udp", tt.name, tt.qtype)
		if resp.Rcode != dns.RcodeNameError || len(resp.Answer) != 0 {
			t.Errorf("%s %s: %s with %d answers, want NXDOMAIN", tt.name, dns.TypeToString[tt.qtype], dns.RcodeToString[resp.Rcode], len(resp.Answer))
		}
	}
	if n := e.up.total(); n != 0 {
		t.Errorf("upstream got %d queries (%v), want none", n, e.up.names())
	}
	mu.Lock()
	want := []string{"a denied.test", "a pypi.test", "a pypi.test", "a allowed.test.evil.test"}
	if diff := cmp.Diff(want, denied); diff != "" {
		t.Errorf("Denied was told (-want +got):\n%s", diff)
	}
	mu.Unlock()
	// The other sandbox's policy is its own.
	if resp := e.ask(t, "127.0.0.2", "udp", "pypi.test", dns.TypeA); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Errorf("sandbox b: pypi.test: %v, want its address", resp)
	}
}

func TestRefused(t *testing.T) {
	e := newEnv(t, Config{}, testPolicy, nil)
	q := func(mod func(m *dns.Msg)) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion("pypi.test.", dns.TypeA)
		mod(m)
		return m
	}
	for _, tt := range []struct {
		desc    string
		network string
		m       *dns.Msg
		rcode   int
	}{
		{"ANY", "udp", q(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeANY }), dns.RcodeRefused},
		{"AXFR", "tcp", q(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAXFR }), dns.RcodeRefused},
		{"IXFR", "tcp", q(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeIXFR }), dns.RcodeRefused},
		{"class CH", "udp", q(func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }), dns.RcodeRefused},
		{"NOTIFY", "udp", q(func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify }), dns.RcodeRefused},
		{"UPDATE", "udp", q(func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate }), dns.RcodeRefused},
		{"two questions", "udp", q(func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }), dns.RcodeFormatError},
	} {
		resp := e.exchange(t, "127.0.0.1", tt.network, tt.m)
		if resp.Rcode != tt.rcode || len(resp.Answer) != 0 {
			t.Errorf("%s: %s with %d answers, want %s", tt.desc, dns.RcodeToString[resp.Rcode], len(resp.Answer), dns.RcodeToString[tt.rcode])
		}
	}
	if n := e.up.total(); n != 0 {
		t.Errorf("upstream got %d queries (%v), want none", n, e.up.names())
	}
}

func TestCacheTTL(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	e := newEnv(t, Config{MinTTL: 2 * time.Second, MaxTTL: 100 * time.Second, NegativeTTL: 10 * time.Second}, testPolicy, clk)
	ttl := func(m *dns.Msg) uint32 {
		if len(m.Answer) == 0 {
			t.Fatalf("%s: no answer", m.Question[0].Name)
		}
		return m.Answer[0].Header().Ttl
	}

	// short.test has a TTL of 1 s, raised to MinTTL.
	if got := ttl(e.ask(t, "127.0.0.1", "udp", "short.test", dns.TypeA)); got != 2 {
		t.Errorf("short.test TTL %d, want MinTTL 2", got)
	}
	clk.Add(time.Second)
	if got := ttl(e.ask(t, "127.0.0.1", "udp", "short.test", dns.TypeA)); got != 1 {
		t.Errorf("short.test TTL after 1 s: %d, want 1", got)
	}
	if n := e.up.count("short.test A"); n != 1 {
		t.Errorf("within the TTL the upstream was asked %d times, want 1", n)
	}
	clk.Add(1500 * time.Millisecond)
	e.ask(t, "127.0.0.1", "udp", "short.test", dns.TypeA)
	if n := e.up.count("short.test A"); n != 2 {
		t.Errorf("after the TTL the upstream was asked %d times, want 2", n)
	}

	// long.test's day is cut to MaxTTL.
	if got := ttl(e.ask(t, "127.0.0.1", "udp", "long.test", dns.TypeA)); got != 100 {
		t.Errorf("long.test TTL %d, want MaxTTL 100", got)
	}

	// NXDOMAIN is cached for the SOA's 30 s, cut to NegativeTTL.
	for range 3 {
		if resp := e.ask(t, "127.0.0.1", "udp", "missing.test", dns.TypeA); resp.Rcode != dns.RcodeNameError {
			t.Fatalf("missing.test: %s, want NXDOMAIN", dns.RcodeToString[resp.Rcode])
		}
	}
	clk.Add(9 * time.Second)
	e.ask(t, "127.0.0.1", "udp", "missing.test", dns.TypeA)
	if n := e.up.count("missing.test A"); n != 1 {
		t.Errorf("within NegativeTTL the upstream was asked about missing.test %d times, want 1", n)
	}
	clk.Add(2 * time.Second)
	e.ask(t, "127.0.0.1", "udp", "missing.test", dns.TypeA)
	if n := e.up.count("missing.test A"); n != 2 {
		t.Errorf("after NegativeTTL the upstream was asked about missing.test %d times, want 2", n)
	}
	// An empty answer is cached too.
	for range 2 {
		e.ask(t, "127.0.0.1", "udp", "pypi.test", dns.TypeAAAA)
		e.ask(t, "127.0.0.1", "udp", "rebind-only.test", dns.TypeAAAA)
	}
	if n := e.up.count("rebind-only.test AAAA"); n != 1 {
		t.Errorf("an empty answer: upstream asked %d times, want 1", n)
	}
}

func TestCacheBounded(t *testing.T) {
	e := newEnv(t, Config{CacheSize: 2}, testPolicy, nil)
	for _, n := range []string{"pypi.test", "short.test", "long.test", "cdn.test", "pypi.test"} {
		e.ask(t, "127.0.0.1", "udp", n, dns.TypeA)
	}
	if n := e.r.cache.len(); n != 2 {
		t.Errorf("cache holds %d entries, want CacheSize 2", n)
	}
	if n := e.up.count("pypi.test A"); n != 2 {
		t.Errorf("pypi.test was evicted and asked %d times, want 2", n)
	}
}

func TestUpstreamTimeout(t *testing.T) {
	// A resolver that never answers, before the fake upstream.
	hole, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	up := newUpstream(t)
	e := newEnv(t, Config{Upstreams: []string{hole.LocalAddr().String(), up.addr}, Timeout: 200 * time.Millisecond}, testPolicy, nil)

	start := time.Now()
	resp := e.ask(t, "127.0.0.1", "udp", "pypi.test", dns.TypeA)
	if d := time.Since(start); d > time.Second {
		t.Errorf("the silent upstream held the answer %v, want under 1 s", d)
	}
	if diff := cmp.Diff([]string{"93.184.216.34"}, addrs(t, resp)); diff != "" {
		t.Errorf("pypi.test from the second upstream (-want +got):\n%s", diff)
	}

	// slow.test takes 1.5 s at every upstream: SERVFAIL after the timeouts.
	start = time.Now()
	resp = e.ask(t, "127.0.0.1", "udp", "slow.test", dns.TypeA)
	if d := time.Since(start); d > time.Second {
		t.Errorf("slow.test took %v, want under 1 s", d)
	}
	if resp.Rcode != dns.RcodeServerFailure {
		t.Errorf("slow.test: %s, want SERVFAIL", dns.RcodeToString[resp.Rcode])
	}
}

func TestResolved(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	e := newEnv(t, Config{
		MaxResolved:   3,
		ResolvedGrace: 10 * time.Second,
		Hosts:         map[string][]netip.Addr{"db.corp.test": {netip.MustParseAddr("10.1.2.3")}},
	}, testPolicy, clk)
	pypi := netip.MustParseAddr("93.184.216.34")
	e.ask(t, "127.0.0.1", "udp", "pypi.test", dns.TypeA)
	e.ask(t, "127.0.0.1", "udp", "db.corp.test", dns.TypeA)
	e.ask(t, "127.0.0.1", "udp", "cdn.test", dns.TypeA)
	for _, tt := range []struct {
		sandbox string
		ip      string
		want    []string
	}{
		{"a", "93.184.216.34", []string{"pypi.test"}},
		{"a", "::ffff:93.184.216.34", []string{"pypi.test"}},
		{"a", "10.1.2.3", []string{"db.corp.test"}},
		{"a", "93.184.216.40", []string{"cdn.test"}}, // the name asked, not the chain's
		{"b", "93.184.216.34", nil},
		{"nobody", "93.184.216.34", nil},
	} {
		if got := e.r.Resolved(tt.sandbox, netip.MustParseAddr(tt.ip)); !cmp.Equal(got, tt.want) {
			t.Errorf("Resolved(%q, %s) = %v, want %v", tt.sandbox, tt.ip, got, tt.want)
		}
	}

	// TTL 60 s plus 10 s of grace.
	clk.Add(69 * time.Second)
	if got := e.r.Resolved("a", pypi); len(got) != 1 {
		t.Errorf("within TTL and grace: Resolved(a, pypi) = %v, want pypi.test", got)
	}
	clk.Add(2 * time.Second)
	if got := e.r.Resolved("a", pypi); got != nil {
		t.Errorf("after TTL and grace: Resolved(a, pypi) = %v, want none", got)
	}

	// Bounded: 3 records kept.
	for _, n := range []string{"short.test", "long.test", "target.test", "rebind.test"} {
		e.ask(t, "127.0.0.1", "udp", n, dns.TypeA)
	}
	st := e.r.state("a")
	st.mu.Lock()
	n := st.nresolved
	count := 0
	for _, names := range st.resolved {
		count += len(names)
	}
	st.mu.Unlock()
	if n != 3 || count != 3 {
		t.Errorf("sandbox a keeps %d records (counted %d), want MaxResolved 3", count, n)
	}
	if got := e.r.Resolved("a", netip.MustParseAddr("93.184.216.35")); !cmp.Equal(got, []string{"rebind.test"}) {
		t.Errorf("the newest record went: Resolved(a, rebind) = %v", got)
	}
	e.r.Forget("a")
	if got := e.r.Resolved("a", netip.MustParseAddr("93.184.216.35")); got != nil {
		t.Errorf("after Forget: Resolved = %v, want none", got)
	}
}

// TestFloodIsolated floods the resolver from sandbox a, on its own
// listener as in its own namespace, while sandbox b asks as usual.
func TestFloodIsolated(t *testing.T) {
	e := newEnv(t, Config{Rate: 20, Burst: 20}, testPolicy, nil)
	aAddr := e.serve(t, Only{ID: "a", Policy: testPolicy})
	a, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(aAddr)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	m := new(dns.Msg)

	// Sandbox a floods; b asks as usual at the same time.
	start := time.Now()
	stopFlood := make(chan struct{})
	var wg sync.WaitGroup
	var ok, refused int
	wg.Go(func() {
		buf := make([]byte, 1500)
		a.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			n, err := a.Read(buf)
			if err != nil {
				return
			}
			r := new(dns.Msg)
			if r.Unpack(buf[:n]) != nil {
				continue
			}
			switch r.Rcode {
			case dns.RcodeSuccess, dns.RcodeNameError:
				ok++
			case dns.RcodeRefused:
				refused++
			}
		}
	})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopFlood:
				return
			default:
			}
			// Names the cache cannot answer, so that each admitted
			// query goes upstream.
			m.SetQuestion(fmt.Sprintf("n%d.pypi.test.", i), dns.TypeA)
			b, _ := m.Pack()
			a.Write(b)
			if i%50 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	})
	for i := range 15 {
		resp := e.ask(t, "127.0.0.2", "udp", "pypi.test", dns.TypeA)
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Errorf("sandbox b, query %d during a's flood: %s with %d answers, want the address", i, dns.RcodeToString[resp.Rcode], len(resp.Answer))
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stopFlood)
	elapsed := time.Since(start)
	a.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	wg.Wait()
	limit := 20 + int(20*elapsed.Seconds()) + 5
	t.Logf("flood: %d answered, %d refused in %v", ok, refused, elapsed)
	if ok > limit {
		t.Errorf("the flooding sandbox got %d answers in %v, want at most %d (burst 20, 20/s)", ok, elapsed, limit)
	}
	if refused == 0 {
		t.Errorf("the flooding sandbox got no REFUSED")
	}
}

func TestNew(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	r, err := New(Config{ResolvConf: write("ok", "search example.com\nnameserver 127.0.0.53\nnameserver 2001:db8::1\noptions edns0\n")})
	if err != nil {
		t.Fatalf("New(resolv.conf) = %v", err)
	}
	if diff := cmp.Diff([]string{"127.0.0.53:53", "[2001:db8::1]:53"}, r.upstreams); diff != "" {
		t.Errorf("upstreams from resolv.conf (-want +got):\n%s", diff)
	}
	r.Close()
	r, err = New(Config{Upstreams: []string{"192.0.2.1", "192.0.2.2:5353", "[2001:db8::2]:54"}, ResolvConf: "/nonexistent"})
	if err != nil {
		t.Fatalf("New(upstreams) = %v", err)
	}
	if diff := cmp.Diff([]string{"192.0.2.1:53", "192.0.2.2:5353", "[2001:db8::2]:54"}, r.upstreams); diff != "" {
		t.Errorf("upstreams (-want +got):\n%s", diff)
	}
	r.Close()
	for _, tt := range []struct {
		desc string
		cfg  Config
		kind error
	}{
		{"hostname upstream", Config{Upstreams: []string{"dns.google"}}, errdefs.ErrInvalidArgument},
		{"port 0", Config{Upstreams: []string{"192.0.2.1:0"}}, errdefs.ErrInvalidArgument},
		{"bad hosts name", Config{Upstreams: []string{"192.0.2.1"}, Hosts: map[string][]netip.Addr{"a..b": nil}}, errdefs.ErrInvalidArgument},
		{"no resolv.conf", Config{ResolvConf: "/nonexistent"}, errdefs.ErrFailedPrecondition},
		{"no nameserver", Config{ResolvConf: write("empty", "search example.com\n")}, errdefs.ErrFailedPrecondition},
	} {
		r, err := New(tt.cfg)
		if !errdefs.Is(err, tt.kind) {
			t.Errorf("New(%s) = %v, want %v", tt.desc, err, tt.kind)
		}
		if r != nil {
			r.Close()
		}
	}
}

// TestSlowQueriesIsolated holds sandbox a's queries on a slow upstream
// answer: beyond MaxPending they are REFUSED at once, and sandbox b still
// gets its answers.
func TestSlowQueriesIsolated(t *testing.T) {
	e := newEnv(t, Config{MaxPending: 4, MaxInFlight: 8, Timeout: 3 * time.Second}, testPolicy, nil)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		refused int
	)
	for i := range 30 {
		wg.Go(func() {
			m := new(dns.Msg)
			m.SetQuestion("slow.test.", []uint16{dns.TypeA, dns.TypeAAAA}[i%2])
			c := &dns.Client{Timeout: 4 * time.Second}
			resp, _, err := c.Exchange(m, e.udp)
			if err != nil {
				t.Errorf("sandbox a, slow query %d: %v", i, err)
				return
			}
			if resp.Rcode == dns.RcodeRefused {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // a's queries wait on the upstream
	start := time.Now()
	resp := e.ask(t, "127.0.0.2", "udp", "pypi.test", dns.TypeA)
	if d := time.Since(start); d > 500*time.Millisecond || resp.Rcode != dns.RcodeSuccess {
		t.Errorf("sandbox b during a's slow queries: %s after %v, want an answer at once", dns.RcodeToString[resp.Rcode], d)
	}
	wg.Wait()
	if refused < 30-4 {
		t.Errorf("sandbox a: %d of 30 slow queries refused, want all but MaxPending 4", refused)
	}
}

// switchPolicy is a policy an update flips.
type switchPolicy struct{ allow atomic.Bool }

func (p *switchPolicy) AllowName(string) bool { return p.allow.Load() }

func TestPolicyUpdateApplies(t *testing.T) {
	p := &switchPolicy{}
	p.allow.Store(true)
	e := newEnv(t, Config{}, p, nil)
	if resp := e.ask(t, "127.0.0.1", "udp", "pypi.test", dns.TypeA); len(resp.Answer) != 1 {
		t.Fatalf("allowed: %v, want the address", resp)
	}
	p.allow.Store(false)
	if resp := e.ask(t, "127.0.0.1", "udp", "pypi.test", dns.TypeA); resp.Rcode != dns.RcodeNameError || len(resp.Answer) != 0 {
		t.Errorf("after revoking, the cached name: %s with %d answers, want NXDOMAIN", dns.RcodeToString[resp.Rcode], len(resp.Answer))
	}
}

func TestReplySize(t *testing.T) {
	var many []netip.Addr
	for i := range 40 {
		many = append(many, netip.AddrFrom4([4]byte{93, 184, 217, byte(i)}))
	}
	e := newEnv(t, Config{Hosts: map[string][]netip.Addr{"many.test": many}}, testPolicy, nil)
	m := new(dns.Msg)
	m.SetQuestion("many.test.", dns.TypeA)
	c := &dns.Client{UDPSize: 512, Timeout: 3 * time.Second}
	resp, _, err := c.Exchange(m, e.udp)
	if err != nil {
		t.Fatal(err)
	}
	resp.Compress = true // as it was sent
	if b, _ := resp.Pack(); len(b) > dns.MinMsgSize || !resp.Truncated || len(resp.Answer) == 0 {
		t.Errorf("UDP without EDNS: %d bytes, truncated %v; want at most 512, truncated", len(b), resp.Truncated)
	}
	m.SetEdns0(4096, false)
	resp, _, err = c.Exchange(m, e.udp)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Answer) != maxAddrs || resp.Truncated {
		t.Errorf("UDP with EDNS: %d answers, truncated %v; want %d, whole", len(resp.Answer), resp.Truncated, maxAddrs)
	}
}

func TestTCPConnsPerSandbox(t *testing.T) {
	e := newEnv(t, Config{MaxTCPConns: 2}, testPolicy, nil)
	var conns []*dns.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 2 {
		c, err := dns.DialTimeout("tcp", e.udp, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	m := new(dns.Msg)
	m.SetQuestion("pypi.test.", dns.TypeA)
	for i, c := range conns {
		if err := c.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if r, err := c.ReadMsg(); err != nil || len(r.Answer) != 1 {
			t.Fatalf("TCP connection %d: %v, %v; want the address", i, r, err)
		}
	}
	third, err := dns.DialTimeout("tcp", e.udp, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	third.WriteMsg(m)
	third.SetReadDeadline(time.Now().Add(3 * time.Second))
	if r, err := third.ReadMsg(); err == nil {
		t.Errorf("third TCP connection of the sandbox answered %v, want it closed", r)
	}
	// The other sandbox is not held to a's connections.
	if resp := e.ask(t, "127.0.0.2", "tcp", "pypi.test", dns.TypeA); len(resp.Answer) != 1 {
		t.Errorf("sandbox b over TCP: %v, want the address", resp)
	}
}

// TestAPIName: the platform's API name answers the gateway given for a
// sandbox whose policy allows dsec-api, only as an A record and without
// asking upstream; for another it does not exist (whatever its policy
// says of the name), and an allowed suffix does not make it exist.
func TestAPIName(t *testing.T) {
	e := newEnv(t, Config{}, suffixPolicy{"internal"}, nil)
	gw := netip.MustParseAddr("100.64.0.4")
	e.udp = e.serve(t, sandboxByIP{
		"127.0.0.1": {ID: "a", Policy: suffixPolicy{"internal"}},
		"127.0.0.2": {ID: "b", Policy: testPolicy, API: gw},
	})
	if resp := e.ask(t, "127.0.0.2", "udp", netpolicy.APIName, dns.TypeA); resp.Rcode != dns.RcodeSuccess || !slices.Equal(addrs(t, resp), []string{gw.String()}) {
		t.Errorf("b: %s A = %v, want %s", netpolicy.APIName, resp, gw)
	}
	if resp := e.ask(t, "127.0.0.2", "udp", strings.ToUpper(netpolicy.APIName), dns.TypeAAAA); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
		t.Errorf("b: %s AAAA = %v, want no address", netpolicy.APIName, resp)
	}
	if resp := e.ask(t, "127.0.0.1", "udp", netpolicy.APIName, dns.TypeA); resp.Rcode != dns.RcodeNameError {
		t.Errorf("a (no dsec-api, *.internal allowed): %s = %v, want NXDOMAIN", netpolicy.APIName, resp)
	}
	if n := e.up.total(); n != 0 {
		t.Errorf("upstream got %d queries (%v), want none", n, e.up.names())
	}
}
