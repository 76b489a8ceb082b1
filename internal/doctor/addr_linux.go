package doctor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"
)

func checkAPIAddr(ctx context.Context, env Env) Result {
	const fixFlag = "pass --listen HOST:PORT (an address of this machine) to dsec up"
	host, port, err := net.SplitHostPort(env.Listen)
	if err != nil {
		return failf(fixFlag, "API address %q: %v", env.Listen, err)
	}
	ln, err := net.Listen("tcp", env.Listen)
	if err == nil {
		ln.Close()
		return okf("%s is free", env.Listen)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		return failf(fixFlag, "cannot listen on %s: %v", env.Listen, err)
	}
	switch ip := net.ParseIP(host); {
	case host == "" || ip != nil && ip.IsUnspecified() && ip.To4() != nil:
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified():
		host = "::1"
	}
	served, detail := healthz(ctx, net.JoinHostPort(host, port))
	if served {
		return okf("%s is served by a running dsec (%s)", env.Listen, detail)
	}
	return failf(fmt.Sprintf("stop the program listening there (ss -ltnp 'sport = :%s' names it), or %s", port, strings.TrimPrefix(fixFlag, "pass ")),
		"%s is in use by another program (%s)", env.Listen, detail)
}

// healthz asks addr for dsec's /healthz and reports whether a dsec answered
// (ready, or still starting), with what it saw.
func healthz(ctx context.Context, addr string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Sprintf("GET /healthz: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	body := strings.TrimSpace(string(b))
	switch {
	case resp.StatusCode == http.StatusOK && body == "ok":
		return true, "GET /healthz answers ok"
	case resp.StatusCode == http.StatusServiceUnavailable && body == "starting":
		return true, "GET /healthz: starting"
	}
	return false, fmt.Sprintf("GET /healthz answers %d %q", resp.StatusCode, body)
}
