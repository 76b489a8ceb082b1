package dsec

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/dsecproject/dsec/api/dsec/admin/v1/adminv1connect"
	"github.com/dsecproject/dsec/api/dsec/image/v1/imagev1connect"
	"github.com/dsecproject/dsec/api/dsec/rollout/v1/rolloutv1connect"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// userAgent is this package's part of the User-Agent header.
const userAgent = "dsec-go"

// Client calls one dsec API server. It is safe for concurrent use; share
// one per process so connections are reused.
type Client struct {
	addr      string
	sandboxes sandboxv1connect.SandboxServiceClient
	// images, admin and rollouts are made on first use: a short-lived
	// program (the CLI's dsec exec) then builds only the service it calls.
	images   func() imagev1connect.ImageServiceClient
	admin    func() adminv1connect.AdminServiceClient
	rollouts func() rolloutv1connect.RolloutServiceClient

	// createRetries and logger are Config's CreateRetries and Logger.
	createRetries int
	logger        *slog.Logger

	// ownedHTTP is the HTTP client New made, nil when the caller gave one.
	ownedHTTP *http.Client
	closeOnce sync.Once
}

// New returns a client for cfg. Empty fields take the defaults documented on
// Config; New reads neither the environment nor files (LoadConfig does). It
// makes no call: a server that is down shows as ErrUnavailable on the first
// call.
func New(cfg Config) (*Client, error) {
	addr, err := normalizeAddr(firstNonEmpty(cfg.Addr, DefaultAddr))
	if err != nil {
		return nil, err
	}
	if i := strings.IndexFunc(cfg.APIKey, func(r rune) bool { return r <= ' ' || r > '~' }); i >= 0 {
		return nil, newError(ErrInvalidArgument, "the API key contains a space, control or non-ASCII character at byte %d: check where it came from (--api-key, DSEC_API_KEY, the config file or admin.key)", i)
	}
	if strings.ContainsAny(cfg.UserAgent, "\r\n") {
		return nil, newError(ErrInvalidArgument, "the user agent %q contains a line break", cfg.UserAgent)
	}

	if cfg.CreateRetries < 0 {
		return nil, newError(ErrInvalidArgument, "CreateRetries is %d: give 0 (no retries) or more", cfg.CreateRetries)
	}
	c := &Client{addr: addr, createRetries: cfg.CreateRetries, logger: cfg.Logger}
	hc := cfg.HTTPClient
	if hc == nil {
		var rt http.RoundTripper = newTransport(strings.HasPrefix(addr, "https://"))
		if cfg.ShortLived {
			rt = newFirstCallTransport(rt)
		}
		c.ownedHTTP = &http.Client{Transport: rt}
		hc = c.ownedHTTP
	}
	ua := userAgent
	if cfg.UserAgent != "" {
		ua = cfg.UserAgent + " " + userAgent
	}
	opts := []connect.ClientOption{
		connect.WithInterceptors(&authInterceptor{key: cfg.APIKey, userAgent: ua, hint: cfg.keyHint}),
	}
	if strings.HasPrefix(addr, "http://") {
		// Plain HTTP is for loopback (CONTRACT.md), where compressing
		// file and output streams only burns the server's CPU.
		opts = append(opts, connect.WithAcceptCompression("gzip", nil, nil))
	}
	c.sandboxes = sandboxv1connect.NewSandboxServiceClient(hc, addr, opts...)
	c.images = sync.OnceValue(func() imagev1connect.ImageServiceClient {
		return imagev1connect.NewImageServiceClient(hc, addr, opts...)
	})
	c.admin = sync.OnceValue(func() adminv1connect.AdminServiceClient {
		return adminv1connect.NewAdminServiceClient(hc, addr, opts...)
	})
	c.rollouts = sync.OnceValue(func() rolloutv1connect.RolloutServiceClient {
		return rolloutv1connect.NewRolloutServiceClient(hc, addr, opts...)
	})
	return c, nil
}

// newTransport returns the transport of the HTTP client New makes: HTTP/2
// with prior knowledge over plain TCP (many calls and streams share one
// connection), HTTP/2 or HTTP/1.1 by ALPN over TLS.
func newTransport(tls bool) *http.Transport {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		DialContext:         dialer.DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		MaxIdleConnsPerHost: 64,
		// Detect a dead connection under a long exec stream.
		HTTP2:     &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second},
		Protocols: new(http.Protocols),
	}
	if tls {
		t.Proxy = http.ProxyFromEnvironment
		t.Protocols.SetHTTP1(true)
		t.Protocols.SetHTTP2(true)
	} else {
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return t
}

// Addr returns the URL of the API the client calls.
func (c *Client) Addr() string { return c.addr }

// Close releases the client's idle connections. Calls in flight are not
// interrupted (cancel their contexts for that). Close is idempotent; an
// HTTPClient given in Config is left alone.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		if c.ownedHTTP != nil {
			c.ownedHTTP.CloseIdleConnections()
		}
	})
	return nil
}

// err converts an error from a call into this package's errors.
func (c *Client) err(err error) error { return convertError(err, c.addr) }

// authInterceptor adds the bearer key and the User-Agent to every call, and
// fails calls locally when there is no key.
type authInterceptor struct {
	key       string
	userAgent string
	hint      string
}

var _ connect.Interceptor = (*authInterceptor)(nil)

func (a *authInterceptor) missingKey() error {
	return &Error{Kind: ErrUnauthenticated, Message: missingKeyMessage(a.hint)}
}

func (a *authInterceptor) setHeaders(h http.Header) {
	h.Set("Authorization", "Bearer "+a.key)
	h.Set("User-Agent", a.userAgent)
}

func (a *authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if a.key == "" {
			return nil, a.missingKey()
		}
		a.setHeaders(req.Header())
		return next(ctx, req)
	}
}

func (a *authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		if a.key == "" {
			return &failedConn{spec: spec, err: a.missingKey()}
		}
		conn := next(ctx, spec)
		a.setHeaders(conn.RequestHeader())
		return conn
	}
}

func (a *authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// failedConn is a stream that fails every operation with err, without
// touching the network.
type failedConn struct {
	spec connect.Spec
	err  error
	req  http.Header
	resp http.Header
	tr   http.Header
}

func (f *failedConn) Spec() connect.Spec { return f.spec }
func (f *failedConn) Peer() connect.Peer { return connect.Peer{} }
func (f *failedConn) Send(any) error     { return f.err }
func (f *failedConn) RequestHeader() http.Header {
	if f.req == nil {
		f.req = http.Header{}
	}
	return f.req
}
func (f *failedConn) CloseRequest() error { return nil }
func (f *failedConn) Receive(any) error   { return f.err }
func (f *failedConn) ResponseHeader() http.Header {
	if f.resp == nil {
		f.resp = http.Header{}
	}
	return f.resp
}

func (f *failedConn) ResponseTrailer() http.Header {
	if f.tr == nil {
		f.tr = http.Header{}
	}
	return f.tr
}
func (f *failedConn) CloseResponse() error { return nil }
