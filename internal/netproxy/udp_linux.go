package netproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/netpolicy"
)

// UDPConfig bounds the UDP relay; its zero value takes the defaults.
type UDPConfig struct {
	// Idle closes a flow that carried nothing either way for this long.
	// Default 60 s.
	Idle time.Duration
	// MaxFlows bounds one sandbox's flows at once. Default 256.
	MaxFlows int
	// Rate and Burst bound one sandbox's datagrams out a second. Defaults
	// 1,000 and 2,000, the firewall's meter in front of the relay's socket.
	Rate  float64
	Burst int
	// MaxNodeFlows bounds the node's flows at once. Default 8,192.
	MaxNodeFlows int
	// DenialRate is how many of a sandbox's UDP denials a second are
	// recorded (all are counted), so a flood does not fill its log with
	// one destination. Default 5, bursts of 10.
	DenialRate float64
}

func (c *UDPConfig) setDefaults() {
	if c.Idle <= 0 {
		c.Idle = time.Minute
	}
	if c.MaxFlows <= 0 {
		c.MaxFlows = 256
	}
	if c.Rate <= 0 {
		c.Rate = 1000
	}
	if c.Burst <= 0 {
		c.Burst = 2000
	}
	if c.MaxNodeFlows <= 0 {
		c.MaxNodeFlows = 8192
	}
	if c.DenialRate <= 0 {
		c.DenialRate = 5
	}
}

// UDPStats are a sandbox's UDP counters since its first datagram. Their
// bytes and denials are also in its Stats.
type UDPStats struct {
	Flows                     int64 // open now
	FlowsTotal                int64
	DatagramsOut, DatagramsIn int64
	BytesOut, BytesIn         int64
	Denied                    int64 // datagrams of new flows the policy or a bound refused
	Dropped                   int64 // datagrams over the rate or a full queue
}

// udpRelay relays the sandboxes' UDP other than DNS. The firewall gives
// it every such datagram by TPROXY on one transparent socket in the router
// namespace, which reads each datagram's original destination; an allowed
// flow goes out through a socket of its own in the host's namespace, and
// its replies come back through a transparent socket in the router
// namespace bound to the original destination, so the sandbox sees them
// from the address and port it sent to.
type udpRelay struct {
	p   *Proxy
	cfg UDPConfig
	pc  *net.UDPConn
	// mk makes reply sockets in the router namespace (a goroutine locked
	// there serves it).
	mk    chan mkReq
	flows atomic.Int64   // the node's
	wg    sync.WaitGroup // the flows' goroutines

	mu sync.Mutex
	// guarded by mu
	byKey map[flowKey]*udpFlow
	byID  map[string]*udpState
}

type flowKey struct{ src, dst netip.AddrPort }

// udpState is one sandbox's UDP budget and counters.
type udpState struct {
	flowsTotal, dgOut, dgIn, bytesOut, bytesIn, denied, dropped atomic.Int64

	// guarded by the relay's mu
	sb     *sandbox
	flows  map[*udpFlow]struct{}
	tokens float64
	dtoks  float64 // denials to record
	last   time.Time
	// revoked counts flows a datagram found judged under an older policy
	// that no longer allows them, and cut, between a policy's store and
	// its rejudge: that rejudge counts them as its own.
	revoked int
}

type udpFlow struct {
	key   flowKey
	sb    *sandbox
	st    *udpState
	pol   atomic.Pointer[netpolicy.Policy] // judged under
	dest  netpolicy.Dest
	idle  time.Duration
	out   chan []byte
	done  chan struct{}
	once  sync.Once
	last  atomic.Int64 // unix nanoseconds of the last datagram either way
	mu    sync.Mutex
	conns []net.Conn // guarded by mu: the upstream and reply sockets, once made
}

type mkReq struct {
	addr netip.AddrPort
	res  chan mkRes
}

type mkRes struct {
	c   *net.UDPConn
	err error
}

