package dsec

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/dsecproject/dsec/api/dsec/admin/v1"
	"github.com/dsecproject/dsec/api/dsec/admin/v1/adminv1connect"
	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
	"github.com/dsecproject/dsec/api/dsec/image/v1/imagev1connect"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// testKey is the API key the fake server accepts.
const testKey = "dsec_test_0123456789"

// fake is a hand-written dsec API server for the client's tests. It keeps
// sandboxes, files, layers and images in memory and records what clients
// sent. Tests script exec streams and failures through its fields.
type fake struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
	imagev1connect.UnimplementedImageServiceHandler
	adminv1connect.UnimplementedAdminServiceHandler

	mu sync.Mutex
	// guarded by mu
	requests    []seenRequest
	sandboxes   map[string]*sandboxv1.Sandbox
	files       map[string][]byte // by sandbox ID + path
	headers     []*sandboxv1.WriteFileHeader
	chunkSizes  []int // data sizes of the last WriteFile or UploadLayer
	layers      map[string]*imagev1.Layer
	layerHeader *imagev1.UploadLayerHeader
	images      map[string]*imagev1.Image
	execReqs    []*sandboxv1.ExecRequest
	createReq   *sandboxv1.CreateRequest
	deleteReq   *sandboxv1.DeleteRequest
	// failWith, when set, is returned by every call.
	failWith error
	// exec, when set, plays an exec stream.
	exec func(ctx context.Context, send func(*sandboxv1.ExecResponse) error) error

	// writeDone receives the result of each WriteFile call when it ends.
	writeDone chan error
}

type seenRequest struct {
	procedure string
	auth      string
	userAgent string
	proto     string
}

func newFake() *fake {
	return &fake{
		sandboxes: map[string]*sandboxv1.Sandbox{},
		files:     map[string][]byte{},
		layers:    map[string]*imagev1.Layer{},
		images:    map[string]*imagev1.Image{},
		writeDone: make(chan error, 16),
	}
}

// serverOpts says how the test server speaks HTTP.
type serverOpts struct {
	// http1Only turns h2c off on the server.
	http1Only bool
}

// start serves f on a loopback port and returns a Client for it that uses
// key. Both are closed when the test ends.
func (f *fake) start(t *testing.T, key string) (*Client, *httptest.Server) {
	t.Helper()
	srv := f.serve(t, serverOpts{})
	c, err := New(Config{Addr: srv.URL, APIKey: key, UserAgent: "sdktest/1"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, srv
}

func (f *fake) serve(t *testing.T, o serverOpts) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	opts := connect.WithInterceptors(f)
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(f, opts))
	mux.Handle(imagev1connect.NewImageServiceHandler(f, opts))
	mux.Handle(adminv1connect.NewAdminServiceHandler(f, opts))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), protoKey{}, r.Proto)))
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(!o.http1Only)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// The fake is its own handler interceptor: it records every call and
// checks its key.

func (f *fake) record(ctx context.Context, procedure string, h http.Header, proto string) error {
	f.mu.Lock()
	f.requests = append(f.requests, seenRequest{
		procedure: procedure,
		auth:      h.Get("Authorization"),
		userAgent: h.Get("User-Agent"),
		proto:     proto,
	})
	fail := f.failWith
	f.mu.Unlock()
	if h.Get("Authorization") != "Bearer "+testKey {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("bad key"))
	}
	return fail
}

func (f *fake) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := f.record(ctx, req.Spec().Procedure, req.Header(), protoOf(ctx)); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (f *fake) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (f *fake) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := f.record(ctx, conn.Spec().Procedure, conn.RequestHeader(), protoOf(ctx)); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// protoKey carries the HTTP version of a request into handlers.
type protoKey struct{}

func protoOf(ctx context.Context) string {
	s, _ := ctx.Value(protoKey{}).(string)
	return s
}

func (f *fake) seen() []seenRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenRequest(nil), f.requests...)
}

// Sandbox service.

