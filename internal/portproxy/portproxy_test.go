package portproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakePlatform knows keys by secret and dials every sandbox port at one
// test server, recording who dialled what.
type fakePlatform struct {
	keys     map[string]cluster.Key
	owner    map[string]string // sandbox ID -> project
	upstream string            // host:port every port is dialled at

	mu    sync.Mutex
	dials []string // guarded by mu; "project id:port"
}

func (f *fakePlatform) Authenticate(_ context.Context, secret string) (cluster.Key, error) {
	if k, ok := f.keys[secret]; ok {
		return k, nil
	}
	return cluster.Key{}, errdefs.Newf(errdefs.ErrUnauthenticated, "invalid API key")
}

func (f *fakePlatform) DialPort(ctx context.Context, k cluster.Key, id string, port int) (net.Conn, error) {
	f.mu.Lock()
	f.dials = append(f.dials, fmt.Sprintf("%s %s:%d", k.Project, id, port))
	f.mu.Unlock()
	if p, ok := f.owner[id]; !ok || (p != k.Project && !k.Admin) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	if port != 80 {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "nothing listens on port %d in sandbox %s", port, id)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", f.upstream)
}

func (f *fakePlatform) dialed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.dials...)
}

// newTest starts an upstream that echoes what it got (and upgrades
// "Upgrade: echo" requests to a byte echo) and a proxy in front of it.
func newTest(t *testing.T) (*fakePlatform, string) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "echo" {
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Upgrade", "echo")
			w.WriteHeader(http.StatusSwitchingProtocols)
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_ = brw.Flush()
			_, _ = io.Copy(c, brw)
			return
		}
		w.Header().Add("Set-Cookie", "own=1; Path=/")
		w.Header().Add("Set-Cookie", "wide=1; Domain=example.test; Path=/")
		w.Header().Add("Set-Cookie", CookieName+"=forged; Path=/")
		fmt.Fprintf(w, "path=%s raw=%s\n", r.URL.Path, r.URL.RawPath)
		_ = r.Header.Write(w)
	}))
	t.Cleanup(up.Close)
	f := &fakePlatform{
		keys: map[string]cluster.Key{
			"ka": {ID: "ka", Project: "a"}, "kb": {ID: "kb", Project: "b"}, "adm": {ID: "adm", Project: "default", Admin: true},
		},
		owner:    map[string]string{"n-a1": "a", "n-b1": "b"},
		upstream: strings.TrimPrefix(up.URL, "http://"),
	}
	px := New(Config{Platform: f, Domain: "ports.test"})
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = px.Server()
	srv.Start()
	t.Cleanup(srv.Close)
	return f, strings.TrimPrefix(srv.URL, "http://")
}

// raw sends a request as written and returns the status and body.
func raw(t *testing.T, addr, req string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read the answer to %q: %v", req, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func get(path, host, key, extra string) string {
	h := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n"
	if key != "" {
		h += "Authorization: Bearer " + key + "\r\n"
	}
	return h + extra + "\r\n"
}