// transparent sets IP_TRANSPARENT and SO_REUSEADDR (a reply socket shares
// its destination's address and port with the others sending from it).
func transparent(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1); serr != nil {
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// listenUDPRelay makes the relay's transparent socket; it must run inside
// the router namespace.
func listenUDPRelay() (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		if err := transparent(network, address, c); err != nil {
			return err
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_RECVORIGDSTADDR, 1); serr != nil {
				return
			}
			// Room for bursts from every sandbox; the firewall meters each.
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:0")
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}

// serveMaker makes reply sockets until ctx ends; it runs on a thread in
// the router namespace.
func serveMaker(ctx context.Context, mk chan mkReq) error {
	lc := net.ListenConfig{Control: transparent}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-mk:
			pc, err := lc.ListenPacket(ctx, "udp4", r.addr.String())
			if err != nil {
				r.res <- mkRes{err: err}
				continue
			}
			c := pc.(*net.UDPConn)
			// It only sends: what arrives for its address goes to the
			// relay's socket by TPROXY, and it keeps no queue worth
			// filling.
			if rc, err := c.SyscallConn(); err == nil {
				rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 1) })
			}
			r.res <- mkRes{c: c}
		}
	}
}

func newUDPRelay(p *Proxy, cfg UDPConfig, pc *net.UDPConn) *udpRelay {
	cfg.setDefaults()
	return &udpRelay{p: p, cfg: cfg, pc: pc, mk: make(chan mkReq),
		byKey: map[flowKey]*udpFlow{}, byID: map[string]*udpState{}}
}

// port is the relay socket's port, for the firewall.
func (r *udpRelay) port() uint16 { return uint16(r.pc.LocalAddr().(*net.UDPAddr).Port) }

// origDst reads IP_ORIGDSTADDR from a datagram's control messages.
func origDst(oob []byte) (netip.AddrPort, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.AddrPort{}, false
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_IP || m.Header.Type != unix.IP_ORIGDSTADDR || len(m.Data) < 8 {
			continue
		}
		if binary.NativeEndian.Uint16(m.Data[0:2]) != unix.AF_INET {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Data[4:8])), binary.BigEndian.Uint16(m.Data[2:4])), true
	}
	return netip.AddrPort{}, false
}

// serve reads the sandboxes' datagrams until ctx ends, then closes every
// flow.
func (r *udpRelay) serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { r.pc.Close() })
	defer stop()
	defer r.wg.Wait()
	defer r.closeAll()
	buf := make([]byte, 65536)
	oob := make([]byte, 128)
	for {
		n, oobn, _, src, err := r.pc.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("udp relay: %w", err)
			}
			continue
		}
		dst, ok := origDst(oob[:oobn])
		if !ok {
			continue
		}
		r.datagram(ctx, src, dst, buf[:n])
	}
}

// state returns sb's UDP state, made on its first datagram. r.mu held.
func (r *udpRelay) state(sb *sandbox, now time.Time) *udpState {
	st := r.byID[sb.id]
	if st == nil || st.sb != sb {
		st = &udpState{sb: sb, flows: map[*udpFlow]struct{}{}, tokens: float64(r.cfg.Burst), dtoks: 2 * r.cfg.DenialRate, last: now}
		r.byID[sb.id] = st
	}
	return st
}

// deny counts a refused datagram and records it within the denial rate.
// r.mu held.
func (r *udpRelay) deny(st *udpState, dst netip.AddrPort, reason string, now time.Time) {
	st.denied.Add(1)
	st.sb.denied.Add(1)
	if st.dtoks < 1 {
		return
	}
	st.dtoks--
	st.sb.record(Denial{Time: now, Dest: fmt.Sprintf("%s/udp", dst), Reason: reason})
}

