package server

import (
	"context"
	"crypto/subtle"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsecproject/dsec/internal/apiserver"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/fusion"
	"github.com/dsecproject/dsec/internal/project"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// FusionConfig configures the SandboxFusion-compatible run_code API. Its
// sandboxes live in the reserved project project.SandboxFusion, created
// with a service key only this process holds, so no API key (a tenant's
// or an admin's) can list, exec into or write to them.
type FusionConfig struct {
	// Listen is its address; empty turns it off.
	Listen string
	// RequireKey makes every call bring a dsec API key
	// (`Authorization: Bearer <key>`, or the URL path /<key>/run_code)
	// on loopback too; beyond loopback one is always required. Without
	// it, calls from loopback need none (SandboxFusion's clients send
	// none).
	RequireKey bool
	// KeyFile, when set, holds the one API key the API accepts from
	// clients; by default it accepts any valid key. Beyond loopback it may
	// not be the admin key (an admin key does not belong in URLs).
	KeyFile string
	// Images maps languages to images (default: fusion.DefaultLanguages).
	// Sandboxes of the reserved project can only run public images.
	Images map[string]string
	// PoolSize is the sandboxes created ahead per image (default 4,
	// negative for none); Memory their default memory limit (1 GiB).
	PoolSize int
	Memory   int64
	// MaxBodyBytes bounds a request's body (0: Config.MaxRequestBytes,
	// else 64 MiB).
	MaxBodyBytes int64

	// Set by listenFusion.
	loopback  bool   // the listener is on loopback
	clientKey string // KeyFile's key
}

// listenFusion binds fc's listener, if any, and checks the flags that go
// with it, before anything else starts (a failed start then leaves
// nothing behind): the key file must hold a key, which beyond loopback
// may not be the admin key of stateDir.
func listenFusion(fc *FusionConfig, stateDir string) (net.Listener, error) {
	if fc.Listen == "" {
		return nil, nil
	}
	if fc.KeyFile != "" {
		b, err := os.ReadFile(fc.KeyFile)
		if err != nil {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "--sandboxfusion-key-file: %v", err)
		}
		fc.clientKey = strings.TrimSpace(string(b))
		if fc.clientKey == "" {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "--sandboxfusion-key-file %s is empty: put an API key in it (dsec key create)", fc.KeyFile)
		}
	}
	ln, err := net.Listen("tcp", fc.Listen)
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "listen on %s (--sandboxfusion-listen): %v", fc.Listen, err)
	}
	a, ok := ln.Addr().(*net.TCPAddr)
	fc.loopback = ok && a.IP.IsLoopback()
	if !fc.loopback && fc.clientKey != "" {
		admin, err := os.ReadFile(filepath.Join(stateDir, "admin.key"))
		if err == nil && strings.TrimSpace(string(admin)) == fc.clientKey {
			ln.Close()
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "--sandboxfusion-key-file holds the admin key, and beyond loopback clients may send the key in URLs: "+
				"create a key for them (dsec key create --project sandboxfusion-clients > FILE)")
		}
	}
	return ln, nil
}

// startFusion serves the SandboxFusion API on ln (from listenFusion), as
// a client of the API at apiAddr under a new service key of the reserved
// project, checking the keys clients send with api. It returns what stops
// it (idempotent).
func startFusion(ctx context.Context, fc FusionConfig, ln net.Listener, apiAddr string, keys *apiserver.ServiceKeys, api *apiserver.Server, node string, reg prometheus.Registerer, log *slog.Logger) (func(), error) {
	only := fc.clientKey
	if only != "" {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := api.Authenticate(actx, only)
		cancel()
		if err != nil {
			// Not fatal: the keeper already runs, and the key may be
			// made later; until then every call is refused.
			log.Warn("SandboxFusion API: the key of --sandboxfusion-key-file does not authenticate: every call will be refused until it does", "err", err)
		}
	}
	authenticate := func(ctx context.Context, secret string) error {
		if only != "" && subtle.ConstantTimeCompare([]byte(secret), []byte(only)) != 1 {
			return errdefs.Newf(errdefs.ErrUnauthenticated, "invalid API key: this server takes only the key it was given (dsec up --sandboxfusion-key-file)")
		}
		_, err := api.Authenticate(ctx, secret)
		return err
	}
	secret, err := keys.New("sandboxfusion", project.SandboxFusion)
	if err != nil {
		return nil, err
	}
	client, err := dsec.New(dsec.Config{Addr: apiAddr, APIKey: secret, UserAgent: "dsec-sandboxfusion"})
	if err != nil {
		return nil, err
	}
	langs := fusion.DefaultLanguages()
	for name, img := range fc.Images {
		l, ok := langs[name]
		if !ok {
			client.Close()
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "--sandboxfusion-image %s=%s: unknown language; known: python, bash, go", name, img)
		}
		l.Image = img
		langs[name] = l
	}
	fs, err := fusion.New(fusion.Config{
		Client: client, Languages: langs, PoolSize: fc.PoolSize, Memory: fc.Memory,
		Authenticate: authenticate, RequireKey: fc.RequireKey || !fc.loopback,
		Node: node, Logger: log, MaxBodyBytes: fc.MaxBodyBytes,
	})
	if err != nil {
		client.Close()
		return nil, err
	}
	coll := fs.Collector()
	if err := reg.Register(coll); err != nil {
		_ = fs.Close(ctx)
		client.Close()
		return nil, err
	}
	fs.Start()
	srv := &http.Server{Handler: fs.Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
			<-done
			if err := fs.Close(ctx); err != nil {
				log.Warn("SandboxFusion API: shut down", "err", err)
			}
			reg.Unregister(coll)
			client.Close()
		})
	}, nil
}
