package apiserver

import (
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"

	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/streams"
)

// unary forwards a call about sandbox id to the edge that owns it.
func unary[Req, Resp any](ctx context.Context, s *Server, id string, msg *Req,
	call func(sandboxv1connect.SandboxServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
) (*connect.Response[Resp], error) {
	conn, err := s.edgeFor(ctx, id)
	if err != nil {
		return nil, err
	}
	resp, err := call(conn.Sandbox, ctx, forward(ctx, msg))
	if err != nil {
		return nil, edgeErr(conn.Name, err)
	}
	return connect.NewResponse(resp.Msg), nil
}

// serverStream relays a server stream about sandbox id from its edge.
func serverStream[Req, Resp any](ctx context.Context, s *Server, id string, msg *Req, dst *connect.ServerStream[Resp],
	call func(sandboxv1connect.SandboxServiceClient, context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Resp], error),
) error {
	conn, err := s.edgeFor(ctx, id)
	if err != nil {
		return err
	}
	src, err := call(conn.Sandbox, ctx, forward(ctx, msg))
	if err != nil {
		return edgeErr(conn.Name, err)
	}
	return edgeErr(conn.Name, streams.Relay(dst, src))
}

// clientStream relays an upload whose first message (a header) names the
// sandbox. The edge's stream ends cleanly only when the client's did: an
// upload the client broke is aborted, never half-closed, so the edge keeps
// nothing of it.
func clientStream[Req, Resp any](ctx context.Context, s *Server, src *connect.ClientStream[Req], what string,
	sandboxOf func(*Req) string,
	call func(sandboxv1connect.SandboxServiceClient, context.Context) *connect.ClientStreamForClient[Req, Resp],
) (*connect.Response[Resp], error) {
	first, err := streams.First(src, what, func(m *Req) bool { return sandboxOf(m) != "" })
	if err != nil {
		return nil, err
	}
	conn, err := s.edgeFor(ctx, sandboxOf(first))
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dst := call(conn.Sandbox, dctx)
	setIdentity(ctx, dst.RequestHeader())
	if err := dst.Send(first); err != nil && !errors.Is(err, io.EOF) {
		return nil, edgeErr(conn.Name, err)
	}
	for src.Receive() {
		if err := dst.Send(src.Msg()); err != nil {
			break // io.EOF: the edge ended the call; its reply says why
		}
	}
	if err := src.Err(); err != nil {
		// The client's stream broke. Abort the edge's call: cancelling it
		// closes the connection to the edge (or resets its HTTP/2 stream)
		// before anything closes the request body, so the edge reads an
		// error. Closing the stream here, even after cancel, could end it
		// cleanly first, and the edge would keep the partial upload.
		cancel()
		return nil, err
	}
	resp, err := dst.CloseAndReceive()
	if err != nil {
		return nil, edgeErr(conn.Name, err)
	}
	return connect.NewResponse(resp.Msg), nil
}
