package netproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsecproject/dsec/internal/netdns"
	"github.com/dsecproject/dsec/internal/netpolicy"
)

// MaxDenials is how many of a sandbox's recent denials are kept.
const MaxDenials = 64

// Config configures a Proxy; its zero value works.
type Config struct {
	// Resolved returns the names sandbox resolved to ip through the node
	// resolver (netdns.Resolver.Resolved). Default: none.
	Resolved func(sandbox string, ip netip.Addr) []string
	// Dial dials an allowed destination. Default: a net.Dialer with
	// DialTimeout, in the calling goroutine's (the host's) namespace.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// PeekTimeout bounds the wait for a connection's first bytes (its
	// TLS ClientHello or HTTP request head); a connection that sends
	// nothing by then (a protocol where the server speaks first) is
	// judged without a name. Default 300 ms.
	PeekTimeout time.Duration
	// PeekBytes bounds what is read before judging. Default 16 KiB + 5
	// (one TLS record).
	PeekBytes int
	// DialTimeout bounds a dial. Default 10 s.
	DialTimeout time.Duration
	// MaxConns bounds one sandbox's connections at once. Default 512.
	MaxConns int
	// Rate and Burst bound one sandbox's new connections a second.
	// Defaults 100 and 200.
	Rate  float64
	Burst int
	// MaxNodeConns bounds the node's connections at once. Default 16,384.
	MaxNodeConns int
	// API, when set, connects a sandbox whose policy allows dsec-api to
	// the platform's API (the connection to its gateway's
	// netpolicy.APIPort goes there), saying which sandbox it is from.
	// Nil: dsec-api is refused.
	API func(ctx context.Context, sandbox string) (net.Conn, error)
	// Local reports whether the node delivers a connection to the
	// address to itself (one of its own addresses, loopback, a
	// broadcast): asked for every connection and UDP flow, so that an
	// address the node gained after the catalogue's Local was taken is
	// special too (netpolicy.Dest.Local). OpenNode asks the host's
	// routing table. Default: never.
	Local func(netip.Addr) bool
	// Logger receives warnings. Default: discard.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Resolved == nil {
		c.Resolved = func(string, netip.Addr) []string { return nil }
	}
	if c.Local == nil {
		c.Local = func(netip.Addr) bool { return false }
	}
	if c.PeekTimeout <= 0 {
		c.PeekTimeout = 300 * time.Millisecond
	}
	if c.PeekBytes <= 0 {
		c.PeekBytes = 5 + 1<<14
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.Dial == nil {
		d := &net.Dialer{Timeout: c.DialTimeout}
		c.Dial = d.DialContext
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 512
	}
	if c.Rate <= 0 {
		c.Rate = 100
	}
	if c.Burst <= 0 {
		c.Burst = 200
	}
	if c.MaxNodeConns <= 0 {
		c.MaxNodeConns = 16384
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Stats are a sandbox's counters since it was registered.
type Stats struct {
	BytesOut, BytesIn     int64
	ConnsOut, ConnsActive int64
	Denied                int64
	DNSQueries, DNSDenied int64
	Denials               []Denial
}

// Denial is one denied connection or name.
type Denial struct {
	Time time.Time
	// Dest is "ADDR:PORT/tcp", or the name for a lookup.
	Dest string
	// Name is the SNI or Host the connection gave, if any.
	Name   string
	Reason string
}

// Proxy is the node's egress proxy. Its methods are safe for concurrent
// use.
type Proxy struct {
	cfg   Config
	conns atomic.Int64 // the node's connections

	mu sync.Mutex
	// guarded by mu
	byAddr map[netip.Addr]*sandbox
	byID   map[string]*sandbox
	// retired are the counters of the sandboxes removed, so that the
	// node's totals never go down.
	retired Stats
}

// New returns a proxy with no sandboxes: it refuses every connection
// until Set registers their sources.
func New(cfg Config) *Proxy {
	cfg.setDefaults()
	return &Proxy{cfg: cfg, byAddr: map[netip.Addr]*sandbox{}, byID: map[string]*sandbox{}}
}

// sandbox is one sandbox's state in the proxy.
type sandbox struct {
	id   string
	addr netip.Addr
	// gateway is the router's end of its link, where it finds the API.
	gateway atomic.Pointer[netip.Addr]
	policy  atomic.Pointer[netpolicy.Policy]

	bytesOut, bytesIn, connsOut, active, denied, dnsQueries, dnsDenied atomic.Int64

	mu sync.Mutex
	// guarded by mu
	conns   map[*conn]struct{}
	denials []Denial // a ring of MaxDenials, oldest at head once full
	head    int
	tokens  float64
	last    time.Time
	gone    bool
}

// conn is an allowed connection, kept so that a policy update can judge
// it again.
type conn struct {
	dest  netpolicy.Dest
	names []string
	// api: the connection goes to the platform's API (dsec-api).
	api    bool
	client *net.TCPConn
	mu     sync.Mutex
	// guarded by mu
	upstream net.Conn
	cut      bool
	// cancelDial ends the dial in flight, if any.
	cancelDial context.CancelFunc
}

// close cuts both sides; the client gets a reset.
func (c *conn) close() {
	c.mu.Lock()
	c.cut = true
	up := c.upstream
	if c.cancelDial != nil {
		c.cancelDial()
	}
	c.mu.Unlock()
	c.client.SetLinger(0)
	c.client.Close()
	if up != nil {
		up.Close()
	}
}

// Set registers sandbox id at source address addr, with gateway (the
// router's end of its link) under policy pol, or replaces its policy: new
// connections see pol at once, and established ones pol no longer allows
// are cut before Set returns. It returns how many were cut.
func (p *Proxy) Set(id string, addr, gateway netip.Addr, pol *netpolicy.Policy) (int, error) {
	if pol == nil {
		return 0, errors.New("netproxy: nil policy")
	}
	addr = addr.Unmap()
	p.mu.Lock()
	sb := p.byID[id]
	if other := p.byAddr[addr]; other != nil && other != sb {
		p.mu.Unlock()
		return 0, fmt.Errorf("netproxy: address %s is sandbox %s's", addr, other.id)
	}
	if sb != nil && sb.addr != addr {
		delete(p.byAddr, sb.addr)
		sb.addr = addr
	}
	if sb == nil {
		sb = &sandbox{id: id, addr: addr, conns: map[*conn]struct{}{}, tokens: float64(p.cfg.Burst), last: time.Now()}
		p.byID[id] = sb
	}
	p.byAddr[addr] = sb
	p.mu.Unlock()
	gw := gateway.Unmap()
	sb.gateway.Store(&gw)
	sb.policy.Store(pol)
	return sb.rejudge(pol), nil
}

// rejudge cuts the connections pol no longer allows.
func (sb *sandbox) rejudge(pol *netpolicy.Policy) int {
	sb.mu.Lock()
	var cut []*conn
	for c := range sb.conns {
		if !c.allowed(pol) {
			cut = append(cut, c)
			delete(sb.conns, c)
		}
	}
	sb.mu.Unlock()
	for _, c := range cut {
		c.close()
	}
	return len(cut)
}

// allowed says whether pol allows the established connection c.
func (c *conn) allowed(pol *netpolicy.Policy) bool {
	if c.api {
		return pol.AllowAPI()
	}
	return decide(pol, c.dest, c.names).Allow
}

// Remove forgets sandbox id and cuts its connections.
func (p *Proxy) Remove(id string) {
	p.mu.Lock()
	sb := p.byID[id]
	if sb != nil {
		delete(p.byID, id)
		if p.byAddr[sb.addr] == sb {
			delete(p.byAddr, sb.addr)
		}
		sb.addTo(&p.retired)
	}
	p.mu.Unlock()
	if sb == nil {
		return
	}
	sb.mu.Lock()
	sb.gone = true
	conns := sb.conns
	sb.conns = map[*conn]struct{}{}
	sb.mu.Unlock()
	for c := range conns {
		c.close()
	}
}

// Stats returns sandbox id's counters and recent denials.
func (p *Proxy) Stats(id string) (Stats, bool) {
	p.mu.Lock()
	sb := p.byID[id]
	p.mu.Unlock()
	if sb == nil {
		return Stats{}, false
	}
	st := Stats{
		BytesOut: sb.bytesOut.Load(), BytesIn: sb.bytesIn.Load(),
		ConnsOut: sb.connsOut.Load(), ConnsActive: sb.active.Load(),
		Denied: sb.denied.Load(), DNSQueries: sb.dnsQueries.Load(), DNSDenied: sb.dnsDenied.Load(),
	}
	sb.mu.Lock()
	n := len(sb.denials)
	for i := range n {
		st.Denials = append(st.Denials, sb.denials[(sb.head+i)%n])
	}
	sb.mu.Unlock()
	return st, true
}

// Totals are the node's counters: those of every sandbox registered since
// the proxy started, the removed ones included (ConnsActive counts the
// open connections only), and how many sandboxes it holds now.
func (p *Proxy) Totals() (st Stats, sandboxes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st = p.retired
	st.ConnsActive = 0
	for _, sb := range p.byID {
		sb.addTo(&st)
		st.ConnsActive += sb.active.Load()
	}
	return st, len(p.byID)
}

// addTo adds sb's counters but the open connections to st.
func (sb *sandbox) addTo(st *Stats) {
	st.BytesOut += sb.bytesOut.Load()
	st.BytesIn += sb.bytesIn.Load()
	st.ConnsOut += sb.connsOut.Load()
	st.Denied += sb.denied.Load()
	st.DNSQueries += sb.dnsQueries.Load()
	st.DNSDenied += sb.dnsDenied.Load()
}

func (p *Proxy) bySource(a netip.Addr) *sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byAddr[a.Unmap()]
}

// Sandbox makes the proxy the node resolver's view: a query's source
// address names its sandbox, whose current policy judges the names.
// Queries from other sources get no reply.
func (p *Proxy) Sandbox(remote net.Addr) (netdns.Sandbox, bool) {
	ap, ok := addrPort(remote)
	if !ok {
		return netdns.Sandbox{}, false
	}
	sb := p.bySource(ap.Addr())
	if sb == nil {
		return netdns.Sandbox{}, false
	}
	sb.dnsQueries.Add(1)
	view := netdns.Sandbox{ID: sb.id, Policy: (*livePolicy)(sb)}
	if pol := sb.policy.Load(); pol != nil && pol.AllowAPI() && p.cfg.API != nil {
		view.API = *sb.gateway.Load()
	}
	return view, true
}

// livePolicy judges names by the sandbox's policy of the moment.
type livePolicy sandbox

func (l *livePolicy) AllowName(name string) bool {
	pol := (*sandbox)(l).policy.Load()
	return pol != nil && pol.AllowName(name)
}

// DeniedName records that sandbox id's lookup of name was denied (for
// netdns.Config.Denied).
func (p *Proxy) DeniedName(id, name string) {
	p.mu.Lock()
	sb := p.byID[id]
	p.mu.Unlock()
	if sb == nil {
		return
	}
	sb.dnsDenied.Add(1)
	sb.record(Denial{Time: time.Now(), Dest: name, Reason: "denied: the policy allows no connection to this name, so it does not resolve (NXDOMAIN)"})
}

func (sb *sandbox) record(d Denial) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if len(sb.denials) < MaxDenials {
		sb.denials = append(sb.denials, d)
		return
	}
	sb.denials[sb.head] = d
	sb.head = (sb.head + 1) % MaxDenials
}

