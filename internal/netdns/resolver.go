// Package netdns is the node resolver: the DNS server that sandboxes with
// network use. It answers A and AAAA questions for the names a sandbox's
// policy allows, forwards them to the host's resolvers, caches answers for
// their TTL, and records which names each sandbox resolved to which
// addresses, so that the egress proxy can judge a connection to an address
// by the names behind it (Resolved).
//
// Invariants:
//   - A name the sandbox's policy does not allow is never sent upstream;
//     the sandbox gets NXDOMAIN. The policy judges the name the sandbox
//     asked for; the targets of a CNAME chain are followed upstream but not
//     judged (they come from the upstream, not from the sandbox), and the
//     sandbox gets the chain's final addresses under the name it asked for
//     (the chain is flattened).
//   - A name that is not internal (not in Config.Hosts, not accepted by
//     Config.Internal) never resolves to a non-public address (private,
//     loopback, link-local, CGNAT, multicast, unspecified, or an IPv6 form
//     embedding one); such addresses are dropped from the answer.
//   - Each sandbox has its own query budget (a token bucket) and its own
//     bound on queries in progress; upstream queries are bounded node-wide.
//     A flooding sandbox gets REFUSED and cannot starve the others.
//   - Only QUERY opcodes of class IN are answered; ANY, AXFR and IXFR are
//     REFUSED.
package netdns

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/miekg/dns"
)

// A Policy judges the names a sandbox may resolve. It is consulted on
// every query, so a policy that changes behind the interface takes effect
// for the next query.
type Policy interface {
	// AllowName reports whether the sandbox may resolve name: lower case,
	// without the final dot ("pypi.org").
	AllowName(name string) bool
}

// A Sandbox is what the resolver knows of the sandbox a query comes from.
type Sandbox struct {
	// ID keys the sandbox's budget and its Resolved records.
	ID string
	// Policy judges its names; a nil Policy allows none.
	Policy Policy
	// API, when valid, is the address the platform's API name
	// (netpolicy.APIName) has for this sandbox, its gateway: set while its
	// policy allows dsec-api. Otherwise the name does not exist for it.
	API netip.Addr
}

// apiTTL is the TTL of the API name's answer: a policy that stops allowing
// the API also stops the connections, so a cached answer gives nothing.
const apiTTL = 5

// Config configures a Resolver. Its zero value works: it forwards to the
// resolvers of /etc/resolv.conf with the defaults below.
type Config struct {
	// Upstreams are the resolvers queries are forwarded to, in order of
	// preference, as "IP" (port 53) or "IP:port". Default: the nameservers
	// of ResolvConf, used as they are, loopback stubs such as 127.0.0.53
	// included: the resolver runs in the host's namespace, where the host's
	// stub is reachable; a sandbox never reaches it.
	Upstreams []string
	// ResolvConf is read for Upstreams when none are given. Default
	// /etc/resolv.conf.
	ResolvConf string
	// Hosts are the operator's names ([hosts] of the network config):
	// answered from here without asking upstream, and internal, so they
	// may map to private addresses. Names are matched without the final
	// dot, in any case. The policy still judges them.
	Hosts map[string][]netip.Addr
	// Internal reports whether a name (lower case, no final dot) is the
	// operator's internal name that may resolve to non-public addresses,
	// such as a catalogue entry's internal mirror. Default: only Hosts.
	Internal func(name string) bool

	// Timeout bounds one query to one upstream (per transport). Default 2 s.
	Timeout time.Duration
	// QueryTimeout bounds the whole resolution of one question, every
	// upstream and CNAME hop included. Default 5 s.
	QueryTimeout time.Duration
	// MaxInFlight bounds the queries in flight to upstreams, node-wide.
	// Default 128.
	MaxInFlight int

	// CacheSize bounds the cached answers (name and type). Default 10,000.
	CacheSize int
	// MinTTL and MaxTTL clamp the TTL of positive answers, in the cache
	// and as the sandbox sees it. Defaults 5 s and 5 min.
	MinTTL, MaxTTL time.Duration
	// NegativeTTL caps how long NXDOMAIN and empty answers are cached
	// (from the SOA's minimum, at least MinTTL); it is also the TTL when
	// the upstream sends no SOA. Default 60 s.
	NegativeTTL time.Duration

	// Rate and Burst are each sandbox's query budget: Rate queries a
	// second on average, Burst at once. Defaults 50 and 100.
	Rate  float64
	Burst int
	// MaxPending bounds one sandbox's queries in progress at once (waiting
	// on upstreams); more are REFUSED. Default 16.
	MaxPending int
	// MaxTCPConns bounds one sandbox's open TCP connections. Default 4.
	MaxTCPConns int

	// MaxResolved bounds the (address, name) records kept per sandbox for
	// Resolved; when full, the record that expires first goes. Default
	// 4,096.
	MaxResolved int
	// ResolvedGrace is how long after its TTL a record still counts for
	// Resolved, for programs that connect a while after they resolved.
	// Default 1 min.
	ResolvedGrace time.Duration

	// Denied, when set, is told of each name a sandbox's policy denied
	// (lower case, no final dot), for the sandbox's log of denials. It is
	// called on the query's path and must not block.
	Denied func(sandbox, name string)

	// Logger receives warnings (an upstream that fails). Default: discard.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defInt := func(i *int, v int) {
		if *i <= 0 {
			*i = v
		}
	}
	if c.ResolvConf == "" {
		c.ResolvConf = "/etc/resolv.conf"
	}
	def(&c.Timeout, 2*time.Second)
	def(&c.QueryTimeout, 5*time.Second)
	defInt(&c.MaxInFlight, 128)
	defInt(&c.CacheSize, 10000)
	def(&c.MinTTL, 5*time.Second)
	def(&c.MaxTTL, 5*time.Minute)
	if c.MaxTTL < c.MinTTL {
		c.MaxTTL = c.MinTTL
	}
	def(&c.NegativeTTL, time.Minute)
	if c.Rate <= 0 {
		c.Rate = 50
	}
	defInt(&c.Burst, 100)
	defInt(&c.MaxPending, 16)
	defInt(&c.MaxTCPConns, 4)
	defInt(&c.MaxResolved, 4096)
	def(&c.ResolvedGrace, time.Minute)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// maxAddrs bounds the addresses of one answer, so that an answer always
