package apiserver

import (
	"context"
	"errors"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/edgeclient"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// maxBatch bounds one BatchCreate.
const maxBatch = 1000

// batchParallel is how many creates of a batch run at once.
const batchParallel = 32

func (p *sandboxProxy) BatchCreate(ctx context.Context, req *connect.Request[sandboxv1.BatchCreateRequest]) (*connect.Response[sandboxv1.BatchCreateResponse], error) {
	n := int(req.Msg.GetCount())
	if n < 1 || n > maxBatch {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "batch count %d: want 1 to %d", n, maxBatch)
	}
	tmpl := req.Msg.GetTemplate()
	if tmpl == nil {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "batch create: no template")
	}
	// A template no item can pass fails the call, not each item.
	if _, err := p.s.checkCreate(ctx, tmpl); err != nil {
		return nil, err
	}
	results := make([]*sandboxv1.BatchCreateResult, n)
	sem := make(chan struct{}, batchParallel)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			item := proto.Clone(tmpl).(*sandboxv1.CreateRequest)
			if k := tmpl.GetIdempotencyKey(); k != "" {
				item.IdempotencyKey = k + "/" + itoa(i)
			}
			res := &sandboxv1.BatchCreateResult{Index: int32(i)}
			resp, err := p.s.create(ctx, item)
			if err != nil {
				res.Error = p.s.itemError(ctx, req.Spec().Procedure, err)
			} else {
				res.Sandbox = resp.GetSandbox()
			}
			results[i] = res
		}()
	}
	wg.Wait()
	return connect.NewResponse(&sandboxv1.BatchCreateResponse{Results: results}), nil
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

// itemError describes one failed item of a batch with the API's codes and
// the message a failed call would have (internal/apierr), logging it as a
// failed call is.
func (s *Server) itemError(ctx context.Context, procedure string, err error) *sandboxv1.ItemError {
	k := keyFrom(ctx)
	ce := s.errs.ToConnect(ctx, apierr.Call{Procedure: procedure, Project: k.Project, KeyID: k.ID}, err).(*connect.Error)
	out := &sandboxv1.ItemError{Code: ce.Code().String(), Message: ce.Message()}
	if d, ok := errdefs.RetryHint(err); ok {
		out.RetryAfter = durationpb.New(d)
	}
	return out
}

func (p *sandboxProxy) SetTimeout(ctx context.Context, req *connect.Request[sandboxv1.SetTimeoutRequest]) (*connect.Response[sandboxv1.SetTimeoutResponse], error) {
	if err := p.s.checkTimeout(ctx, req.Msg); err != nil {
		return nil, err
	}
	return unary(ctx, p.s, req.Msg.GetId(), req.Msg, sandboxv1connect.SandboxServiceClient.SetTimeout)
}

func (p *sandboxProxy) UpdateLabels(ctx context.Context, req *connect.Request[sandboxv1.UpdateLabelsRequest]) (*connect.Response[sandboxv1.UpdateLabelsResponse], error) {
	return unary(ctx, p.s, req.Msg.GetId(), req.Msg, sandboxv1connect.SandboxServiceClient.UpdateLabels)
}

func (p *sandboxProxy) Stats(ctx context.Context, req *connect.Request[sandboxv1.StatsRequest]) (*connect.Response[sandboxv1.StatsResponse], error) {
	return unary(ctx, p.s, req.Msg.GetId(), req.Msg, sandboxv1connect.SandboxServiceClient.Stats)
}

func (p *sandboxProxy) Attach(ctx context.Context, req *connect.Request[sandboxv1.AttachRequest], stream *connect.ServerStream[sandboxv1.ExecResponse]) error {
	return serverStream(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, stream, sandboxv1connect.SandboxServiceClient.Attach)
}

func (p *sandboxProxy) WriteStdin(ctx context.Context, req *connect.Request[sandboxv1.WriteStdinRequest]) (*connect.Response[sandboxv1.WriteStdinResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.WriteStdin)
}

func (p *sandboxProxy) Signal(ctx context.Context, req *connect.Request[sandboxv1.SignalRequest]) (*connect.Response[sandboxv1.SignalResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.Signal)
}

func (p *sandboxProxy) ResizeTTY(ctx context.Context, req *connect.Request[sandboxv1.ResizeTTYRequest]) (*connect.Response[sandboxv1.ResizeTTYResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.ResizeTTY)
}