// admit takes a token of the sandbox's connection rate and a place among
// its connections.
func (sb *sandbox) admit(cfg *Config, now time.Time) (string, bool) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return "denied: the sandbox has no network", false
	}
	sb.tokens = min(float64(cfg.Burst), sb.tokens+now.Sub(sb.last).Seconds()*cfg.Rate)
	sb.last = now
	if sb.tokens < 1 {
		return fmt.Sprintf("denied: more than %g new connections a second from this sandbox", cfg.Rate), false
	}
	if int(sb.active.Load()) >= cfg.MaxConns {
		return fmt.Sprintf("denied: this sandbox already has %d connections open", cfg.MaxConns), false
	}
	sb.tokens--
	sb.active.Add(1)
	return "", true
}

// Serve accepts connections on ln (a TCP listener in the router
// namespace, where the firewall redirects the sandboxes' connections)
// until ctx ends; it closes ln, cuts every connection and returns once
// every goroutine it started is done.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var err error
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			if ctx.Err() == nil {
				err = fmt.Errorf("egress proxy: accept: %w", aerr)
			}
			break
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		if p.conns.Add(1) > int64(p.cfg.MaxNodeConns) {
			p.conns.Add(-1)
			reset(tc)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.conns.Add(-1)
			p.handle(ctx, tc)
		}()
	}
	cancel()
	p.mu.Lock()
	ids := make([]*sandbox, 0, len(p.byID))
	for _, sb := range p.byID {
		ids = append(ids, sb)
	}
	p.mu.Unlock()
	for _, sb := range ids {
		sb.mu.Lock()
		conns := sb.conns
		sb.conns = map[*conn]struct{}{}
		sb.mu.Unlock()
		for c := range conns {
			c.close()
		}
	}
	wg.Wait()
	return err
}