// TestRefusedWithoutDialing: nothing without a valid key, nothing that
// is not a port, nothing with dot segments, and none of it dials.
func TestRefusedWithoutDialing(t *testing.T) {
	f, addr := newTest(t)
	for _, c := range []struct {
		name, req string
		want      int
	}{
		{"no key", get("/n-a1/80/", addr, "", ""), 401},
		{"bad key", get("/n-a1/80/", addr, "nope", ""), 401},
		{"basic auth", get("/n-a1/80/", addr, "", "Authorization: Basic a2E6\r\n"), 401},
		{"host form, no cookie", get("/", "80-n-a1.ports.test", "", ""), 401},
		{"host form, forged cookie", get("/", "80-n-a1.ports.test", "", "Cookie: "+CookieName+"=guess\r\n"), 401},
		{"dot dot", get("/n-a1/80/../n-b1/80/", addr, "ka", ""), 400},
		{"encoded dot dot", get("/n-a1/80/%2E%2e/x", addr, "ka", ""), 400},
		{"host form dot dot", get("/a/../b", "80-n-a1.ports.test", "ka", ""), 400},
		{"encoded slash in the ID", get("/n-a1%2F80/x", addr, "ka", ""), 404},
		{"encoded slash in the port", get("/n-a1/80%2Fx", addr, "ka", ""), 404},
		{"port 0", get("/n-a1/0/", addr, "ka", ""), 404},
		{"leading zero", get("/n-a1/080/", addr, "ka", ""), 404},
		{"not an ID", get("/N-A1/80/", addr, "ka", ""), 404},
		{"the API", get("/dsec.sandbox.v1.SandboxService/List", addr, "ka", ""), 404},
		{"healthz", get("/healthz", addr, "", ""), 404},
		{"connect", "CONNECT n-a1:80 HTTP/1.1\r\nHost: n-a1:80\r\n\r\n", 400},
		{"huge header", get("/n-a1/80/", addr, "ka", "X-Big: "+strings.Repeat("x", 2*MaxHeaderBytes)+"\r\n"), 431},
	} {
		t.Run(c.name, func(t *testing.T) {
			if code, body := raw(t, addr, c.req); code != c.want {
				t.Errorf("%s = %d %.200q, want %d", c.name, code, body, c.want)
			}
		})
	}
	if d := f.dialed(); len(d) != 0 {
		t.Errorf("dials = %v, want none", d)
	}
}

