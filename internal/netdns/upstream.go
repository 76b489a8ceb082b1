package netdns

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// maxChain bounds the CNAME hops of one resolution.
const maxChain = 8

// maxAnswerRRs bounds the records of an upstream answer that are looked at.
const maxAnswerRRs = 64

// hostsTTL is the TTL of answers from Config.Hosts.
const hostsTTL = time.Minute

// A call is an upstream resolution in progress, shared by the queries for
// the same question.
type call struct {
	done chan struct{}
	res  result // set before done is closed
}

// lookup resolves a question of a name the policy allowed: from Hosts,
// the cache, or upstream (one upstream resolution per question at a time).
func (r *Resolver) lookup(ctx context.Context, name string, qtype uint16) result {
	now := r.now()
	if addrs, ok := r.hosts[name]; ok {
		res := result{rcode: dns.RcodeSuccess, expires: now.Add(min(hostsTTL, r.cfg.MaxTTL))}
		for _, a := range addrs {
			if a.Is4() == (qtype == dns.TypeA) {
				res.addrs = append(res.addrs, a)
			}
		}
		return res
	}
	k := cacheKey{name, qtype}
	if res, ok := r.cache.get(k, now); ok {
		return res
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return result{rcode: dns.RcodeServerFailure}
	}
	c, ok := r.calls[k]
	if !ok {
		c = &call{done: make(chan struct{})}
		r.calls[k] = c
		// The resolution is shared: it must not end when the query that
		// started it goes away.
		r.wg.Go(func() {
			rctx, cancel := context.WithTimeout(r.base, r.cfg.QueryTimeout)
			defer cancel()
			c.res = r.resolve(rctx, name, qtype)
			if c.res.rcode != dns.RcodeServerFailure {
				r.cache.put(k, c.res)
			}
			r.mu.Lock()
			delete(r.calls, k)
			r.mu.Unlock()
			close(c.done)
		})
	}
	r.mu.Unlock()
	select {
	case <-c.done:
		return c.res
	case <-ctx.Done():
		return result{rcode: dns.RcodeServerFailure}
	}
}

// resolve asks the upstreams for name, following a CNAME chain that the
// upstream's answer leaves incomplete.
func (r *Resolver) resolve(ctx context.Context, name string, qtype uint16) result {
	servfail := result{rcode: dns.RcodeServerFailure}
	target := name
	ttl := r.cfg.MaxTTL
	hops := 0
	for {
		m, err := r.exchange(ctx, target, qtype)
		if err != nil {
			return servfail
		}
		if m.Rcode == dns.RcodeNameError {
			return r.negative(m, dns.RcodeNameError)
		}
		addrs, next, n, minTTL := extract(m, target, qtype)
		ttl = min(ttl, minTTL)
		hops += n
		if hops > maxChain {
			return servfail
		}
		if len(addrs) > 0 {
			ttl = max(ttl, r.cfg.MinTTL)
			return result{rcode: dns.RcodeSuccess, addrs: addrs, expires: r.now().Add(ttl)}
		}
		if next == "" {
			return r.negative(m, dns.RcodeSuccess)
		}
		target = next
	}
}

// negative returns the cached form of an NXDOMAIN or empty answer: its TTL
// is the SOA's negative TTL, clamped to [MinTTL, NegativeTTL].
func (r *Resolver) negative(m *dns.Msg, rcode int) result {
	ttl := r.cfg.NegativeTTL
	for _, rr := range m.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			ttl = min(ttl, time.Duration(min(soa.Hdr.Ttl, soa.Minttl))*time.Second)
			break
		}
	}
	ttl = max(ttl, r.cfg.MinTTL)
	return result{rcode: rcode, expires: r.now().Add(ttl)}
}

