package dsec

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// firstCallTransport sends the first call of a client over a connection of
// its own, HTTP/1.1 written and read in the calling goroutine, and every
// later call through next (the shared HTTP/2 connection). A program that
// makes one call, such as the CLI's dsec exec, then skips HTTP/2's
// connection preface and its reader goroutine, which in a new process cost
// about a millisecond (bench/cli); a program that makes many calls loses
// nothing, as its later calls are multiplexed as before. Connect's unary
// and one-way streaming calls, the only kinds the API has, work over
// HTTP/1.1.
type firstCallTransport struct {
	next   http.RoundTripper
	used   atomic.Bool
	dialer net.Dialer
}

func newFirstCallTransport(next http.RoundTripper) *firstCallTransport {
	return &firstCallTransport{
		next: next,
		dialer: net.Dialer{
			Timeout: 10 * time.Second,
			// A stream that runs for hours notices a dead peer as the
			// HTTP/2 connection's pings would: within about a minute.
			KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 10 * time.Second, Count: 3},
		},
	}
}

func (t *firstCallTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || t.used.Swap(true) {
		return t.next.RoundTrip(req)
	}
	return t.direct(req)
}

// CloseIdleConnections closes next's idle connections; a first-call
// connection is never idle (it ends with its response).
func (t *firstCallTransport) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// direct makes one HTTP/1.1 exchange on a new connection, which the
// response body's Close (or the request's context) closes.
func (t *firstCallTransport) direct(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	closeBody := func() {
		if req.Body != nil {
			_ = req.Body.Close()
		}
	}
	host := req.URL.Host
	if req.URL.Port() == "" {
		host = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	conn, err := t.dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		closeBody()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	fail := func(err error) (*http.Response, error) {
		stop()
		_ = conn.Close()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, err
	}
	// Request.Write sends the headers, then the body (chunked when its
	// length is unknown, as a stream's is) as it is read, and closes it.
	// It is the HTTP/1.1 encoding net/http's own transport uses.
	w := bufio.NewWriterSize(conn, 16<<10)
	werr := req.Write(w)
	if werr == nil {
		werr = w.Flush()
	}
	br := bufio.NewReaderSize(conn, 16<<10)
	if werr != nil {
		// The server may have answered (and stopped reading) before the
		// body was sent, e.g. a refused key on an upload: its answer is
		// the better error.
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		if resp, err := http.ReadResponse(br, req); err == nil {
			_ = conn.SetReadDeadline(time.Time{})
			resp.Body = &firstCallBody{ReadCloser: resp.Body, conn: conn, stop: stop}
			return resp, nil
		}
		return fail(fmt.Errorf("send the request: %w", werr))
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fail(fmt.Errorf("read the response: %w", err))
	}
	resp.Body = &firstCallBody{ReadCloser: resp.Body, conn: conn, stop: stop}
	return resp, nil
}

// firstCallBody is a first call's response body; Close ends the
// connection.
type firstCallBody struct {
	io.ReadCloser
	conn net.Conn
	stop func() bool
	once sync.Once
}

func (b *firstCallBody) Close() error {
	b.once.Do(func() {
		b.stop()
		_ = b.conn.Close()
	})
	return nil
}