// TestForward: the prefix is stripped, the platform's credentials and
// forwarded headers the client made up do not reach the sandbox, cookies
// the sandbox may not set are dropped, and each request dials as its own
// key.
func TestForward(t *testing.T) {
	f, addr := newTest(t)
	code, body := raw(t, addr, get("/n-a1/80/x/a%2Fb?q=1", addr, "ka",
		"Cookie: app=1; "+CookieName+"=s\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Host: evil\r\n"))
	if code != 200 {
		t.Fatalf("GET = %d %q", code, body)
	}
	for _, want := range []string{"path=/x/a/b raw=/x/a%2Fb", "Cookie: app=1\r\n", "X-Forwarded-For: 127.0.0.1\r\n", "X-Forwarded-Host: " + addr + "\r\n", "X-Forwarded-Prefix: /n-a1/80\r\n", "X-Forwarded-Proto: http\r\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("upstream got no %q:\n%s", want, body)
		}
	}
	for _, bad := range []string{"Authorization", "Bearer", CookieName, "6.6.6.6", "evil"} {
		if strings.Contains(body, bad) {
			t.Errorf("upstream got %q:\n%s", bad, body)
		}
	}
	resp, err := http.DefaultTransport.RoundTrip(mustReq(t, "http://"+addr+"/n-a1/80/", "ka"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Values("Set-Cookie"); !cmp.Equal(got, []string{"own=1; Path=/"}) {
		t.Errorf("Set-Cookie passed = %q, want only own=1", got)
	}
	// Another project's key, an admin's, a port nobody listens on.
	for _, c := range []struct {
		path, key string
		want      int
	}{{"/n-a1/80/", "kb", 404}, {"/n-a1/80/", "adm", 200}, {"/n-a1/81/", "ka", 502}} {
		if code, body := raw(t, addr, get(c.path, addr, c.key, "")); code != c.want {
			t.Errorf("GET %s as %s = %d %q, want %d", c.path, c.key, code, body, c.want)
		}
	}
	want := []string{"a n-a1:80", "a n-a1:80", "b n-a1:80", "default n-a1:80", "a n-a1:81"}
	if d := f.dialed(); !cmp.Equal(d, want) {
		t.Errorf("dials = %v, want %v (one per request, as its key)", d, want)
	}
}

func mustReq(t *testing.T, u, key string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	return req
}

// TestUpgradePassesThrough: a WebSocket-style upgrade reaches the sandbox
// and the connection then carries bytes both ways.
func TestUpgradePassesThrough(t *testing.T) {
	_, addr := newTest(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /n-a1/80/ws HTTP/1.1\r\nHost: "+addr+"\r\nAuthorization: Bearer ka\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade = %v, %v; want 101", resp, err)
	}
	_, _ = io.WriteString(c, "frame\n")
	if got, err := br.ReadString('\n'); got != "frame\n" {
		t.Errorf("echo after the upgrade = %q, %v", got, err)
	}
}

// TestBrowserLogin: a login link works once, on its own origin only, as a
// host-only HttpOnly cookie that the sandbox never sees and that another
// origin's page cannot use.
func TestBrowserLogin(t *testing.T) {
	f, addr := newTest(t)
	_, port, _ := net.SplitHostPort(addr)
	code, body := raw(t, addr, "POST /_dsec/v1/login HTTP/1.1\r\nHost: "+addr+"\r\nAuthorization: Bearer ka\r\nContent-Length: 30\r\nConnection: close\r\n\r\n{\"sandbox\":\"n-a1\",\"port\":80}  ")
	if code != 200 {
		t.Fatalf("mint = %d %q", code, body)
	}
	prefix := `{"url":"http://80-n-a1.ports.test:` + port + `/_dsec/login?token=`
	if !strings.HasPrefix(body, prefix) {
		t.Fatalf("mint = %q, want %s...", body, prefix)
	}
	tok, _, _ := strings.Cut(strings.TrimPrefix(body, prefix), `"`)
	if code, _ := raw(t, addr, "POST /_dsec/v1/login HTTP/1.1\r\nHost: "+addr+"\r\nContent-Length: 2\r\n\r\n{}"); code != 401 {
		t.Errorf("mint without a key = %d, want 401", code)
	}
	// Redeemed on another sandbox's origin: refused, and the token is gone.
	if code, _ := raw(t, addr, get("/_dsec/login?token="+tok, "80-n-b1.ports.test", "", "")); code != 401 {
		t.Errorf("login on another origin = %d, want 401", code)
	}
	code, body = raw(t, addr, "POST /_dsec/v1/login HTTP/1.1\r\nHost: "+addr+"\r\nAuthorization: Bearer ka\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"sandbox\":\"n-a1\",\"port\":80}")
	if code != 200 {
		t.Fatalf("mint = %d %q", code, body)
	}
	tok, _, _ = strings.Cut(strings.TrimPrefix(body, prefix), `"`)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(c, get("/_dsec/login?token="+tok, "80-n-a1.ports.test:"+port, "", ""))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	c.Close()
	if err != nil || resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login = %v, %v; want 303", resp, err)
	}
	sc := resp.Header.Values("Set-Cookie")
	if len(sc) != 1 || !strings.Contains(sc[0], "HttpOnly") || strings.Contains(strings.ToLower(sc[0]), "domain") || !strings.HasPrefix(sc[0], CookieName+"=") {
		t.Fatalf("login Set-Cookie = %q, want one host-only HttpOnly %s", sc, CookieName)
	}
	sess := strings.SplitN(sc[0], ";", 2)[0]
	if code, _ := raw(t, addr, get("/_dsec/login?token="+tok, "80-n-a1.ports.test", "", "")); code != 401 {
		t.Errorf("a login link used twice = %d, want 401", code)
	}
	hostA := "80-n-a1.ports.test:" + port
	for _, c := range []struct {
		name, host, extra string
		want              int
	}{
		{"own origin", hostA, "", 200},
		{"own origin, navigation from another site", hostA, "Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\n", 200},
		{"fetch from another sandbox's page", hostA, "Sec-Fetch-Site: same-site\r\nSec-Fetch-Mode: cors\r\nOrigin: http://80-n-b1.ports.test:" + port + "\r\n", 403},
		{"WebSocket from another origin", hostA, "Origin: http://80-n-b1.ports.test:" + port + "\r\n", 403},
		{"form POST from another site", hostA, "Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\n", 403},
		{"another sandbox's origin", "80-n-b1.ports.test:" + port, "", 401},
		{"another port's origin", "81-n-a1.ports.test:" + port, "", 401},
	} {
		req := get("/", c.host, "", "Cookie: "+sess+"\r\n"+c.extra)
		if c.name == "form POST from another site" {
			req = strings.Replace(req, "GET", "POST", 1)
		}
		code, body := raw(t, addr, req)
		if code != c.want {
			t.Errorf("%s = %d %q, want %d", c.name, code, body, c.want)
		}
		if code == 200 && (strings.Contains(body, CookieName) || strings.Contains(body, "Authorization")) {
			t.Errorf("%s: the sandbox got the platform's credentials:\n%s", c.name, body)
		}
	}
	for _, d := range f.dialed() {
		if d != "a n-a1:80" {
			t.Errorf("dial %q, want only team a's to n-a1:80", d)
		}
	}
}