// fits a UDP reply.
const maxAddrs = 32

// A Resolver answers the queries of many sandboxes. It is safe for
// concurrent use; Serve runs it on a listener.
type Resolver struct {
	cfg       Config
	upstreams []string // host:port
	hosts     map[string][]netip.Addr
	inflight  chan struct{} // upstream query slots
	cache     *cache
	now       func() time.Time
	lastWarn  atomic.Int64 // unix nanoseconds of the last upstream warning

	// base is cancelled by Close; wg counts the shared resolutions.
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex
	// guarded by mu
	sandboxes map[string]*sandboxState
	calls     map[cacheKey]*call
	closed    bool // no resolution starts once set
}

// New returns a Resolver. It fails with InvalidArgument when an upstream
// or a Hosts entry is malformed, and with FailedPrecondition when no
// upstream is given and ResolvConf names none.
func New(cfg Config) (*Resolver, error) {
	cfg.setDefaults()
	r := &Resolver{
		cfg:       cfg,
		hosts:     make(map[string][]netip.Addr, len(cfg.Hosts)),
		inflight:  make(chan struct{}, cfg.MaxInFlight),
		cache:     newCache(cfg.CacheSize),
		now:       time.Now,
		sandboxes: make(map[string]*sandboxState),
		calls:     make(map[cacheKey]*call),
	}
	r.base, r.cancel = context.WithCancel(context.Background())
	for name, addrs := range cfg.Hosts {
		n, ok := canonical(name)
		if !ok {
			return nil, fmt.Errorf("resolver hosts: %q is not a domain name: %w", name, errdefs.ErrInvalidArgument)
		}
		for _, a := range addrs {
			if !a.IsValid() {
				return nil, fmt.Errorf("resolver hosts: %s has an invalid address: %w", name, errdefs.ErrInvalidArgument)
			}
			r.hosts[n] = append(r.hosts[n], a.Unmap())
		}
	}
	ups := cfg.Upstreams
	if len(ups) == 0 {
		cc, err := dns.ClientConfigFromFile(cfg.ResolvConf)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w: set [resolver] upstreams in the network config", cfg.ResolvConf, errdefs.ErrFailedPrecondition)
		}
		for _, s := range cc.Servers {
			ups = append(ups, net.JoinHostPort(s, cc.Port))
		}
		if len(ups) == 0 {
			return nil, fmt.Errorf("%s names no nameserver: %w: set [resolver] upstreams in the network config", cfg.ResolvConf, errdefs.ErrFailedPrecondition)
		}
	}
	for _, s := range ups {
		u, err := parseUpstream(s)
		if err != nil {
			return nil, err
		}
		r.upstreams = append(r.upstreams, u)
	}
	return r, nil
}

func parseUpstream(s string) (string, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, 53).String(), nil
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Port() != 0 {
		return ap.String(), nil
	}
	return "", fmt.Errorf("resolver upstream %q: want an IP address or IP:port: %w", s, errdefs.ErrInvalidArgument)
}

// Close ends the resolutions in progress and waits for them. Queries
// after Close get SERVFAIL.
func (r *Resolver) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
}

// internal reports whether name may resolve to non-public addresses.
func (r *Resolver) internal(name string) bool {
	if _, ok := r.hosts[name]; ok {
		return true
	}
	return r.cfg.Internal != nil && r.cfg.Internal(name)
}

// Resolved returns the names that resolved to ip for the sandbox, whose
// records have not expired (TTL plus ResolvedGrace), sorted.
func (r *Resolver) Resolved(sandbox string, ip netip.Addr) []string {
	r.mu.Lock()
	st := r.sandboxes[sandbox]
	r.mu.Unlock()
	if st == nil {
		return nil
	}
	names := st.resolvedNames(ip.Unmap(), r.now())
	sort.Strings(names)
	return names
}

