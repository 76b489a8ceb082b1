// Package portproxy is the ports proxy: the only way into a sandbox's
// listening TCP ports from outside, on a listener and origin of its own
// (never the API's: a page a sandbox serves must not share an origin with
// anything that holds keys), authenticated like the API.
//
// A request names a sandbox and a port in one of two forms:
//   - the host form, http://PORT-ID.DOMAIN/..., one origin per sandbox and
//     port, the form for browsers: a short-lived, single-use login link
//     (minted with an API key, POST /_dsec/v1/login) sets a cookie only
//     that origin receives and no script can read;
//   - the path form, /ID/PORT/..., the prefix stripped before forwarding,
//     for API clients only: every sandbox shares the listener's origin, so
//     it takes only `Authorization: Bearer <key>`, never a cookie.
//
// and GET /_dsec/v1/tunnel/ID/PORT with "Upgrade: dsec-tcp" turns the
// connection into a raw TCP stream to the port (dsec port).
//
// Invariants:
//   - Nothing is dialled before the key is authenticated; the edge that
//     owns the sandbox refuses a sandbox the key may not see (NotFound)
//     before it dials (Platform.DialPort).
//   - The platform's credentials (the bearer key, the session cookie) never
//     reach the sandbox, and a sandbox's responses cannot set cookies for
//     other origins (Set-Cookie with a Domain, or of the session's name,
//     is dropped).
//   - A cookie-authenticated request from another site (another sandbox's
//     page: all host forms share DOMAIN) is refused unless it is a plain
//     top-level navigation.
//   - One connection into the sandbox per request (no keep-alive pool): a
//     connection dialled for one key never serves another's request.
package portproxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// Platform authenticates API keys and connects to sandboxes' ports
// (*apiserver.Server).
type Platform interface {
	Authenticate(ctx context.Context, secret string) (cluster.Key, error)
	DialPort(ctx context.Context, k cluster.Key, id string, port int) (net.Conn, error)
}

// Config configures a Proxy. The zero value of every field but Platform
// works.
type Config struct {
	Platform Platform
	// Domain is the host form's domain: PORT-ID.Domain (default
	// "localhost", whose subdomains browsers resolve to loopback).
	Domain string
	// LoginTTL bounds a login link (default 1 min); SessionTTL the cookie
	// it sets (default 1 h). Sessions are kept in this process only.
	LoginTTL, SessionTTL time.Duration
	// MaxSessions bounds the logins and sessions kept (default 10,000).
	MaxSessions int
	Logger      *slog.Logger
}

// Reserved paths. IDs are DNS labels, so "_dsec" is never one.
const (
	loginPath     = "/_dsec/v1/login" // POST on the bare host: mint a login link
	tunnelPrefix  = "/_dsec/v1/tunnel/"
	hostLoginPath = "/_dsec/login" // GET on a host form: redeem a login link
	// CookieName is the session cookie (prefixed __Host- over TLS).
	CookieName = "dsec_port"
)

// MaxHeaderBytes bounds a request's header; above it the answer is 431.
const MaxHeaderBytes = 16 << 10

// Proxy is the ports proxy.
type Proxy struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// guarded by mu
	logins   map[string]*grant // single-use login tokens
	sessions map[string]*grant // cookie values
}

// grant is what a login token or a session admits: one port of one
// sandbox, as one key, until exp. The key's secret is kept (in memory
// only) so that every request authenticates it again: a revoked key's
// sessions end at once.
type grant struct {
	secret string
	id     string
	port   int
	exp    time.Time
}

