//go:build linux

package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strings"
	"sync"
)

// counter is a reverse proxy in front of the blobserver that counts the
// bytes of the response bodies it passes on, by blob: the node and the
// eager fetches read the shared storage through it, so its figures are
// what was fetched from shared storage.
type counter struct {
	srv *http.Server
	ln  net.Listener

	mu sync.Mutex
	// guarded by mu
	bytes    map[string]int64 // digest → body bytes served
	requests int64
}

func newCounter(upstream string) (*counter, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &counter{ln: ln, bytes: map[string]int64{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(resp *http.Response) error {
		digest := "sha256:" + strings.TrimPrefix(path.Base(resp.Request.URL.Path), "sha256:")
		c.mu.Lock()
		c.requests++
		c.mu.Unlock()
		resp.Body = &countingBody{ReadCloser: resp.Body, c: c, digest: digest}
		return nil
	}
	c.srv = &http.Server{Handler: rp}
	go func() { _ = c.srv.Serve(ln) }()
	return c, nil
}

// URL is the proxy's base URL.
func (c *counter) URL() string { return "http://" + c.ln.Addr().String() }

// take returns the counts so far and starts again from zero.
func (c *counter) take() (map[string]int64, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, n := c.bytes, c.requests
	c.bytes, c.requests = map[string]int64{}, 0
	return b, n
}

// Close stops the proxy and its connections.
func (c *counter) Close() error { return c.srv.Close() }

type countingBody struct {
	io.ReadCloser
	c      *counter
	digest string
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.c.mu.Lock()
		b.c.bytes[b.digest] += int64(n)
		b.c.mu.Unlock()
	}
	return n, err
}
