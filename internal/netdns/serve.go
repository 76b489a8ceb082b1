package netdns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// A SandboxView says which sandbox a query comes from. The wiring either
// serves one listener per sandbox namespace (Only) or one listener for
// many sandboxes, told apart by their source addresses.
type SandboxView interface {
	// Sandbox returns the sandbox a query from remote belongs to, or false
	// when remote is no sandbox's; such queries get no reply.
	Sandbox(remote net.Addr) (Sandbox, bool)
}

// Only is the SandboxView of a listener in one sandbox's own network
// namespace: every query on it is that sandbox's.
type Only Sandbox

// Sandbox returns o.
func (o Only) Sandbox(net.Addr) (Sandbox, bool) { return Sandbox(o), true }

const (
	// maxUDPWorkers bounds the UDP queries answered at once on one
	// listener; more are dropped (the client retries).
	maxUDPWorkers = 256
	// maxTCPConns bounds the TCP connections of one listener.
	maxTCPConns = 256
	// tcpIdle closes a TCP connection that sends no query for this long.
	tcpIdle = 10 * time.Second
	// maxQuery bounds a query read from UDP; a longer datagram is cut
	// and fails to parse.
	maxQuery = 4096
)

// Serve answers the queries that arrive on pc (UDP) and ln (TCP), either
// may be nil, for the sandboxes view names, until ctx is done. It closes
// pc and ln and returns once every query it took has been answered: nil
// when ctx ended it, or the error that stopped a listener.
func (r *Resolver) Serve(ctx context.Context, pc net.PacketConn, ln net.Listener, view SandboxView) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	stop := func(err error) {
		if ctx.Err() == nil {
			cancel(err)
		}
	}
	if pc != nil {
		stopPC := context.AfterFunc(ctx, func() { pc.Close() })
		defer stopPC()
		wg.Go(func() { stop(r.serveUDP(ctx, pc, view, &wg)) })
	}
	if ln != nil {
		stopLn := context.AfterFunc(ctx, func() { ln.Close() })
		defer stopLn()
		wg.Go(func() { stop(r.serveTCP(ctx, ln, view, &wg)) })
	}
	<-ctx.Done()
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func (r *Resolver) serveUDP(ctx context.Context, pc net.PacketConn, view SandboxView, wg *sync.WaitGroup) error {
	workers := make(chan struct{}, maxUDPWorkers)
	buf := make([]byte, maxQuery)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("read dns query: %w", err)
		}
		sb, ok := view.Sandbox(addr)
		if !ok {
			continue
		}
		st := r.state(sb.ID)
		if !st.admit(r.now(), r.cfg.Rate, r.cfg.Burst) {
			// Answered here, cheaply, so that a flood takes no worker.
			if b := refuse(buf[:n]); b != nil {
				pc.WriteTo(b, addr)
			}
			continue
		}
		select {
		case workers <- struct{}{}:
		default:
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		wg.Go(func() {
			defer func() { <-workers }()
			if b := r.respond(ctx, st, sb, q, true); b != nil {
				pc.WriteTo(b, addr)
			}
		})
	}
}

func (r *Resolver) serveTCP(ctx context.Context, ln net.Listener, view SandboxView, wg *sync.WaitGroup) error {
	conns := make(chan struct{}, maxTCPConns)
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept dns connection: %w", err)
		}
		sb, ok := view.Sandbox(c.RemoteAddr())
		if !ok {
			c.Close()
			continue
		}
		st := r.state(sb.ID)
		select {
		case conns <- struct{}{}:
		default:
			c.Close()
			continue
		}
		if !st.openTCP(r.cfg.MaxTCPConns) {
			<-conns
			c.Close()
			continue
		}
		wg.Go(func() {
			defer func() { <-conns }()
			defer st.closeTCP()
			defer c.Close()
			stopConn := context.AfterFunc(ctx, func() { c.Close() })
			defer stopConn()
			r.serveConn(ctx, c, st, sb)
		})
	}
}

// serveConn answers the length-prefixed queries of one TCP connection in
// turn.
func (r *Resolver) serveConn(ctx context.Context, c net.Conn, st *sandboxState, sb Sandbox) {
	var hdr [2]byte
	for {
		c.SetDeadline(time.Now().Add(tcpIdle))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint16(hdr[:])
		if n < 12 {
			return
		}
		q := make([]byte, n)
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		var b []byte
		if st.admit(r.now(), r.cfg.Rate, r.cfg.Burst) {
			b = r.respond(ctx, st, sb, q, false)
		} else {
			b = refuse(q)
		}
		if b == nil {
			return
		}
		out := make([]byte, 2+len(b))
		binary.BigEndian.PutUint16(out, uint16(len(b)))
		copy(out[2:], b)
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}