// New returns a proxy.
func New(cfg Config) *Proxy {
	if cfg.Domain == "" {
		cfg.Domain = "localhost"
	}
	cfg.Domain = strings.ToLower(strings.Trim(cfg.Domain, "."))
	if cfg.LoginTTL <= 0 {
		cfg.LoginTTL = time.Minute
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = time.Hour
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 10000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Proxy{cfg: cfg, log: cfg.Logger, logins: map[string]*grant{}, sessions: map[string]*grant{}}
}

// Server returns an HTTP server of the proxy with its bounds: header size
// (431 above MaxHeaderBytes) and header read time; bodies and upgraded
// connections (WebSockets) are not timed.
func (p *Proxy) Server() *http.Server {
	return &http.Server{
		Handler:           p,
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
}

// target is a request's sandbox and port, with the path to forward.
type target struct {
	id      string
	port    int
	path    string // escaped, from "/"
	prefix  string // the path form's stripped prefix
	hostish bool   // the host form
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		p.fail(w, errdefs.Newf(errdefs.ErrInvalidArgument, "the ports proxy is not a forward proxy: request /ID/PORT/... or http://PORT-ID.%s/", p.cfg.Domain))
		return
	}
	if id, port, ok := p.hostForm(r.Host); ok {
		if r.URL.Path == hostLoginPath {
			p.redeem(w, r, id, port)
			return
		}
		p.forward(w, r, target{id: id, port: port, path: r.URL.EscapedPath(), hostish: true})
		return
	}
	switch esc := r.URL.EscapedPath(); {
	case esc == loginPath:
		p.mint(w, r)
	case strings.HasPrefix(esc, tunnelPrefix):
		p.tunnel(w, r, strings.TrimPrefix(esc, tunnelPrefix))
	default:
		t, err := p.pathForm(esc)
		if err != nil {
			p.fail(w, err)
			return
		}
		p.forward(w, r, t)
	}
}

// hostForm parses a Host header of the form PORT-ID.DOMAIN[:port].
func (p *Proxy) hostForm(host string) (string, int, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+p.cfg.Domain)
	if !ok {
		return "", 0, false
	}
	ps, id, ok := strings.Cut(label, "-")
	if !ok || strings.Contains(label, ".") {
		return "", 0, false
	}
	port, ok := sandbox.ParsePort(ps)
	if !ok || !sandbox.ValidID(id) {
		return "", 0, false
	}
	return id, port, true
}

// pathForm parses /ID/PORT[/rest] of an escaped path: ID and PORT are
// taken from the raw path, so an encoded slash cannot move them.
func (p *Proxy) pathForm(esc string) (target, error) {
	rest, rooted := strings.CutPrefix(esc, "/")
	id, rest, _ := strings.Cut(rest, "/")
	ps, rest, slash := strings.Cut(rest, "/")
	port, okPort := sandbox.ParsePort(ps)
	if !rooted || !sandbox.ValidID(id) || !okPort {
		return target{}, errdefs.Newf(errdefs.ErrNotFound,
			"the ports proxy serves /ID/PORT/... (the path form, for API clients) and http://PORT-ID.%s/ (the host form, for browsers); it does not serve the API", p.cfg.Domain)
	}
	path := "/"
	if slash {
		path += rest
	}
	return target{id: id, port: port, path: path, prefix: "/" + id + "/" + ps}, nil
}

// dotSegments reports whether an escaped path has a . or .. segment
// (also encoded): the sandbox's server would resolve it, the proxy does
// not guess how.
func dotSegments(esc string) bool {
	for _, seg := range strings.Split(esc, "/") {
		s, err := url.PathUnescape(seg)
		if err != nil || s == "." || s == ".." {
			return true
		}
	}
	return false
}

// forward proxies one request (WebSocket upgrades included) to t.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, t target) {
	if dotSegments(t.path) {
		p.fail(w, errdefs.Newf(errdefs.ErrInvalidArgument, "the path has a . or .. segment: send the path as the browser resolves it"))
		return
	}
	key, byCookie, err := p.authenticate(r, t)
	if err != nil {
		p.fail(w, err)
		return
	}
	var dialErr atomic.Pointer[error] // set by the transport's dial
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := p.cfg.Platform.DialPort(ctx, key, t.id, t.port)
			if err != nil {
				dialErr.Store(&err)
			}
			return c, err
		},
		DisableKeepAlives:      true,
		DisableCompression:     true,
		ResponseHeaderTimeout:  5 * time.Minute,
		MaxResponseHeaderBytes: 64 << 10,
	}
	rp := &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			u := *pr.In.URL
			u.Scheme, u.Host, u.User = "http", "sandbox", nil
			u.RawPath = t.path
			if dec, err := url.PathUnescape(t.path); err == nil {
				u.Path = dec
			}
			pr.Out.URL = &u
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			if t.prefix != "" {
				pr.Out.Header.Set("X-Forwarded-Prefix", t.prefix)
			}
			if !byCookie {
				pr.Out.Header.Del("Authorization")
			}
			stripCookie(pr.Out.Header, p.cookieName(r))
		},
		ModifyResponse: func(resp *http.Response) error {
			filterSetCookies(resp.Header, p.cookieName(r))
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if de := dialErr.Load(); de != nil {
				err = *de
			} else if errdefs.Kind(err) == errdefs.ErrInternal {
				err = errdefs.Newf(errdefs.ErrUnavailable, "port %d of sandbox %s broke the connection or sent no valid HTTP response", t.port, t.id)
			}
			p.fail(w, err)
		},
	}
	rp.ServeHTTP(w, r)
}

