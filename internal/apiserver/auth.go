package apiserver

import (
	"context"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// Authenticator checks an API key's secret.
type Authenticator interface {
	Authenticate(ctx context.Context, secret string) (cluster.Key, error)
}

type keyCtx struct{}

// keyFrom returns the authenticated key of a request.
func keyFrom(ctx context.Context) cluster.Key {
	k, _ := ctx.Value(keyCtx{}).(cluster.Key)
	return k
}

// keyAuth authenticates calls by their bearer key, or, on the API for
// sandboxes (sandboxes set), by the connection they came on.
type keyAuth struct {
	auth      Authenticator
	sandboxes *Server
}

func (a keyAuth) authenticate(ctx context.Context, header string) (context.Context, error) {
	if a.sandboxes != nil {
		// The sandbox's connection decides; a key it sends is ignored.
		sc, _ := ctx.Value(sandboxConnKey{}).(*sandboxConn)
		if sc == nil {
			return ctx, errdefs.Newf(errdefs.ErrUnauthenticated, "not a sandbox's connection")
		}
		k, err := a.sandboxes.sandboxKey(ctx, sc)
		if err != nil {
			return ctx, err
		}
		return context.WithValue(ctx, keyCtx{}, k), nil
	}
	secret, ok := strings.CutPrefix(header, "Bearer ")
	if !ok || secret == "" {
		return ctx, errdefs.Newf(errdefs.ErrUnauthenticated,
			"no API key: send `Authorization: Bearer <key>` (the CLI and SDKs read --api-key, DSEC_API_KEY, ~/.config/dsec/config.toml, or <state-dir>/admin.key)")
	}
	k, err := a.auth.Authenticate(ctx, strings.TrimSpace(secret))
	if err != nil {
		return ctx, err
	}
	return context.WithValue(ctx, keyCtx{}, k), nil
}

// enter authenticates a call for apierr.Interceptor.
func (a keyAuth) enter(ctx context.Context, h http.Header) (context.Context, error) {
	return a.authenticate(ctx, h.Get("Authorization"))
}

// errorInterceptor authenticates every call and converts its errors for
// the wire, logging and counting them: the one place that does.
func (s *Server) errorInterceptor(auth keyAuth) apierr.Interceptor {
	i := apierr.Interceptor{
		Reporter: s.errs,
		Enter:    auth.enter,
		Caller: func(ctx context.Context, _ http.Header) (string, string) {
			k := keyFrom(ctx)
			return k.Project, k.ID
		},
	}
	if m := s.cfg.Metrics; m != nil {
		i.Failed = func(procedure string, code connect.Code) {
			m.Errors.WithLabelValues(code.String(), procedure).Inc()
		}
	}
	return i
}