// TestRevokedKeyEndsSessions: a session authenticates its key on every
// request.
func TestRevokedKeyEndsSessions(t *testing.T) {
	f, addr := newTest(t)
	code, body := raw(t, addr, "POST /_dsec/v1/login HTTP/1.1\r\nHost: "+addr+"\r\nAuthorization: Bearer ka\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"sandbox\":\"n-a1\",\"port\":80}")
	if code != 200 {
		t.Fatal(body)
	}
	_, rest, _ := strings.Cut(body, "token=")
	tok, _, _ := strings.Cut(rest, `"`)
	c, _ := net.Dial("tcp", addr)
	_, _ = io.WriteString(c, get("/_dsec/login?token="+tok, "80-n-a1.ports.test", "", ""))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	sess := strings.SplitN(resp.Header.Get("Set-Cookie"), ";", 2)[0]
	delete(f.keys, "ka")
	if code, _ := raw(t, addr, get("/", "80-n-a1.ports.test", "", "Cookie: "+sess+"\r\n")); code != 401 {
		t.Errorf("a session of a revoked key = %d, want 401", code)
	}
}

func TestHostForm(t *testing.T) {
	p := New(Config{Domain: "Ports.Test."})
	for _, c := range []struct {
		host, id string
		port     int
		ok       bool
	}{
		{"8080-n-a1.ports.test", "n-a1", 8080, true},
		{"8080-n-a1.PORTS.test:7422", "n-a1", 8080, true},
		{"8080-n-a1.ports.test.", "", 0, false},
		{"x.8080-n-a1.ports.test", "", 0, false},
		{"8080-.ports.test", "", 0, false},
		{"8080n-a1.ports.test", "", 0, false},
		{"0-n-a1.ports.test", "", 0, false},
		{"99999-n-a1.ports.test", "", 0, false},
		{"ports.test", "", 0, false},
		{"8080-n-a1.evilports.test", "", 0, false},
		{"127.0.0.1:7422", "", 0, false},
	} {
		id, port, ok := p.hostForm(c.host)
		if id != c.id || port != c.port || ok != c.ok {
			t.Errorf("hostForm(%q) = %q, %d, %v; want %q, %d, %v", c.host, id, port, ok, c.id, c.port, c.ok)
		}
	}
}

// FuzzRoute: the parsers of the host and path forms never panic, and what
// they accept names a valid ID and port and a path without dot segments
// once forward has checked it.
func FuzzRoute(f *testing.F) {
	for _, s := range []string{"/n-a1/80/x", "/n-a1%2F80/x", "/a/1/../b", "80-n-a1.ports.test", "/_dsec/v1/tunnel/n-a1/80"} {
		f.Add(s)
	}
	p := New(Config{Domain: "ports.test"})
	f.Fuzz(func(t *testing.T, s string) {
		if id, port, ok := p.hostForm(s); ok && (id == "" || port < 1 || port > 65535) {
			t.Fatalf("hostForm(%q) = %q, %d", s, id, port)
		}
		tg, err := p.pathForm(s)
		if err == nil && (tg.id == "" || tg.port < 1 || !strings.HasPrefix(tg.path, "/") || !strings.HasPrefix(s, tg.prefix)) {
			t.Fatalf("pathForm(%q) = %+v", s, tg)
		}
		_ = dotSegments(s)
	})
}
