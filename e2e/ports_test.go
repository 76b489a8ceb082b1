package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// portsCGI is a CGI of busybox httpd that shows the headers it got (as
// HTTP_* variables) and the request's URI; portsCookieCGI sets a cookie for
// a whole domain (refused) and one of its own (kept).
const (
	portsCGI       = "#!/bin/sh\necho 'Content-Type: text/plain'\necho\nenv | sort\n"
	portsCookieCGI = "#!/bin/sh\necho 'Content-Type: text/plain'\necho 'Set-Cookie: evil=1; Domain=localhost; Path=/'\necho 'Set-Cookie: dsec_port=forged; Path=/'\necho 'Set-Cookie: own=1; Path=/'\necho\necho ok\n"
)

// TestPorts drives the ports proxy of a real dsec up: a sandbox without
// network serves HTTP (busybox httpd) and a TCP echo (busybox nc) on its
// own loopback, reached only through the proxy, as its project's key
// and never as another's.
func TestPorts(t *testing.T) {
	portsAddr := freePort(t)
	p := newPlatform(t, func(p *platform) { p.PortsAddr = portsAddr })
	p.Busybox(t)
	ctx := ctxT(t)
	admin := p.AdminKey(t)
	keyA, keyB := p.ProjectKey(t, "team-a"), p.ProjectKey(t, "team-b")
	a, b := p.Client(t, keyA), p.Client(t, keyB)
	sa, err := a.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	defer sa.Delete(context.Background())
	sb, err := b.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	defer sb.Delete(context.Background())
	for _, s := range []*dsec.Sandbox{sa, sb} {
		if err := s.WriteFile(ctx, "/www/cgi-bin/h", []byte(portsCGI), dsec.WithMode(0o755), dsec.WithMakeParents()); err != nil {
			t.Fatal(err)
		}
		if err := s.WriteFile(ctx, "/www/cgi-bin/c", []byte(portsCookieCGI), dsec.WithMode(0o755)); err != nil {
			t.Fatal(err)
		}
		if err := s.WriteFile(ctx, "/www/index.html", []byte("hello from "+s.ID+"\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ExecDetached(ctx, dsec.ExecRequest{Argv: []string{"busybox", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sa.ExecDetached(ctx, dsec.ExecRequest{Argv: []string{"busybox", "nc", "-ll", "-p", "9000", "-e", "cat"}}); err != nil {
		t.Fatal(err)
	}
	base := "http://" + portsAddr
	get := func(t *testing.T, rawURL, key string, hdr map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatalf("GET %s = %v", rawURL, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	index := base + "/" + sa.ID + "/8080/index.html"
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := get(t, index, keyA, nil)
		if code == 200 && body == "hello from "+sa.ID+"\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s = %d %q, want the sandbox's page", index, code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	t.Run("Auth", func(t *testing.T) {
		for _, c := range []struct {
			name, url, key string
			want           int
		}{
			{"no key", index, "", 401},
			{"bad key", index, "dsk_nonsense", 401},
			{"other project's key", index, keyB, 404},
			{"other project's sandbox", base + "/" + sb.ID + "/8080/index.html", keyA, 404},
			{"admin", index, admin, 200},
			{"own project", base + "/" + sb.ID + "/8080/index.html", keyB, 200},
		} {
			if code, body := get(t, c.url, c.key, nil); code != c.want {
				t.Errorf("%s: GET %s = %d %q, want %d", c.name, c.url, code, body, c.want)
			}
		}
	})

	t.Run("NoCredentialsForwarded", func(t *testing.T) {
		code, body := get(t, base+"/"+sa.ID+"/8080/cgi-bin/h?q=1", keyA, map[string]string{
			"Cookie": "dsec_port=abc; app=1", "X-Forwarded-For": "6.6.6.6",
		})
		if code != 200 {
			t.Fatalf("GET cgi = %d %q", code, body)
		}
		for _, bad := range []string{keyA, "HTTP_AUTHORIZATION", "dsec_port", "6.6.6.6"} {
			if strings.Contains(body, bad) {
				t.Errorf("the sandbox's server got %q:\n%s", bad, body)
			}
		}
		for _, want := range []string{"HTTP_COOKIE=app=1", "REQUEST_URI=/cgi-bin/h?q=1", "HTTP_X_FORWARDED_FOR=127.0.0.1", "HTTP_X_FORWARDED_PREFIX=/" + sa.ID + "/8080", "HTTP_X_FORWARDED_PROTO=http"} {
			if !strings.Contains(body, want) {
				t.Errorf("the sandbox's server did not get %q:\n%s", want, body)
			}
		}
	})

	t.Run("NothingListens", func(t *testing.T) {
		start := time.Now()
		code, body := get(t, base+"/"+sa.ID+"/8081/", keyA, nil)
		if code != http.StatusBadGateway || !strings.Contains(body, "nothing listens on port 8081") || time.Since(start) > time.Second {
			t.Errorf("GET of a port nothing listens on = %d %q after %v, want 502 at once", code, body, time.Since(start))
		}
	})

	t.Run("HugeHeader", func(t *testing.T) {
		code, _ := get(t, index, keyA, map[string]string{"X-Big": strings.Repeat("a", 64<<10)})
		if code != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("GET with a 64 KiB header = %d, want 431", code)
		}
	})

	t.Run("PathTricks", func(t *testing.T) {
		for _, c := range []struct {
			path string
			want int
		}{
			{"/" + sa.ID + "/8080/../" + sb.ID + "/8080/index.html", 400},
			{"/" + sa.ID + "/8080/%2e%2e/x", 400},
			{"/" + sa.ID + "%2F8080/index.html", 404},
			{"/" + sa.ID + "/8080%2Findex.html", 404},
			{"/" + sa.ID + "/08080/index.html", 404},
			{"/" + sa.ID + "/70000/index.html", 404},
			{"/" + strings.ToUpper(sa.ID) + "/8080/index.html", 404},
			{"/../" + sa.ID + "/8080/index.html", 404},
		} {
			// Sent as written: no client-side cleaning.
			conn, err := net.Dial("tcp", portsAddr)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.WriteString(conn, "GET "+c.path+" HTTP/1.1\r\nHost: "+portsAddr+"\r\nAuthorization: Bearer "+keyA+"\r\nConnection: close\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				conn.Close()
				t.Fatalf("GET %s = %v", c.path, err)
			}
			body, _ := io.ReadAll(resp.Body)
			conn.Close()
			if resp.StatusCode != c.want || strings.Contains(string(body), "hello from") {
				t.Errorf("GET %s = %d %q, want %d", c.path, resp.StatusCode, body, c.want)
			}
		}
	})

	t.Run("ListenersApart", func(t *testing.T) {
		// The API does not serve ports...
		if code, body := get(t, p.URL()+"/"+sa.ID+"/8080/index.html", keyA, nil); code != 404 || strings.Contains(body, "hello") {
			t.Errorf("GET a port on the API's listener = %d %q, want 404", code, body)
		}
		// ...and the ports proxy does not serve the API.
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/dsec.sandbox.v1.SandboxService/List", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+admin)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || strings.Contains(string(body), sa.ID) {
			t.Errorf("an API call on the ports listener = %d %q, want 404", resp.StatusCode, body)
		}
		if code, _ := get(t, base+"/healthz", "", nil); code != 404 {
			t.Errorf("/healthz on the ports listener = %d, want 404", code)
		}
	})

	t.Run("BrowserHostForm", func(t *testing.T) {
		testPortsBrowser(t, p, portsAddr, keyA, keyB, sa.ID, sb.ID)
	})

	t.Run("PortForward", func(t *testing.T) {
		testPortForward(t, p, portsAddr, keyA, keyB, sa.ID)
	})
}

// hostClient is a browser-like client of the host form: every name is
// dialled at the ports proxy, cookies are kept per host, redirects followed.
func hostClient(t *testing.T, portsAddr string) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, portsAddr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Jar: jar, Transport: tr, Timeout: 20 * time.Second}
}