func (r *udpRelay) datagram(ctx context.Context, src, dst netip.AddrPort, b []byte) {
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	sb := r.p.bySource(src.Addr())
	if sb == nil {
		return // no sandbox of ours: fail closed
	}
	now := time.Now()
	key := flowKey{src, dst}
	r.mu.Lock()
	st := r.state(sb, now)
	dt := now.Sub(st.last).Seconds()
	st.last = now
	st.tokens = min(float64(r.cfg.Burst), st.tokens+dt*r.cfg.Rate)
	st.dtoks = min(2*r.cfg.DenialRate, st.dtoks+dt*r.cfg.DenialRate)
	if st.tokens < 1 {
		st.dropped.Add(1)
		r.mu.Unlock()
		return
	}
	st.tokens--
	f := r.byKey[key]
	if f != nil && (f.sb != sb || f.pol.Load() != sb.policy.Load()) {
		// The address changed hands, or the policy changed since the
		// flow was judged: judge it again.
		pol := sb.policy.Load()
		if f.sb != sb || pol == nil || !pol.Decide(f.dest).Allow {
			if f.sb == sb {
				st.revoked++
			}
			r.unlink(f)
			go f.close()
			f = nil
		} else {
			f.pol.Store(pol)
		}
	}
	if f == nil {
		f = r.open(ctx, sb, st, key, now)
	}
	r.mu.Unlock()
	if f == nil {
		return
	}
	f.last.Store(now.UnixNano())
	select {
	case f.out <- append([]byte(nil), b...):
	default:
		st.dropped.Add(1)
	}
}

// open judges and starts a new flow, or records its denial. r.mu held.
func (r *udpRelay) open(ctx context.Context, sb *sandbox, st *udpState, key flowKey, now time.Time) *udpFlow {
	pol := sb.policy.Load()
	dst := key.dst
	d := netpolicy.Dest{Addr: dst.Addr(), Port: dst.Port(), Protocol: netpolicy.UDP, Resolved: r.p.cfg.Resolved(sb.id, dst.Addr()), Local: r.p.cfg.Local(dst.Addr())}
	if pol == nil {
		r.deny(st, dst, "denied: the sandbox has no network", now)
		return nil
	}
	if dec := pol.Decide(d); !dec.Allow {
		r.deny(st, dst, dec.String(), now)
		return nil
	}
	if len(st.flows) >= r.cfg.MaxFlows {
		r.deny(st, dst, fmt.Sprintf("denied: this sandbox already has %d UDP flows open", r.cfg.MaxFlows), now)
		return nil
	}
	if r.flows.Load() >= int64(r.cfg.MaxNodeFlows) {
		r.deny(st, dst, "denied: the node has as many UDP flows open as it allows; try again later", now)
		return nil
	}
	f := &udpFlow{key: key, sb: sb, st: st, dest: d, idle: r.cfg.Idle, out: make(chan []byte, 64), done: make(chan struct{})}
	f.pol.Store(pol)
	f.last.Store(now.UnixNano())
	r.byKey[key] = f
	st.flows[f] = struct{}{}
	r.flows.Add(1)
	st.flowsTotal.Add(1)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.run(ctx, f)
	}()
	return f
}

// unlink forgets f. r.mu held.
func (r *udpRelay) unlink(f *udpFlow) {
	if r.byKey[f.key] != f {
		return
	}
	delete(r.byKey, f.key)
	delete(f.st.flows, f)
	r.flows.Add(-1)
}

func (f *udpFlow) close() {
	f.once.Do(func() {
		close(f.done)
		f.mu.Lock()
		conns := f.conns
		f.conns = nil
		f.mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
}

// keep registers c to be closed with f; false (and c closed) when f is
// already closed.
func (f *udpFlow) keep(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.done:
		c.Close()
		return false
	default:
	}
	f.conns = append(f.conns, c)
	return true
}

// run sets up f's sockets, then copies its datagrams both ways until it
// is closed or idle.
func (r *udpRelay) run(ctx context.Context, f *udpFlow) {
	defer func() {
		r.mu.Lock()
		r.unlink(f)
		r.mu.Unlock()
		f.close()
	}()
	dctx, cancel := context.WithTimeout(ctx, r.p.cfg.DialTimeout)
	up, err := r.p.cfg.Dial(dctx, "udp4", f.key.dst.String())
	cancel()
	if err != nil || !f.keep(up) {
		return
	}
	res := make(chan mkRes, 1)
	select {
	case r.mk <- mkReq{addr: f.key.dst, res: res}:
	case <-f.done:
		return
	case <-ctx.Done():
		return
	}
	rep := <-res
	if rep.err != nil {
		r.p.cfg.Logger.Warn("udp relay: reply socket", "sandbox", f.sb.id, "dest", f.key.dst, "err", rep.err)
		return
	}
	if !f.keep(rep.c) {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.replies(f, up, rep.c)
	}()
	st, sb := f.st, f.sb
	for {
		select {
		case <-f.done:
			return
		case b := <-f.out:
			// Counted before the write: a reply can come back (and be
			// counted) before the write returns.
			st.dgOut.Add(1)
			st.bytesOut.Add(int64(len(b)))
			sb.bytesOut.Add(int64(len(b)))
			if _, err := up.Write(b); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
				st.dgOut.Add(-1)
				st.bytesOut.Add(-int64(len(b)))
				sb.bytesOut.Add(-int64(len(b)))
				return
			}
		}
	}
}

