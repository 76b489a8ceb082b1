//go:build !dsec_client

package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"
)

// servePprof serves Go's profiles (/debug/pprof/) of this process on the
// loopback address in the environment variable env (e.g. DSEC_PPROF=
// 127.0.0.1:6060 for dsec up, DSEC_KEEPER_PPROF for the node keeper), for
// profiling the create and exec paths. Nothing is served when it is unset.
func servePprof(env string, log *slog.Logger) error {
	addr := os.Getenv(env)
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s=%q: want host:port: %w", env, addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s=%q: profiles are served on a loopback address only", env, addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: %w", env, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("serving profiles", "addr", "http://"+ln.Addr().String()+"/debug/pprof/")
	return nil
}