// extract follows the CNAME chain from name through m's answer section
// and returns the addresses of type qtype at its end, or, when the chain
// ends at another name without them, that name (next) to ask about. hops
// counts the CNAMEs followed; ttl is the least TTL of the records used.
// Records that are not on the chain are ignored.
func extract(m *dns.Msg, name string, qtype uint16) (addrs []netip.Addr, next string, hops int, ttl time.Duration) {
	ttl = time.Duration(1<<31) * time.Second
	rrs := m.Answer
	if len(rrs) > maxAnswerRRs {
		rrs = rrs[:maxAnswerRRs]
	}
	cur := name
	for {
		for _, rr := range rrs {
			h := rr.Header()
			if h.Class != dns.ClassINET || h.Rrtype != qtype || !strings.EqualFold(strings.TrimSuffix(h.Name, "."), cur) {
				continue
			}
			var a netip.Addr
			switch rr := rr.(type) {
			case *dns.A:
				a, _ = netip.AddrFromSlice(rr.A.To4())
			case *dns.AAAA:
				a, _ = netip.AddrFromSlice(rr.AAAA.To16())
				if a.Is4In6() {
					// Judged as what it is, never shown as an A record.
					a = netip.Addr{}
				}
			}
			if a.IsValid() && len(addrs) < maxAddrs {
				addrs = append(addrs, a)
				ttl = min(ttl, time.Duration(h.Ttl)*time.Second)
			}
		}
		if len(addrs) > 0 {
			return addrs, "", hops, ttl
		}
		var target string
		for _, rr := range rrs {
			if c, ok := rr.(*dns.CNAME); ok && c.Hdr.Class == dns.ClassINET && strings.EqualFold(strings.TrimSuffix(c.Hdr.Name, "."), cur) {
				target = c.Target
				ttl = min(ttl, time.Duration(c.Hdr.Ttl)*time.Second)
				break
			}
		}
		if target == "" {
			if cur == name {
				return nil, "", hops, ttl
			}
			return nil, cur, hops, ttl
		}
		t, ok := canonical(target)
		if !ok {
			return nil, "", hops, ttl
		}
		hops++
		if hops > maxChain {
			return nil, "", hops, ttl
		}
		cur = t
	}
}

// warnEvery bounds how often a failing upstream is logged.
const warnEvery = 10 * time.Second

var errMismatch = errors.New("upstream answer does not match the question")

// exchange sends one question to the upstreams in turn and returns the
// first answer that matches it and is NOERROR or NXDOMAIN. A truncated UDP
// answer is asked again over TCP.
func (r *Resolver) exchange(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	select {
	case r.inflight <- struct{}{}:
		defer func() { <-r.inflight }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var lastErr error
	for _, up := range r.upstreams {
		m, err := r.exchangeOne(ctx, up, name, qtype)
		if err == nil {
			return m, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	if now := r.now(); now.Sub(time.Unix(0, r.lastWarn.Load())) > warnEvery {
		r.lastWarn.Store(now.UnixNano())
		r.cfg.Logger.Warn("dns upstreams failed", "name", name, "err", lastErr)
	}
	return nil, lastErr
}

func (r *Resolver) exchangeOne(ctx context.Context, up, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype) // a random ID (dns.Id, crypto/rand)
	m.RecursionDesired = true
	m.SetEdns0(ednsSize, false)
	ask := func(network string) (*dns.Msg, error) {
		c := &dns.Client{Net: network, Timeout: r.cfg.Timeout, UDPSize: ednsSize}
		actx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		defer cancel()
		resp, _, err := c.ExchangeContext(actx, m, up)
		if err != nil {
			return nil, err
		}
		if !matches(resp, m) {
			return nil, errMismatch
		}
		return resp, nil
	}
	resp, err := ask("udp")
	if err == nil && resp.Truncated {
		m.Id = dns.Id()
		resp, err = ask("tcp")
	}
	if err != nil {
		return nil, err
	}
	if resp.Rcode != dns.RcodeSuccess && resp.Rcode != dns.RcodeNameError {
		return nil, errors.New("upstream answered " + dns.RcodeToString[resp.Rcode])
	}
	return resp, nil
}

// matches reports whether resp answers req: same ID (checked by the
// client too), a response, and exactly req's question.
func matches(resp, req *dns.Msg) bool {
	if resp.Id != req.Id || !resp.Response || resp.Opcode != dns.OpcodeQuery || len(resp.Question) != 1 {
		return false
	}
	q, rq := resp.Question[0], req.Question[0]
	return q.Qtype == rq.Qtype && q.Qclass == rq.Qclass && strings.EqualFold(q.Name, rq.Name)
}