// Forget drops what the resolver keeps of a sandbox: its budget and its
// Resolved records. Call it when the sandbox is deleted.
func (r *Resolver) Forget(sandbox string) {
	r.mu.Lock()
	delete(r.sandboxes, sandbox)
	r.mu.Unlock()
}

// Sandboxes returns how many sandboxes the resolver keeps state (a budget,
// Resolved records) for.
func (r *Resolver) Sandboxes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sandboxes)
}

// state returns the sandbox's state, made on its first query.
func (r *Resolver) state(id string) *sandboxState {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.sandboxes[id]
	if st == nil {
		st = &sandboxState{
			tokens:   float64(r.cfg.Burst),
			last:     r.now(),
			resolved: make(map[netip.Addr]map[string]time.Time),
		}
		r.sandboxes[id] = st
	}
	return st
}

// Answer answers one query in wire format from sandbox sb, as received on
// UDP (udp) or TCP, and returns the reply in wire format, or nil when the
// query deserves none (not a parseable query). The query counts against
// the sandbox's budget.
func (r *Resolver) Answer(ctx context.Context, sb Sandbox, query []byte, udp bool) []byte {
	st := r.state(sb.ID)
	if !st.admit(r.now(), r.cfg.Rate, r.cfg.Burst) {
		return refuse(query)
	}
	return r.respond(ctx, st, sb, query, udp)
}

// refuse returns a REFUSED reply to query, or nil when query is no query.
func refuse(query []byte) []byte {
	req := new(dns.Msg)
	if err := req.Unpack(query); err != nil || req.Response {
		return nil
	}
	resp := new(dns.Msg)
	resp.SetRcode(req, dns.RcodeRefused)
	b, err := resp.Pack()
	if err != nil {
		return nil
	}
	return b
}

// respond answers an admitted query.
func (r *Resolver) respond(ctx context.Context, st *sandboxState, sb Sandbox, query []byte, udp bool) []byte {
	req := new(dns.Msg)
	if err := req.Unpack(query); err != nil || req.Response {
		return nil
	}
	var resp *dns.Msg
	if st.enter(r.cfg.MaxPending) {
		resp = r.answer(ctx, st, sb, req)
		st.leave()
	} else {
		resp = new(dns.Msg)
		resp.SetRcode(req, dns.RcodeRefused)
	}
	size := dns.MaxMsgSize
	if udp {
		size = dns.MinMsgSize
	}
	if opt := req.IsEdns0(); opt != nil {
		if udp {
			size = min(max(int(opt.UDPSize()), dns.MinMsgSize), ednsSize)
		}
		resp.SetEdns0(ednsSize, false)
	}
	resp.Compress = true
	resp.Truncate(size)
	b, err := resp.Pack()
	if err != nil {
		return nil
	}
	return b
}

// ednsSize is the UDP payload size the resolver offers and asks for
// (DNS flag day 2020).
const ednsSize = 1232

// answer answers req for the sandbox.
func (r *Resolver) answer(ctx context.Context, st *sandboxState, sb Sandbox, req *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	fail := func(rcode int) *dns.Msg {
		resp.Rcode = rcode
		return resp
	}
	if req.Opcode != dns.OpcodeQuery {
		return fail(dns.RcodeRefused)
	}
	if len(req.Question) != 1 {
		return fail(dns.RcodeFormatError)
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET {
		return fail(dns.RcodeRefused)
	}
	switch q.Qtype {
	case dns.TypeANY, dns.TypeAXFR, dns.TypeIXFR:
		return fail(dns.RcodeRefused)
	}
	name, ok := canonical(q.Name)
	if !ok {
		return fail(dns.RcodeNameError)
	}
	if name == netpolicy.APIName {
		if !sb.API.IsValid() {
			if r.cfg.Denied != nil {
				r.cfg.Denied(sb.ID, name)
			}
			return fail(dns.RcodeNameError)
		}
		if q.Qtype == dns.TypeA && sb.API.Is4() {
			resp.Answer = append(resp.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: apiTTL}, A: sb.API.AsSlice()})
		}
		return resp
	}
	if sb.Policy == nil || !sb.Policy.AllowName(name) {
		if r.cfg.Denied != nil {
			r.cfg.Denied(sb.ID, name)
		}
		return fail(dns.RcodeNameError)
	}
	if q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA {
		// Only addresses are forwarded: an allowed name has no other data.
		return resp
	}
	res := r.lookup(ctx, name, q.Qtype)
	if res.rcode != dns.RcodeSuccess {
		return fail(res.rcode)
	}
	addrs := res.addrs
	if !r.internal(name) {
		addrs = publicOnly(addrs)
	}
	addrs = addrs[:min(len(addrs), maxAddrs)]
	now := r.now()
	ttl := uint32(max(res.expires.Sub(now).Round(time.Second)/time.Second, 1))
	for _, a := range addrs {
		hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: ttl}
		if q.Qtype == dns.TypeA {
			resp.Answer = append(resp.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
		} else {
			resp.Answer = append(resp.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	st.record(name, addrs, res.expires.Add(r.cfg.ResolvedGrace), now, r.cfg.MaxResolved)
	return resp
}

func publicOnly(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if isPublic(a) {
			out = append(out, a)
		}
	}
	return out
}
