// Package edgeclient connects the control plane to edges: one pooled
// Connect client per node, over TCP (http://, https://) or, for the edge of
// `dsec up`, a unix socket (unix:///path). Every call carries the node
// token; sandbox calls also carry the caller's identity.
package edgeclient

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/dsecproject/dsec/api/dsec/image/v1/imagev1connect"
	"github.com/dsecproject/dsec/api/dsec/node/v1/nodev1connect"
	"github.com/dsecproject/dsec/api/dsec/rollout/v1/rolloutv1connect"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// Conn is the connection to one edge.
type Conn struct {
	// Name is the edge's node name (empty from Dial).
	Name    string
	Addr    string
	Sandbox sandboxv1connect.SandboxServiceClient
	Rollout rolloutv1connect.RolloutServiceClient
	Node    nodev1connect.NodeServiceClient
	// LayerUse lists the layers the node's sandboxes mount.
	LayerUse imagev1connect.LayerUseServiceClient
	http     *http.Client
	token    string // the node token, for port tunnels (ports.go)
}

// Close drops the connection's idle connections.
func (c *Conn) Close() { c.http.CloseIdleConnections() }

// Dial returns a client for the edge at addr. It does not connect yet.
func Dial(addr, token string) (*Conn, error) {
	u, err := url.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("edge address %q: %w", addr, err)
	}
	tr := &http.Transport{
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     90 * time.Second,
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12},
	}
	base := addr
	switch u.Scheme {
	case "unix":
		sock := u.Path
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
		base = "http://edge"
	case "http", "https":
		base = strings.TrimSuffix(addr, "/")
	default:
		return nil, fmt.Errorf("edge address %q: want http://, https:// or unix://", addr)
	}
	hc := &http.Client{Transport: tr}
	opt := connect.WithInterceptors(tokenInterceptor(token))
	return &Conn{
		Addr:     addr,
		Sandbox:  sandboxv1connect.NewSandboxServiceClient(hc, base, opt),
		Rollout:  rolloutv1connect.NewRolloutServiceClient(hc, base, opt),
		Node:     nodev1connect.NewNodeServiceClient(hc, base, opt),
		LayerUse: imagev1connect.NewLayerUseServiceClient(hc, base, opt),
		http:     hc,
		token:    token,
	}, nil
}

const headerNodeToken = "Dsec-Node-Token"

type tokenInterceptor string

func (t tokenInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set(headerNodeToken, string(t))
		return next(ctx, req)
	}
}

func (t tokenInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set(headerNodeToken, string(t))
		return conn
	}
}

func (t tokenInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Pool keeps one Conn per node.
type Pool struct {
	token string

	mu sync.Mutex
	// guarded by mu
	conns map[string]*Conn
}

// NewPool returns a pool whose connections present token.
func NewPool(token string) *Pool { return &Pool{token: token, conns: map[string]*Conn{}} }

// Get returns the connection to node at addr, replacing one to an old
// address.
func (p *Pool) Get(node, addr string) (*Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[node]; ok && c.Addr == addr {
		return c, nil
	}
	c, err := Dial(addr, p.token)
	if err != nil {
		return nil, err
	}
	c.Name = node
	if old, ok := p.conns[node]; ok {
		old.Close()
	}
	p.conns[node] = c
	return c, nil
}

// Close closes every connection.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = map[string]*Conn{}
}
