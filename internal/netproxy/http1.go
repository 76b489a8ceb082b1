package netproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// Plain HTTP/1 is judged request by request: a kept-alive connection to
// an allowed name's address (a CDN's, shared by thousands of sites) must
// not carry a later request for a name the policy denies. The client's
// bytes are read as HTTP/1 requests (head, then the body its framing
// says) and each head's Host is judged before the head goes upstream. A
// request that upgrades the connection (Upgrade, CONNECT) ends the
// judging: what follows is the upgraded protocol's.

// errHTTPDenied: a request of the connection was denied (and recorded).
var errHTTPDenied = errors.New("an HTTP request was denied")

// maxChunkLine bounds a chunk-size line of a chunked body.
const maxChunkLine = 4096

// gateHTTP1 copies the client's requests from r to up, each judged
// first; it returns the bytes sent and errHTTPDenied for a denied one.
func (p *Proxy) gateHTTP1(sb *sandbox, c *conn, r *bufio.Reader, up io.Writer) (int64, error) {
	var sent int64
	for {
		head, err := readHead(r, p.cfg.PeekBytes)
		if err != nil {
			if errors.Is(err, io.EOF) && len(head) == 0 {
				return sent, nil // the client is done
			}
			return sent, p.denyHTTP(sb, c, "", fmt.Sprintf("denied: a later HTTP request on the connection cannot be read (%v)", err))
		}
		name, st := httpHost(head)
		if !looksHTTP(head) || st != peekDone {
			return sent, p.denyHTTP(sb, c, "", "denied: a later HTTP request on the connection cannot be read")
		}
		var names []string
		if name != "" {
			names = []string{name}
		}
		if dec := decide(sb.policy.Load(), c.dest, names); !dec.Allow {
			return sent, p.denyHTTP(sb, c, name, dec.String())
		}
		sb.mu.Lock()
		c.names = names // what a policy update judges the connection on
		sb.mu.Unlock()
		fr, err := framing(head)
		if err != nil {
			return sent, p.denyHTTP(sb, c, name, "denied: "+err.Error())
		}
		n, err := up.Write(head)
		sent += int64(n)
		if err != nil {
			return sent, err
		}
		switch {
		case fr.opaque:
			n, err := io.Copy(up, r)
			return sent + n, err
		case fr.chunked:
			n, err := copyChunked(up, r)
			sent += n
			if err != nil {
				return sent, err
			}
		case fr.length > 0:
			n, err := io.CopyN(up, r, fr.length)
			sent += n
			if err != nil {
				return sent, err
			}
		}
	}
}

// denyHTTP records a denied request of c.
func (p *Proxy) denyHTTP(sb *sandbox, c *conn, name, why string) error {
	sb.denied.Add(1)
	sb.record(Denial{Time: time.Now(), Dest: fmt.Sprintf("%s:%d/tcp", c.dest.Addr, c.dest.Port), Name: name, Reason: why})
	return errHTTPDenied
}

// readHead reads one request head, through its blank line, of at most max
// bytes; blank lines before it (allowed between requests) are skipped.
func readHead(r *bufio.Reader, max int) ([]byte, error) {
	var head []byte
	for {
		line, err := r.ReadSlice('\n')
		if len(head)+len(line) > max {
			return head, errors.New("the request head is too long")
		}
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				head = append(head, line...)
				continue
			}
			if errors.Is(err, io.EOF) && len(head)+len(line) > 0 {
				return append(head, line...), io.ErrUnexpectedEOF
			}
			return append(head, line...), err
		}
		if len(head) == 0 && (string(line) == "\r\n" || string(line) == "\n") {
			continue
		}
		head = append(head, line...)
		if bytes.HasSuffix(head, []byte("\r\n\r\n")) {
			return head, nil
		}
	}
}

// bodyFraming is how a request's body is delimited.
type bodyFraming struct {
	length  int64
	chunked bool
	// opaque: the request upgrades the connection; the rest is not HTTP.
	opaque bool
}

// framing reads a request head's body framing. Both a length and a
// transfer coding, two lengths that differ, or a coding other than
// chunked (the ways to make the proxy and the server see different
// requests) are errors.
func framing(head []byte) (bodyFraming, error) {
	var f bodyFraming
	lines := strings.Split(strings.TrimSuffix(string(head), "\r\n\r\n"), "\r\n")
	if m, _, _ := strings.Cut(lines[0], " "); m == "CONNECT" {
		f.opaque = true
	}
	seenLen := false
	for _, l := range lines[1:] {
		k, v, _ := strings.Cut(l, ":")
		v = strings.TrimSpace(v)
		switch strings.ToLower(k) {
		case "content-length":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || strings.TrimLeft(v, "0123456789") != "" {
				return f, fmt.Errorf("the HTTP request's Content-Length %.40q is malformed", v)
			}
			if seenLen && n != f.length {
				return f, errors.New("the HTTP request has two Content-Lengths")
			}
			seenLen, f.length = true, n
		case "transfer-encoding":
			if !strings.EqualFold(v, "chunked") {
				return f, fmt.Errorf("the HTTP request's Transfer-Encoding %.40q is not chunked", v)
			}
			f.chunked = true
		case "upgrade":
			f.opaque = true
		}
	}
	if f.chunked && seenLen {
		return f, errors.New("the HTTP request has both a Content-Length and a Transfer-Encoding")
	}
	return f, nil
}

// copyChunked copies one chunked body, through its last chunk and
// trailers, from r to w.
func copyChunked(w io.Writer, r *bufio.Reader) (int64, error) {
	var sent int64
	line := func() ([]byte, error) {
		l, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) || len(l) > maxChunkLine {
			return nil, errors.New("a chunked body's line is too long")
		}
		if err != nil {
			return nil, err
		}
		n, err := w.Write(l)
		sent += int64(n)
		return l, err
	}
	for {
		l, err := line()
		if err != nil {
			return sent, err
		}
		size, _, _ := strings.Cut(strings.TrimRight(string(l), "\r\n"), ";")
		n, err := strconv.ParseUint(strings.TrimSpace(size), 16, 63)
		if err != nil {
			return sent, fmt.Errorf("a chunk size %.20q is malformed", size)
		}
		if n == 0 {
			// Trailers, through the blank line.
			for total := 0; ; {
				l, err := line()
				if err != nil {
					return sent, err
				}
				if total += len(l); total > 16<<10 {
					return sent, errors.New("a chunked body's trailers are too long")
				}
				if string(l) == "\r\n" || string(l) == "\n" {
					return sent, nil
				}
			}
		}
		m, err := io.CopyN(w, r, int64(n))
		sent += m
		if err != nil {
			return sent, err
		}
		if _, err := line(); err != nil { // the chunk's CRLF
			return sent, err
		}
	}
}

// pipeHTTP1 is pipe for a plain HTTP/1 connection whose first bytes,
// head, were read already: the client's requests go through gateHTTP1;
// a denied one resets the client and closes upstream.
func (p *Proxy) pipeHTTP1(sb *sandbox, c *conn, client *net.TCPConn, up net.Conn, head []byte) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(head), client), 4096)
		n, err := p.gateHTTP1(sb, c, r, up)
		sb.bytesOut.Add(n)
		if errors.Is(err, errHTTPDenied) {
			reset(client)
			up.Close()
			return
		}
		closeWrite(up)
	}()
	n, _ := io.Copy(client, up)
	sb.bytesIn.Add(n)
	client.CloseWrite()
	<-done
}
