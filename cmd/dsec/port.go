package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newPortCmd(g *globalFlags) *cobra.Command {
	var listen, portsAddr string
	var browser bool
	cmd := &cobra.Command{
		Use:   "port ID PORT",
		Short: "Forward a local port to a port a sandbox listens on",
		Long: `Forward a local port to PORT of sandbox ID, like kubectl port-forward: it listens
on --listen (default 127.0.0.1:0, a free port), prints the local address it
listens on, and carries each connection to it through the platform's ports
proxy to 127.0.0.1:PORT inside the sandbox, until Ctrl-C. The sandbox needs no
network of its own: its loopback is enough.

With --browser it prints a login link for the ports proxy's host form instead
(http://PORT-ID.<domain>:7422/...): opening it in a browser, once and within a
minute, sets a cookie that only that sandbox port's origin receives, so the
page works in the browser without an API key in any URL.

The ports proxy is at --ports-addr, else $DSEC_PORTS_ADDR, else the API's host
on port 7422 (dsec up --ports-listen).

  dsec port sbx-1 8080            # prints 127.0.0.1:41234; curl it
  dsec port sbx-1 8080 --listen 127.0.0.1:9000
  dsec port sbx-1 8080 --browser  # prints a login link`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			port, ok := sandbox.ParsePort(args[1])
			if !ok {
				return usageErrorf("port %q: want a number of 1-65535", args[1])
			}
			cfg, err := dsec.LoadConfig(dsec.Config{Addr: g.addr, APIKey: g.apiKey, StateDir: g.stateDir})
			if err != nil {
				return err
			}
			base, err := portsBase(portsAddr, cfg.Addr)
			if err != nil {
				return err
			}
			if cfg.APIKey == "" {
				return errors.New("no API key: pass --api-key, set DSEC_API_KEY, or run as a user who can read <state-dir>/admin.key")
			}
			fw := &portForwarder{base: base, key: cfg.APIKey, id: id, port: port}
			if browser {
				link, err := fw.loginLink(cmd.Context())
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), link)
				return nil
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s (--listen): %w", listen, err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			fmt.Fprintln(cmd.OutOrStdout(), ln.Addr().String())
			fmt.Fprintf(cmd.ErrOrStderr(), "forwarding %s to port %d of sandbox %s; Ctrl-C stops\n", ln.Addr(), port, id)
			return fw.serve(ctx, ln, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:0", "local address to listen on (host:port; port 0 picks a free one)")
	f.StringVar(&portsAddr, "ports-addr", "", "URL of the ports proxy (default $DSEC_PORTS_ADDR, else the API's host on port 7422)")
	f.BoolVar(&browser, "browser", false, "print a single-use login link for a browser instead of forwarding")
	return cmd
}

// portsBase returns the ports proxy's URL.
func portsBase(flag, apiAddr string) (*url.URL, error) {
	addr := flag
	if addr == "" {
		addr = os.Getenv("DSEC_PORTS_ADDR")
	}
	if addr == "" {
		u, err := url.Parse(apiAddr)
		if err != nil {
			return nil, err
		}
		u.Host = net.JoinHostPort(u.Hostname(), "7422")
		u.Path = ""
		return u, nil
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageErrorf("--ports-addr %q: want a URL such as http://127.0.0.1:7422", addr)
	}
	return u, nil
}

// portForwarder carries connections to one port of one sandbox.
type portForwarder struct {
	base *url.URL
	key  string
	id   string
	port int
}

// serve accepts local connections until ctx ends, then closes them.
func (f *portForwarder) serve(ctx context.Context, ln net.Listener, logw io.Writer) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]bool{} // guarded by mu
	go func() {
		<-ctx.Done()
		ln.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			wg.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		mu.Lock()
		open[c] = true
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { mu.Lock(); delete(open, c); mu.Unlock() }()
			up, err := f.dial(ctx)
			if err != nil {
				fmt.Fprintf(logw, "dsec port: %v\n", err)
				c.Close()
				return
			}
			mu.Lock()
			open[up] = true
			mu.Unlock()
			sandbox.Pipe(c, up)
			mu.Lock()
			delete(open, up)
			mu.Unlock()
		}()
	}
}

// dial opens a tunnel through the ports proxy.
func (f *portForwarder) dial(ctx context.Context) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var d net.Dialer
	host := f.base.Host
	if f.base.Port() == "" {
		port := "80"
		if f.base.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(f.base.Hostname(), port)
	}
	var conn net.Conn
	var err error
	if f.base.Scheme == "https" {
		td := tls.Dialer{NetDialer: &d, Config: &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.base.Hostname()}}
		conn, err = td.DialContext(dctx, "tcp", host)
	} else {
		conn, err = d.DialContext(dctx, "tcp", host)
	}
	if err != nil {
		return nil, fmt.Errorf("reach the ports proxy at %s (dsec up --ports-listen; --ports-addr): %w", f.base, err)
	}
	if dl, ok := dctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	req, _ := http.NewRequest(http.MethodGet, f.base.JoinPath("/_dsec/v1/tunnel", f.id, strconv.Itoa(f.port)).String(), nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", sandbox.PortTunnelUpgrade)
	req.Header.Set("Authorization", "Bearer "+f.key)
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("the ports proxy at %s: %w", f.base, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		return nil, proxyError(resp)
	}
	_ = conn.SetDeadline(time.Time{})
	return sandbox.BufferedConn(conn, br), nil
}

// loginLink asks the ports proxy for a browser login link.
func (f *portForwarder) loginLink(ctx context.Context) (string, error) {
	body, _ := json.Marshal(sandbox.PortLoginRequest{Sandbox: f.id, Port: f.port})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.base.JoinPath("/_dsec/v1/login").String(), bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+f.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		return "", fmt.Errorf("reach the ports proxy at %s (dsec up --ports-listen; --ports-addr): %w", f.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", proxyError(resp)
	}
	var lr sandbox.PortLoginResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&lr); err != nil {
		return "", fmt.Errorf("the ports proxy's answer: %w", err)
	}
	return lr.URL, nil
}

func proxyError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	msg := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(b)), "dsec: "))
	if msg == "" {
		msg = resp.Status
	}
	return errors.New(msg)
}