func (f *fake) Create(_ context.Context, req *connect.Request[sandboxv1.CreateRequest]) (*connect.Response[sandboxv1.CreateResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.createReq = req.Msg
	id := "sb-" + string(rune('a'+len(f.sandboxes)))
	sb := &sandboxv1.Sandbox{
		Id:        id,
		Image:     req.Msg.GetImage(),
		Labels:    req.Msg.GetLabels(),
		State:     sandboxv1.State_STATE_RUNNING,
		Resources: req.Msg.GetResources(),
		Node:      "node-1",
		Backend:   "container",
		Project:   "default",
		CreatedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		ExpiresAt: timestamppb.New(time.Date(2026, 1, 2, 4, 4, 5, 0, time.UTC)),
		IdleTtl:   req.Msg.GetIdleTtl(),
		User:      req.Msg.GetUser(),
		Workdir:   req.Msg.GetWorkdir(),
		Env:       req.Msg.GetEnv(),
	}
	f.sandboxes[id] = sb
	return connect.NewResponse(&sandboxv1.CreateResponse{Sandbox: sb}), nil
}

func (f *fake) Get(_ context.Context, req *connect.Request[sandboxv1.GetRequest]) (*connect.Response[sandboxv1.GetResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[req.Msg.GetId()]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("sandbox "+req.Msg.GetId()+": not found"))
	}
	return connect.NewResponse(&sandboxv1.GetResponse{Sandbox: sb}), nil
}

func (f *fake) List(_ context.Context, req *connect.Request[sandboxv1.ListRequest]) (*connect.Response[sandboxv1.ListResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*sandboxv1.Sandbox
	for _, sb := range f.sandboxes {
		if matches(sb.GetLabels(), req.Msg.GetSelector()) {
			out = append(out, sb)
		}
	}
	return connect.NewResponse(&sandboxv1.ListResponse{Sandboxes: out}), nil
}

func (f *fake) Delete(_ context.Context, req *connect.Request[sandboxv1.DeleteRequest]) (*connect.Response[sandboxv1.DeleteResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleteReq = req.Msg
	var deleted []string
	if id := req.Msg.GetId(); id != "" {
		if _, ok := f.sandboxes[id]; !ok {
			return nil, connect.NewError(connect.CodeNotFound, errors.New("sandbox "+id+": not found"))
		}
		deleted = append(deleted, id)
	} else {
		for id, sb := range f.sandboxes {
			if matches(sb.GetLabels(), req.Msg.GetSelector()) {
				deleted = append(deleted, id)
			}
		}
	}
	for _, id := range deleted {
		delete(f.sandboxes, id)
	}
	return connect.NewResponse(&sandboxv1.DeleteResponse{Deleted: deleted}), nil
}

func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (f *fake) Exec(ctx context.Context, req *connect.Request[sandboxv1.ExecRequest], stream *connect.ServerStream[sandboxv1.ExecResponse]) error {
	f.mu.Lock()
	f.execReqs = append(f.execReqs, req.Msg)
	play := f.exec
	f.mu.Unlock()
	if play == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("no exec scripted"))
	}
	return play(ctx, stream.Send)
}