// reset closes c with a RST: the client learns at once.
func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func addrPort(a net.Addr) (netip.AddrPort, bool) {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort(), true
	case *net.UDPAddr:
		return a.AddrPort(), true
	}
	return netip.AddrPort{}, false
}

// decide judges d under pol with each name the connection gave (allowed
// only when every one is), or without a name when it gave none.
func decide(pol *netpolicy.Policy, d netpolicy.Dest, names []string) netpolicy.Decision {
	if len(names) == 0 {
		return pol.Decide(d)
	}
	var dec netpolicy.Decision
	for _, n := range names {
		d.Name = n
		dec = pol.Decide(d)
		if !dec.Allow {
			return dec
		}
	}
	return dec
}

func (p *Proxy) handle(ctx context.Context, client *net.TCPConn) {
	src, ok := addrPort(client.RemoteAddr())
	if !ok {
		reset(client)
		return
	}
	sb := p.bySource(src.Addr())
	if sb == nil {
		// No sandbox of ours (or not yet restored): fail closed.
		reset(client)
		return
	}
	dst, err := originalDst(client)
	if err != nil {
		p.cfg.Logger.Warn("egress proxy: original destination", "sandbox", sb.id, "err", err)
		reset(client)
		return
	}
	destText := fmt.Sprintf("%s/tcp", dst)
	now := time.Now()
	if why, ok := sb.admit(&p.cfg, now); !ok {
		sb.denied.Add(1)
		sb.record(Denial{Time: now, Dest: destText, Reason: why})
		reset(client)
		return
	}
	defer sb.active.Add(-1)

	head, names, bad := p.peek(client)
	d := netpolicy.Dest{Addr: dst.Addr().Unmap(), Port: dst.Port(), Protocol: netpolicy.TCP, Resolved: p.cfg.Resolved(sb.id, dst.Addr().Unmap()), Local: p.cfg.Local(dst.Addr())}
	name := ""
	if len(names) > 0 {
		name = names[0]
	}
	if bad {
		sb.denied.Add(1)
		sb.record(Denial{Time: time.Now(), Dest: destText, Reason: "denied: its first bytes are a TLS ClientHello or an HTTP request the proxy cannot read"})
		reset(client)
		return
	}
	c := &conn{dest: d, names: names, client: client}
	// A connection to the gateway's API port is for the platform's API.
	c.api = dst.Port() == netpolicy.APIPort && dst.Addr().Unmap() == *sb.gateway.Load()
	pol := sb.policy.Load()
	dec := c.decide(pol, p.cfg.API != nil)
	if dec.Allow {
		// Registered before the policy is read again: an update between
		// the two either sees this connection or is seen here.
		sb.mu.Lock()
		if sb.gone {
			sb.mu.Unlock()
			dec = netpolicy.Decision{Reason: netpolicy.ReasonNone}
		} else {
			sb.conns[c] = struct{}{}
			sb.mu.Unlock()
			if now := sb.policy.Load(); now != pol {
				dec = c.decide(now, p.cfg.API != nil)
			}
		}
	}
	if !dec.Allow {
		sb.drop(c)
		sb.denied.Add(1)
		sb.record(Denial{Time: time.Now(), Dest: destText, Name: name, Reason: dec.String()})
		reset(client)
		return
	}
	defer sb.drop(c)
	sb.connsOut.Add(1)

	// A cut (a revoke, the sandbox's deletion) ends the dial too: a
	// sandbox gone must not leave one waiting out DialTimeout.
	dctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	c.mu.Lock()
	if c.cut {
		c.mu.Unlock()
		cancel()
		reset(client)
		return
	}
	c.cancelDial = cancel
	c.mu.Unlock()
	var up net.Conn
	if c.api {
		up, err = p.cfg.API(dctx, sb.id)
	} else {
		up, err = p.cfg.Dial(dctx, "tcp", dst.String())
	}
	cancel()
	if err != nil {
		reset(client)
		return
	}
	c.mu.Lock()
	if c.cut {
		c.mu.Unlock()
		up.Close()
		return
	}
	c.upstream = up
	c.mu.Unlock()
	defer up.Close()
	defer client.Close()
	if !c.api && len(head) > 0 && head[0] != 0x16 && looksHTTP(head) {
		// Plain HTTP/1: every request is judged (http1.go).
		p.pipeHTTP1(sb, c, client, up, head)
		return
	}
	if len(head) > 0 {
		if _, err := up.Write(head); err != nil {
			reset(client)
			return
		}
		sb.bytesOut.Add(int64(len(head)))
	}
	pipe(sb, client, up)
}

