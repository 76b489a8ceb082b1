package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/portproxy"
)

// DefaultPortsListen is the ports proxy's default address.
const DefaultPortsListen = "127.0.0.1:7422"

// PortsConfig configures the ports proxy (internal/portproxy): the only
// way into sandboxes' listening ports, on a listener and origin of its own.
type PortsConfig struct {
	// Listen is its address; empty turns it off.
	Listen string
	// Domain is the domain of its host form, PORT-ID.Domain (default
	// "localhost").
	Domain string
}

// listenPorts binds the ports proxy's listener, if any.
func listenPorts(pc PortsConfig) (net.Listener, error) {
	if pc.Listen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", pc.Listen)
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "listen on %s (--ports-listen): %v", pc.Listen, err)
	}
	return ln, nil
}

// startPorts serves the ports proxy on ln; the returned func stops it
// (connections already upgraded, such as WebSockets and tunnels, end
// with the process).
func startPorts(pc PortsConfig, ln net.Listener, platform portproxy.Platform, log *slog.Logger) func() {
	srv := portproxy.New(portproxy.Config{Platform: platform, Domain: pc.Domain, Logger: log}).Server()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	log.Info("ports proxy is up", "addr", "http://"+ln.Addr().String(), "host_form", "PORT-ID."+domainOr(pc.Domain))
	stopped := false
	return func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("ports proxy", "err", err)
		}
	}
}

func domainOr(d string) string {
	if d == "" {
		return "localhost"
	}
	return d
}