// authenticate finds the key of a request to t: its bearer key, or on the
// host form the session cookie of t's origin.
func (p *Proxy) authenticate(r *http.Request, t target) (cluster.Key, bool, error) {
	if t.hostish {
		if g := p.session(r, t); g != nil {
			if !sameOriginOrNavigation(r) {
				return cluster.Key{}, false, errdefs.Newf(errdefs.ErrPermissionDenied,
					"this request comes from another site (another sandbox's page?): open the page itself, not through another one")
			}
			k, err := p.cfg.Platform.Authenticate(r.Context(), g.secret)
			return k, true, err
		}
	}
	secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(secret) == "" {
		if t.hostish {
			return cluster.Key{}, false, errdefs.Newf(errdefs.ErrUnauthenticated,
				"no dsec credentials: send `Authorization: Bearer <key>`, or open the login link of `dsec port %s %d --browser`", t.id, t.port)
		}
		return cluster.Key{}, false, errdefs.Newf(errdefs.ErrUnauthenticated,
			"no API key: send `Authorization: Bearer <key>`; browsers use the host form (see `dsec port %s %d --browser`)", t.id, t.port)
	}
	k, err := p.cfg.Platform.Authenticate(r.Context(), strings.TrimSpace(secret))
	return k, false, err
}

// sameOriginOrNavigation refuses what a page of another origin makes a
// browser send: fetches, forms and WebSockets from another site (all host
// forms are one site). Clients that send no Sec-Fetch-Site (not browsers,
// or old ones) are judged by Origin alone.
func sameOriginOrNavigation(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		if r.Header.Get("Sec-Fetch-Mode") != "navigate" || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			return false
		}
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || !strings.EqualFold(u.Host, r.Host) {
			return false
		}
	}
	return true
}

func (p *Proxy) cookieName(r *http.Request) string {
	if r.TLS != nil {
		return "__Host-" + CookieName
	}
	return CookieName
}

// session returns the live session of r's cookies for t, if any.
func (p *Proxy) session(r *http.Request, t target) *grant {
	name := p.cookieName(r)
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range r.Cookies() {
		if c.Name != name {
			continue
		}
		g := p.sessions[c.Value]
		if g != nil && now.After(g.exp) {
			delete(p.sessions, c.Value)
			continue
		}
		if g != nil && g.id == t.id && g.port == t.port {
			return g
		}
	}
	return nil
}