// decide judges a new connection c under pol; serving says whether the
// node serves the platform's API.
func (c *conn) decide(pol *netpolicy.Policy, serving bool) netpolicy.Decision {
	if !c.api {
		return decide(pol, c.dest, c.names)
	}
	if pol.AllowAPI() && !serving {
		return netpolicy.Decision{Reason: netpolicy.ReasonNoAPI}
	}
	return netpolicy.Decision{Allow: pol.AllowAPI(), Reason: netpolicy.ReasonAPI}
}

func (sb *sandbox) drop(c *conn) {
	sb.mu.Lock()
	delete(sb.conns, c)
	sb.mu.Unlock()
}

// peek reads the connection's first bytes, within the time and size
// bounds, and the name they give.
func (p *Proxy) peek(c *net.TCPConn) (head []byte, names []string, bad bool) {
	buf := make([]byte, 0, 2048)
	deadline := time.Now().Add(p.cfg.PeekTimeout)
	c.SetReadDeadline(deadline)
	defer c.SetReadDeadline(time.Time{})
	for {
		if len(buf) == cap(buf) {
			if cap(buf) >= p.cfg.PeekBytes {
				return buf, nil, true
			}
			nb := make([]byte, len(buf), min(2*cap(buf), p.cfg.PeekBytes))
			copy(nb, buf)
			buf = nb
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if n > 0 {
			name, st := peekName(buf)
			switch st {
			case peekDone:
				if name != "" {
					names = []string{name}
				}
				return buf, names, false
			case peekBad:
				return buf, nil, true
			}
		}
		if err != nil {
			if len(buf) == 0 && (errors.Is(err, io.EOF) || isTimeout(err)) {
				// Nothing sent: a protocol where the server speaks
				// first (or a client that only half-closed).
				return nil, nil, false
			}
			// A TLS ClientHello or HTTP head begun and not finished
			// in time: refused rather than judged without its name.
			return buf, nil, len(buf) > 0
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// pipe copies both ways until both directions end, passing each side's
// end of stream to the other (half-close). Between two *net.TCPConn,
// io.Copy splices.
func pipe(sb *sandbox, client *net.TCPConn, up net.Conn) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		n, _ := io.Copy(up, client)
		sb.bytesOut.Add(n)
		closeWrite(up)
	}()
	n, _ := io.Copy(client, up)
	sb.bytesIn.Add(n)
	client.CloseWrite()
	wg.Wait()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}