func loginLink(t *testing.T, portsAddr, key, id string, port int) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"sandbox": id, "port": port})
	req, _ := http.NewRequest(http.MethodPost, "http://"+portsAddr+"/_dsec/v1/login", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lr struct {
		URL string `json:"url"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&lr); err != nil || resp.StatusCode != 200 {
		t.Fatalf("POST /_dsec/v1/login = %d, %v", resp.StatusCode, err)
	}
	return lr.URL
}

func testPortsBrowser(t *testing.T, p *platform, portsAddr, keyA, keyB, idA, idB string) {
	_, port, _ := net.SplitHostPort(portsAddr)
	hostA := "http://8080-" + idA + ".localhost:" + port
	hostB := "http://8080-" + idB + ".localhost:" + port
	link := loginLink(t, portsAddr, keyA, idA, 8080)
	if !strings.HasPrefix(link, hostA+"/_dsec/login?token=") {
		t.Fatalf("login link = %q, want one of %s", link, hostA)
	}
	// The login link logs a browser in to A's origin alone.
	c := hostClient(t, portsAddr)
	var setCookie []string
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		setCookie = req.Response.Header.Values("Set-Cookie")
		return nil
	}
	resp, err := c.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello from "+idA+"\n" {
		t.Fatalf("GET the login link = %d %q, want the sandbox's page", resp.StatusCode, body)
	}
	if len(setCookie) != 1 || !strings.Contains(setCookie[0], "HttpOnly") || strings.Contains(strings.ToLower(setCookie[0]), "domain=") {
		t.Errorf("the login's Set-Cookie = %q, want one host-only HttpOnly cookie", setCookie)
	}
	// Used once.
	if resp, err := hostClient(t, portsAddr).Get(link); err != nil || resp.StatusCode != 401 {
		t.Errorf("the login link used again = %v, %v; want 401", resp, err)
	}
	// The sandbox never sees the platform's cookie.
	resp, err = c.Get(hostA + "/cgi-bin/h")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(body), "dsec_port") || strings.Contains(string(body), "HTTP_AUTHORIZATION") {
		t.Errorf("cgi through the host form = %d:\n%s\nwant no dsec cookie nor key", resp.StatusCode, body)
	}
	// The cookie of A's origin is not sent to B's, and presented there by
	// hand it admits nothing.
	u, _ := url.Parse(hostA + "/")
	var sess *http.Cookie
	for _, ck := range c.Jar.Cookies(u) {
		if ck.Name == "dsec_port" {
			sess = ck
		}
	}
	if sess == nil {
		t.Fatal("no session cookie for A's origin")
	}
	ub, _ := url.Parse(hostB + "/")
	if len(c.Jar.Cookies(ub)) != 0 {
		t.Errorf("cookies for B's origin = %v, want none", c.Jar.Cookies(ub))
	}
	req, _ := http.NewRequest(http.MethodGet, hostB+"/index.html", nil)
	req.AddCookie(sess)
	resp, err = hostClient(t, portsAddr).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || strings.Contains(string(body), "hello") {
		t.Errorf("A's cookie on B's origin = %d %q, want 401", resp.StatusCode, body)
	}
	// A page of another sandbox (same site, another origin) cannot make
	// the browser act on A's with A's cookie; a plain navigation can.
	for _, c2 := range []struct {
		site, mode, origin string
		want               int
	}{
		{"same-site", "cors", hostB, 403},
		{"cross-site", "no-cors", "", 403},
		{"same-site", "websocket", hostB, 403},
		{"same-site", "navigate", "", 200},
		{"same-origin", "cors", hostA, 200},
	} {
		req, _ := http.NewRequest(http.MethodGet, hostA+"/index.html", nil)
		req.Header.Set("Sec-Fetch-Site", c2.site)
		req.Header.Set("Sec-Fetch-Mode", c2.mode)
		if c2.origin != "" {
			req.Header.Set("Origin", c2.origin)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c2.want {
			t.Errorf("a %s %s request with A's cookie = %d, want %d", c2.site, c2.mode, resp.StatusCode, c2.want)
		}
	}
	// A sandbox cannot set cookies for other origins, nor the platform's.
	resp, err = c.Get(hostA + "/cgi-bin/c")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := resp.Header.Values("Set-Cookie")
	if len(got) != 1 || !strings.HasPrefix(got[0], "own=1") {
		t.Errorf("Set-Cookie passed from the sandbox = %q, want only own=1", got)
	}
	// B's key cannot mint a working link to A's sandbox.
	linkB := loginLink(t, portsAddr, keyB, idA, 8080)
	if resp, err := hostClient(t, portsAddr).Get(linkB); err != nil || resp.StatusCode != 404 {
		t.Errorf("team-b's login link to team-a's sandbox = %v, %v; want 404", resp, err)
	}
	// Without a cookie the host form wants credentials.
	if resp, err := hostClient(t, portsAddr).Get(hostA + "/"); err != nil || resp.StatusCode != 401 {
		t.Errorf("the host form without credentials = %v, %v; want 401", resp, err)
	}
}

func testPortForward(t *testing.T, p *platform, portsAddr, keyA, keyB, idA string) {
	run := func(key string, args ...string) (*exec.Cmd, *bufio.Reader, *bytes.Buffer) {
		cmd := exec.Command(p.Bin, append([]string{"port", "--ports-addr", "http://" + portsAddr}, args...)...)
		cmd.Env = append(os.Environ(), "DSEC_ADDR="+p.URL(), "DSEC_API_KEY="+key, "HOME="+p.StateDir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, bufio.NewReader(out), &errb
	}
	cmd, out, errb := run(keyA, idA, "9000")
	defer cmd.Process.Kill()
	line, err := out.ReadString('\n')
	if err != nil {
		t.Fatalf("dsec port printed %q, %v; stderr %q", line, err, errb)
	}
	local := strings.TrimSpace(line)
	for i := range 3 { // each connection is a tunnel of its own
		c, err := net.DialTimeout("tcp", local, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := "ping " + string(rune('a'+i)) + "\n"
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if got != msg {
			t.Fatalf("echo through dsec port = %q, %v; want %q (stderr %q)", got, err, msg, errb)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("dsec port after Ctrl-C = %v, want exit 0 (stderr %q)", err, errb)
		}
	case <-time.After(5 * time.Second):
		t.Error("dsec port did not stop on Ctrl-C")
	}
	// Another project's key gets nothing through: the connection is closed
	// and the reason printed.
	cmd, out, errb = run(keyB, idA, "9000")
	defer cmd.Process.Kill()
	line, err = out.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", strings.TrimSpace(line), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "ping\n")
	// Closed (EOF, or a reset as the ping was never read).
	if got, err := io.ReadAll(c); len(got) != 0 || (err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET)) {
		t.Errorf("team-b's tunnel to team-a's sandbox read %q, %v; want nothing", got, err)
	}
	c.Close()
	_ = cmd.Process.Signal(syscall.SIGINT)
	_ = cmd.Wait()
	if !strings.Contains(errb.String(), "not found") {
		t.Errorf("dsec port with team-b's key printed %q, want the sandbox not found", errb)
	}
	// --browser prints a login link of the host form.
	o, e, code := p.CLI(t, "", "port", "--api-key", keyA, "--ports-addr", portsAddr, idA, "8080", "--browser")
	if _, port, _ := net.SplitHostPort(portsAddr); code != 0 || !strings.HasPrefix(o, "http://8080-"+idA+".localhost:"+port+"/_dsec/login?token=") {
		t.Errorf("dsec port --browser = %q, %q, exit %d", o, e, code)
	}
}