// stripCookie removes the session cookie from a request's Cookie headers.
func stripCookie(h http.Header, name string) {
	var keep []string
	for _, line := range h.Values("Cookie") {
		for _, part := range strings.Split(line, ";") {
			part = strings.TrimSpace(part)
			if n, _, _ := strings.Cut(part, "="); part == "" || strings.TrimSpace(n) == name {
				continue
			}
			keep = append(keep, part)
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

// filterSetCookies drops the cookies a sandbox may not set: any for a
// Domain (it would reach other sandboxes' origins) and the session's.
func filterSetCookies(h http.Header, name string) {
	lines := h.Values("Set-Cookie")
	if len(lines) == 0 {
		return
	}
	h.Del("Set-Cookie")
	for _, line := range lines {
		c, err := http.ParseSetCookie(line)
		if err != nil || c.Domain != "" || strings.EqualFold(c.Name, CookieName) || strings.EqualFold(c.Name, "__Host-"+CookieName) || c.Name == name {
			continue
		}
		h.Add("Set-Cookie", line)
	}
}

// LoginRequest is the body of POST /_dsec/v1/login, LoginResponse its
// answer (defined with the tunnel's wire in internal/sandbox, so that the
// command line, which links none of the server, speaks them too).
type (
	LoginRequest  = sandbox.PortLoginRequest
	LoginResponse = sandbox.PortLoginResponse
)

// mint answers POST /_dsec/v1/login, authenticated by the API key.
func (p *Proxy) mint(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		p.fail(w, errdefs.Newf(errdefs.ErrInvalidArgument, "POST a JSON {\"sandbox\": ID, \"port\": PORT} to %s", loginPath))
		return
	}
	secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	secret = strings.TrimSpace(secret)
	if !ok || secret == "" {
		p.fail(w, errdefs.Newf(errdefs.ErrUnauthenticated, "no API key: send `Authorization: Bearer <key>`"))
		return
	}
	if _, err := p.cfg.Platform.Authenticate(r.Context(), secret); err != nil {
		p.fail(w, err)
		return
	}
	var req LoginRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10)).Decode(&req); err != nil {
		p.fail(w, errdefs.Newf(errdefs.ErrInvalidArgument, "POST a JSON {\"sandbox\": ID, \"port\": PORT} to %s", loginPath))
		return
	}
	if !sandbox.ValidID(req.Sandbox) || req.Port < 1 || req.Port > 65535 {
		p.fail(w, errdefs.Newf(errdefs.ErrInvalidArgument, "want a sandbox ID and a port of 1-65535"))
		return
	}
	tok, err := p.put(p.logins, &grant{secret: secret, id: req.Sandbox, port: req.Port, exp: time.Now().Add(p.cfg.LoginTTL)})
	if err != nil {
		p.fail(w, err)
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	host := strconv.Itoa(req.Port) + "-" + req.Sandbox + "." + p.cfg.Domain
	if _, port, err := net.SplitHostPort(r.Host); err == nil {
		host = net.JoinHostPort(host, port)
	}
	u := url.URL{Scheme: scheme, Host: host, Path: hostLoginPath, RawQuery: url.Values{"token": {tok}}.Encode()}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(LoginResponse{URL: u.String(), ExpiresAt: time.Now().Add(p.cfg.LoginTTL).UTC()})
}

// redeem answers GET /_dsec/login?token=T on a host form: a login token
// for this very sandbox and port becomes a session cookie of this origin.
func (p *Proxy) redeem(w http.ResponseWriter, r *http.Request, id string, port int) {
	tok := r.URL.Query().Get("token")
	p.mu.Lock()
	g := p.logins[tok]
	delete(p.logins, tok) // single use, whatever follows
	p.mu.Unlock()
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("Cache-Control", "no-store")
	if g == nil || time.Now().After(g.exp) || g.id != id || g.port != port {
		p.fail(w, errdefs.Newf(errdefs.ErrUnauthenticated,
			"this login link is not valid here, was used already or expired: get a new one with `dsec port %s %d --browser`", id, port))
		return
	}
	if _, err := p.cfg.Platform.Authenticate(r.Context(), g.secret); err != nil {
		p.fail(w, err)
		return
	}
	s := &grant{secret: g.secret, id: id, port: port, exp: time.Now().Add(p.cfg.SessionTTL)}
	sid, err := p.put(p.sessions, s)
	if err != nil {
		p.fail(w, err)
		return
	}
	// Host-only (no Domain: no other sandbox's origin receives it),
	// HttpOnly (no script of the sandbox's page reads it).
	http.SetCookie(w, &http.Cookie{
		Name: p.cookieName(r), Value: sid, Path: "/", MaxAge: int(p.cfg.SessionTTL.Seconds()),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode,
	})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// put stores g under a new random token in m.
func (p *Proxy) put(m map[string]*grant, g *grant) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b)
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.logins)+len(p.sessions) >= p.cfg.MaxSessions {
		for _, mm := range []map[string]*grant{p.logins, p.sessions} {
			for k, v := range mm {
				if now.After(v.exp) {
					delete(mm, k)
				}
			}
		}
		if len(p.logins)+len(p.sessions) >= p.cfg.MaxSessions {
			return "", errdefs.RetryAfter(errdefs.Newf(errdefs.ErrResourceExhausted, "too many browser sessions of the ports proxy: retry later"), time.Minute)
		}
	}
	m[tok] = g
	return tok, nil
}

// tunnel answers GET /_dsec/v1/tunnel/ID/PORT with Upgrade: dsec-tcp: a
// raw TCP stream to the port (dsec port), for the bearer key only.
func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request, rest string) {
	id, ps, _ := strings.Cut(rest, "/")
	port, ok := sandbox.ParsePort(ps)
	if !ok || !sandbox.ValidID(id) || r.Method != http.MethodGet || !strings.EqualFold(r.Header.Get("Upgrade"), sandbox.PortTunnelUpgrade) {
		p.fail(w, errdefs.Newf(errdefs.ErrInvalidArgument, "a tunnel is GET %sID/PORT with Upgrade: %s", tunnelPrefix, sandbox.PortTunnelUpgrade))
		return
	}
	key, _, err := p.authenticate(r, target{id: id, port: port})
	if err != nil {
		p.fail(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	c, err := p.cfg.Platform.DialPort(ctx, key, id, port)
	cancel()
	if err != nil {
		p.fail(w, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		c.Close()
		p.fail(w, errdefs.Newf(errdefs.ErrInvalidArgument, "a tunnel needs HTTP/1.1"))
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

// fail answers an error: the status of its kind (a sandbox or node that
// cannot be reached is 502), its public message as text.
func (p *Proxy) fail(w http.ResponseWriter, err error) {
	msg, ok := apierr.Public(err)
	if !ok {
		p.log.Warn("ports proxy", "err", err)
		msg = "the ports proxy failed; see the log of dsec up"
	}
	code := apierr.Code(err)
	status := apierr.HTTPStatus(code)
	if errdefs.Is(err, errdefs.ErrUnavailable) {
		status = http.StatusBadGateway
	}
	if d, ok := errdefs.RetryHint(err); ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(d.Seconds()+0.5)))
	}
	w.Header().Set(sandbox.HeaderErrorCode, code.String())
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	fmt.Fprintln(w, "dsec: "+msg)
}