func (f *fake) ReadFile(_ context.Context, req *connect.Request[sandboxv1.ReadFileRequest], stream *connect.ServerStream[sandboxv1.ReadFileResponse]) error {
	f.mu.Lock()
	data, ok := f.files[req.Msg.GetSandboxId()+req.Msg.GetPath()]
	f.mu.Unlock()
	if !ok {
		return connect.NewError(connect.CodeNotFound, errors.New(req.Msg.GetPath()+": no such file"))
	}
	info := &sandboxv1.FileInfo{Path: req.Msg.GetPath(), Size: int64(len(data)), Mode: 0o4755, Uid: 1000, Gid: 100,
		ModTime: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
	first := true
	for len(data) > 0 || first {
		n := min(len(data), chunkSize)
		msg := &sandboxv1.ReadFileResponse{Data: data[:n]}
		if first {
			msg.Info = info
			first = false
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func (f *fake) WriteFile(_ context.Context, stream *connect.ClientStream[sandboxv1.WriteFileRequest]) (resp *connect.Response[sandboxv1.WriteFileResponse], err error) {
	defer func() { f.writeDone <- err }()
	var header *sandboxv1.WriteFileHeader
	var buf bytes.Buffer
	var sizes []int
	for stream.Receive() {
		switch m := stream.Msg().GetMsg().(type) {
		case *sandboxv1.WriteFileRequest_Header:
			if header != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("second header"))
			}
			header = m.Header
		case *sandboxv1.WriteFileRequest_Data:
			if header == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("data before header"))
			}
			sizes = append(sizes, len(m.Data))
			buf.Write(m.Data)
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err // the upload was abandoned: nothing is written
	}
	if header == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no header"))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.headers = append(f.headers, header)
	f.chunkSizes = sizes
	f.files[header.GetSandboxId()+header.GetPath()] = buf.Bytes()
	return connect.NewResponse(&sandboxv1.WriteFileResponse{Info: &sandboxv1.FileInfo{
		Path: header.GetPath(), Size: int64(buf.Len()), Mode: header.GetMode(),
	}}), nil
}

// Image service.

func (f *fake) UploadLayer(_ context.Context, stream *connect.ClientStream[imagev1.UploadLayerRequest]) (*connect.Response[imagev1.UploadLayerResponse], error) {
	var header *imagev1.UploadLayerHeader
	var n int64
	var sizes []int
	for stream.Receive() {
		switch m := stream.Msg().GetMsg().(type) {
		case *imagev1.UploadLayerRequest_Header:
			header = m.Header
		case *imagev1.UploadLayerRequest_Data:
			sizes = append(sizes, len(m.Data))
			n += int64(len(m.Data))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	if header == nil || n != header.GetSize() {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("size does not match the header"))
	}
	l := &imagev1.Layer{Digest: header.GetDigest(), Size: n, MediaType: "application/vnd.dsec.layer.v1.erofs"}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.layerHeader = header
	f.chunkSizes = sizes
	f.layers[l.Digest] = l
	return connect.NewResponse(&imagev1.UploadLayerResponse{Layer: l}), nil
}

func (f *fake) CreateImage(_ context.Context, req *connect.Request[imagev1.CreateImageRequest]) (*connect.Response[imagev1.CreateImageResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	im := &imagev1.Image{Name: req.Msg.GetName(), Config: req.Msg.GetConfig(),
		CreatedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
	for _, d := range req.Msg.GetLayerDigests() {
		l, ok := f.layers[d]
		if !ok {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("layer "+d+" is not stored: upload it first"))
		}
		im.Layers = append(im.Layers, l)
		im.Size += l.GetSize()
	}
	f.images[im.Name] = im
	return connect.NewResponse(&imagev1.CreateImageResponse{Image: im}), nil
}

func (f *fake) GetImage(_ context.Context, req *connect.Request[imagev1.GetImageRequest]) (*connect.Response[imagev1.GetImageResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	im, ok := f.images[req.Msg.GetName()]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("image "+req.Msg.GetName()+": not found"))
	}
	return connect.NewResponse(&imagev1.GetImageResponse{Image: im}), nil
}

func (f *fake) ListImages(context.Context, *connect.Request[imagev1.ListImagesRequest]) (*connect.Response[imagev1.ListImagesResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*imagev1.Image
	for _, im := range f.images {
		out = append(out, im)
	}
	return connect.NewResponse(&imagev1.ListImagesResponse{Images: out}), nil
}

// Admin service.

func (f *fake) CreateKey(_ context.Context, req *connect.Request[adminv1.CreateKeyRequest]) (*connect.Response[adminv1.CreateKeyResponse], error) {
	return connect.NewResponse(&adminv1.CreateKeyResponse{
		Secret: "dsec_new_secret",
		Key: &adminv1.Key{Id: "dsec_new", Name: req.Msg.GetName(), Project: req.Msg.GetProject(), Admin: req.Msg.GetAdmin(),
			CreatedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))},
	}), nil
}

func (f *fake) WhoAmI(context.Context, *connect.Request[adminv1.WhoAmIRequest]) (*connect.Response[adminv1.WhoAmIResponse], error) {
	return connect.NewResponse(&adminv1.WhoAmIResponse{Key: &adminv1.Key{Id: "dsec_test", Name: "test", Project: "default", Admin: true}}), nil
}

// errReader yields n bytes of data, then fails with err.
type errReader struct {
	n   int
	err error
}

func (r *errReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, r.err
	}
	k := min(len(p), r.n)
	clear(p[:k])
	r.n -= k
	return k, nil
}

var _ io.Reader = (*errReader)(nil)

// Accessors for tests; they hold mu.

func (f *fake) setExec(fn func(context.Context, func(*sandboxv1.ExecResponse) error) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exec = fn
}

func (f *fake) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failWith = err
}

func (f *fake) lastCreate() *sandboxv1.CreateRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.createReq
}

func (f *fake) execReq(i int) *sandboxv1.ExecRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.execReqs) {
		return nil
	}
	return f.execReqs[i]
}

func (f *fake) writeHeader(i int) *sandboxv1.WriteFileHeader {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.headers) {
		return nil
	}
	return f.headers[i]
}

func (f *fake) chunks() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.chunkSizes
}

func (f *fake) lastLayerHeader() *imagev1.UploadLayerHeader {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.layerHeader
}
