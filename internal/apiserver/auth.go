package apiserver

import (
	"context"
	"strings"

	"connectrpc.com/connect"

	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/metrics"
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

// authInterceptor authenticates every call with its bearer key and maps
// handler errors to API codes (the one place that does), counting them.
type authInterceptor struct {
	auth    Authenticator
	metrics *metrics.Metrics
}

func (a authInterceptor) done(procedure string, err error) error {
	if err != nil && a.metrics != nil {
		a.metrics.Errors.WithLabelValues(apierr.Code(err).String(), procedure).Inc()
	}
	return apierr.ToConnect(err)
}

func (a authInterceptor) authenticate(ctx context.Context, header string) (context.Context, error) {
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

func (a authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := a.authenticate(ctx, req.Header().Get("Authorization"))
		if err != nil {
			return nil, a.done(req.Spec().Procedure, err)
		}
		resp, err := next(ctx, req)
		return resp, a.done(req.Spec().Procedure, err)
	}
}

func (a authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := a.authenticate(ctx, conn.RequestHeader().Get("Authorization"))
		if err != nil {
			return a.done(conn.Spec().Procedure, err)
		}
		return a.done(conn.Spec().Procedure, next(ctx, conn))
	}
}