// replies sends what up receives to the sandbox from the flow's original
// destination, until f is closed or idle.
func (r *udpRelay) replies(f *udpFlow, up net.Conn, rep *net.UDPConn) {
	defer f.close()
	buf := make([]byte, 65536)
	st, sb := f.st, f.sb
	for {
		last := time.Unix(0, f.last.Load())
		if time.Since(last) >= f.idle {
			return
		}
		up.SetReadDeadline(last.Add(f.idle))
		n, err := up.Read(buf)
		if err != nil {
			if isTimeout(err) || errors.Is(err, syscall.ECONNREFUSED) {
				continue
			}
			return
		}
		f.last.Store(time.Now().UnixNano())
		if _, err := rep.WriteToUDPAddrPort(buf[:n], f.key.src); err != nil {
			continue
		}
		st.dgIn.Add(1)
		st.bytesIn.Add(int64(n))
		sb.bytesIn.Add(int64(n))
	}
}

// rejudge closes sandbox id's flows pol no longer allows and returns how
// many, with those a datagram cut since pol was stored (revoked).
func (r *udpRelay) rejudge(id string, pol *netpolicy.Policy) int {
	r.mu.Lock()
	st := r.byID[id]
	var cut []*udpFlow
	revoked := 0
	if st != nil {
		revoked, st.revoked = st.revoked, 0
		for f := range st.flows {
			if !pol.Decide(f.dest).Allow {
				cut = append(cut, f)
				continue
			}
			f.pol.Store(pol)
		}
		for _, f := range cut {
			r.unlink(f)
		}
	}
	r.mu.Unlock()
	for _, f := range cut {
		f.close()
	}
	return len(cut) + revoked
}

// remove closes sandbox id's flows and forgets its state.
func (r *udpRelay) remove(id string) {
	r.mu.Lock()
	st := r.byID[id]
	var cut []*udpFlow
	if st != nil {
		delete(r.byID, id)
		for f := range st.flows {
			cut = append(cut, f)
		}
		for _, f := range cut {
			r.unlink(f)
		}
	}
	r.mu.Unlock()
	for _, f := range cut {
		f.close()
	}
}

func (r *udpRelay) closeAll() {
	r.mu.Lock()
	var cut []*udpFlow
	for _, f := range r.byKey {
		cut = append(cut, f)
	}
	for _, f := range cut {
		r.unlink(f)
	}
	r.mu.Unlock()
	for _, f := range cut {
		f.close()
	}
}

// stats returns sandbox id's UDP counters.
func (r *udpRelay) stats(id string) (UDPStats, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.byID[id]
	if st == nil {
		return UDPStats{}, false
	}
	return UDPStats{
		Flows: int64(len(st.flows)), FlowsTotal: st.flowsTotal.Load(),
		DatagramsOut: st.dgOut.Load(), DatagramsIn: st.dgIn.Load(),
		BytesOut: st.bytesOut.Load(), BytesIn: st.bytesIn.Load(),
		Denied: st.denied.Load(), Dropped: st.dropped.Load(),
	}, true
}
