package apiserver

import (
	"context"
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

// authInterceptor authenticates every call with its bearer key and maps
// handler errors to API codes (the one place that does).
type authInterceptor struct{ auth Authenticator }

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
			return nil, apierr.ToConnect(err)
		}
		resp, err := next(ctx, req)
		return resp, apierr.ToConnect(err)
	}
}

func (a authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := a.authenticate(ctx, conn.RequestHeader().Get("Authorization"))
		if err != nil {
			return apierr.ToConnect(err)
		}
		return apierr.ToConnect(next(ctx, conn))
	}
}
