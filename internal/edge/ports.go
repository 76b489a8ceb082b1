package edge

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// MaxPortConns bounds the connections open at once into one sandbox's
// ports, through every proxy of the platform: a client flooding one
// sandbox cannot exhaust the node's descriptors.
const MaxPortConns = 256

// portTunnels counts the open port connections per sandbox. The zero
// value works.
type portTunnels struct {
	mu sync.Mutex
	// guarded by mu
	open map[string]int
}

func (t *portTunnels) acquire(id string) (release func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open == nil {
		t.open = map[string]int{}
	}
	if t.open[id] >= MaxPortConns {
		return nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrResourceExhausted,
			"sandbox %s has %d port connections open, its limit: close some and retry", id, MaxPortConns), time.Second)
	}
	t.open[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			if t.open[id]--; t.open[id] <= 0 {
				delete(t.open, id)
			}
		})
	}, nil
}

// DialPort connects to a port of a sandbox the caller may see, on the
// sandbox's own loopback. The connection counts as an open stream (the
// sandbox is not idle) until done is called, which the caller must do
// once, after closing the connection. A paused sandbox is resumed first.
func (e *Edge) DialPort(ctx context.Context, caller Caller, id string, port int) (c net.Conn, done func(), err error) {
	r, err := e.lookup(caller, id)
	if err != nil {
		return nil, nil, err
	}
	be, err := e.backend(r.Backend)
	if err != nil {
		return nil, nil, err
	}
	pd, ok := be.(sandbox.PortDialer)
	if !ok {
		return nil, nil, sandbox.Lacks(r.Backend, sandbox.CapPorts)
	}
	_, dialed, err := e.ready(ctx, caller, id)
	if err != nil {
		return nil, nil, err
	}
	defer dialed()
	release, err := e.tunnels.acquire(id)
	if err != nil {
		return nil, nil, err
	}
	c, err = pd.DialPort(ctx, id, port)
	if err != nil {
		release()
		return nil, nil, err
	}
	closeStream := e.streamOpen(id)
	return c, func() { closeStream(); release() }, nil
}

// servePortTunnel serves the node API's port tunnel (sandbox.PortTunnelPath):
// after the checks of DialPort it answers 101 and joins the caller's
// connection to the port's.
func (e *Edge) servePortTunnel(w http.ResponseWriter, r *http.Request) {
	id, port, ok := sandbox.ParsePortTunnelPath(r.URL.Path)
	if !ok || !strings.EqualFold(r.Header.Get("Upgrade"), sandbox.PortTunnelUpgrade) {
		writeTunnelError(w, errdefs.Newf(errdefs.ErrInvalidArgument, "a port tunnel is GET %s with Upgrade: %s", sandbox.PortTunnelPath("ID", 1), sandbox.PortTunnelUpgrade))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	c, done, err := e.DialPort(ctx, callerOf(r.Header), id, port)
	if err != nil {
		if _, public := apierr.Public(err); !public {
			e.log.Warn("port tunnel", "sandbox", id, "port", port, "err", err)
		}
		writeTunnelError(w, err)
		return
	}
	defer done()
	hj, ok := w.(http.Hijacker)
	if !ok {
		c.Close()
		writeTunnelError(w, errdefs.Newf(errdefs.ErrInvalidArgument, "a port tunnel needs HTTP/1.1"))
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		c.Close()
		return
	}
	_ = conn.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", sandbox.PortTunnelUpgrade); err != nil {
		conn.Close()
		c.Close()
		return
	}
	sandbox.Pipe(sandbox.BufferedConn(conn, brw.Reader), c)
}

// writeTunnelError answers a refused tunnel: the status of the error's kind,
// its API code in sandbox.HeaderErrorCode and its public message.
func writeTunnelError(w http.ResponseWriter, err error) {
	msg, ok := apierr.Public(err)
	if !ok {
		msg = "the node could not reach the port; see its log"
	}
	code := apierr.Code(err)
	w.Header().Set(sandbox.HeaderErrorCode, code.String())
	if d, ok := errdefs.RetryHint(err); ok {
		w.Header().Set("Retry-After", fmt.Sprint(int(d.Seconds()+0.5)))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(apierr.HTTPStatus(code))
	fmt.Fprintln(w, msg)
}