func (p *sandboxProxy) ListExecs(ctx context.Context, req *connect.Request[sandboxv1.ListExecsRequest]) (*connect.Response[sandboxv1.ListExecsResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.ListExecs)
}

func (p *sandboxProxy) Stat(ctx context.Context, req *connect.Request[sandboxv1.StatRequest]) (*connect.Response[sandboxv1.StatResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.Stat)
}

func (p *sandboxProxy) ListDir(ctx context.Context, req *connect.Request[sandboxv1.ListDirRequest]) (*connect.Response[sandboxv1.ListDirResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.ListDir)
}

func (p *sandboxProxy) MakeDir(ctx context.Context, req *connect.Request[sandboxv1.MakeDirRequest]) (*connect.Response[sandboxv1.MakeDirResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.MakeDir)
}

func (p *sandboxProxy) Remove(ctx context.Context, req *connect.Request[sandboxv1.RemoveRequest]) (*connect.Response[sandboxv1.RemoveResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.Remove)
}

func (p *sandboxProxy) Rename(ctx context.Context, req *connect.Request[sandboxv1.RenameRequest]) (*connect.Response[sandboxv1.RenameResponse], error) {
	return unary(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, sandboxv1connect.SandboxServiceClient.Rename)
}

func (p *sandboxProxy) DownloadTar(ctx context.Context, req *connect.Request[sandboxv1.DownloadTarRequest], stream *connect.ServerStream[sandboxv1.DownloadTarResponse]) error {
	return serverStream(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, stream, sandboxv1connect.SandboxServiceClient.DownloadTar)
}

func (p *sandboxProxy) UploadTar(ctx context.Context, stream *connect.ClientStream[sandboxv1.UploadTarRequest]) (*connect.Response[sandboxv1.UploadTarResponse], error) {
	return clientStream(ctx, p.s, stream, "upload tar",
		func(m *sandboxv1.UploadTarRequest) string { return m.GetHeader().GetSandboxId() },
		sandboxv1connect.SandboxServiceClient.UploadTar)
}

// watchKeepalive is how often a quiet watch stream gets a keepalive.
const watchKeepalive = 10 * time.Second

// deadlineSlack is how close to its deadline a context counts as at it:
// a deadline sent on in whole milliseconds ends up to a millisecond early,
// plus the time the news of it takes.
const deadlineSlack = 50 * time.Millisecond

// deadlineNear reports whether ctx ends within deadlineSlack.
func deadlineNear(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && time.Until(d) < deadlineSlack
}

// Watch merges the watch streams of every healthy node. When one of them
// fails the watch ends with Unavailable, and the client watches again.
func (p *sandboxProxy) Watch(ctx context.Context, req *connect.Request[sandboxv1.WatchRequest], stream *connect.ServerStream[sandboxv1.WatchResponse]) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan *sandboxv1.WatchResponse, 256)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for _, st := range p.s.cfg.Watcher.Nodes() {
		if !st.Healthy {
			continue
		}
		conn, err := p.s.cfg.Pool.Get(st.Node.Name, st.Node.Addr)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func(name string, conn *edgeclient.Conn) {
			defer wg.Done()
			src, err := conn.Sandbox.Watch(ctx, forward(ctx, req.Msg))
			if err == nil {
				defer src.Close()
				for src.Receive() {
					if src.Msg().GetEvent() == nil {
						continue // the edge's keepalives; we send our own
					}
					select {
					case events <- src.Msg():
					case <-ctx.Done():
						return
					}
				}
				err = src.Err()
			}
			if ctx.Err() == nil {
				if err == nil && deadlineNear(ctx) {
					// The node's copy of the request's deadline (sent in
					// whole milliseconds) ran out a moment before ours:
					// the watch ends with the deadline, not as a failure.
					return
				}
				if err == nil {
					err = errdefs.Newf(errdefs.ErrUnavailable, "node %s ended its watch stream", name)
				}
				select {
				case errc <- edgeErr(name, err):
				default:
				}
			}
		}(st.Node.Name, conn)
	}
	defer wg.Wait()
	t := time.NewTicker(watchKeepalive)
	defer t.Stop()
	for {
		select {
		case ev := <-events:
			if err := stream.Send(ev); err != nil {
				return err
			}
		case err := <-errc:
			return err
		case <-t.C:
			if err := stream.Send(&sandboxv1.WatchResponse{Msg: &sandboxv1.WatchResponse_Keepalive{Keepalive: &sandboxv1.Keepalive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), context.Canceled) {
				return nil
			}
			return ctx.Err()
		}
	}
}
