package edgeclient

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// DialPort opens a byte stream to port of sandbox id through the edge's
// port tunnel (sandbox.PortTunnelPath), on behalf of who: the edge checks
// that who may see the sandbox before it dials. Errors keep the edge's
// kind and message.
func (c *Conn) DialPort(ctx context.Context, who caller.Caller, id string, port int) (net.Conn, error) {
	u, err := url.Parse(c.Addr)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	var conn net.Conn
	host := "edge"
	switch u.Scheme {
	case "unix":
		conn, err = d.DialContext(ctx, "unix", u.Path)
	case "http":
		host = u.Host
		conn, err = d.DialContext(ctx, "tcp", u.Host)
	case "https":
		host = u.Host
		td := tls.Dialer{NetDialer: &d, Config: &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname()}}
		conn, err = td.DialContext(ctx, "tcp", u.Host)
	default:
		return nil, fmt.Errorf("edge address %q: want http://, https:// or unix://", c.Addr)
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	}
	req := &http.Request{
		Method: http.MethodGet, URL: &url.URL{Path: sandbox.PortTunnelPath(id, port)},
		Host: host, Header: http.Header{}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", sandbox.PortTunnelUpgrade)
	req.Header.Set(headerNodeToken, c.token)
	who.SetHeader(req.Header)
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		return nil, tunnelError(resp)
	}
	_ = conn.SetDeadline(time.Time{})
	return sandbox.BufferedConn(conn, br), nil
}

// tunnelError is the error of a refused tunnel, as the edge sent it.
func tunnelError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	msg := strings.TrimSpace(string(b))
	var code connect.Code
	if err := code.UnmarshalText([]byte(resp.Header.Get(sandbox.HeaderErrorCode))); err != nil {
		// Not an edge's answer (an edge without tunnels answers 404
		// without a code).
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "the node does not offer port tunnels (HTTP %d): upgrade its dsec", resp.StatusCode)
	}
	return apierr.FromConnect(connect.NewWireError(code, errors.New(msg)))
}
