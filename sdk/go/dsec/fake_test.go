package dsec

import (
	"archive/tar"
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
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
	// createErrs are the answers of the next Creates, one each, before
	// they succeed again; creates counts the Create calls.
	createErrs []error
	creates    int
	deleteReq  *sandboxv1.DeleteRequest
	// failWith, when set, is returned by every call.
	failWith error
	// exec, when set, plays an exec stream.
	exec func(ctx context.Context, send func(*sandboxv1.ExecResponse) error) error

	// writeDone receives the result of each WriteFile call when it ends.
	writeDone chan error

	// Calls of the API's second half, recorded as they come.
	batchReq  *sandboxv1.BatchCreateRequest
	batchErrs map[int]*sandboxv1.ItemError // items that fail
	calls     []proto.Message              // unary requests, in order
	watchReq  *sandboxv1.WatchRequest
	// watch, when set, plays a watch stream.
	watch func(ctx context.Context, send func(*sandboxv1.WatchResponse) error) error
	stats *sandboxv1.StatsResponse
	// attach, when set, plays an attach stream.
	attach    func(ctx context.Context, req *sandboxv1.AttachRequest, send func(*sandboxv1.ExecResponse) error) error
	execInfos []*sandboxv1.ExecInfo
	// stdin receives every WriteStdin request.
	stdin   chan *sandboxv1.WriteStdinRequest
	tars    map[string][]byte // UploadTar archives by sandbox ID + dir
	tarHead *sandboxv1.UploadTarHeader
	dirs    map[string][]*sandboxv1.FileInfo // ListDir answers by path

	// Sessions and grading (issue 12).
	sessions []*sandboxv1.Session         // ListSessions answers
	grade    *sandboxv1.GradeFromResponse // GradeFrom answers
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
		stdin:     make(chan *sandboxv1.WriteStdinRequest, 64),
		tars:      map[string][]byte{},
		dirs:      map[string][]*sandboxv1.FileInfo{},
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
	f.creates++
	if len(f.createErrs) > 0 {
		err := f.createErrs[0]
		f.createErrs = f.createErrs[1:]
		return nil, err
	}
	f.createReq = req.Msg
	return connect.NewResponse(&sandboxv1.CreateResponse{Sandbox: f.newSandboxLocked(req.Msg)}), nil
}

// newSandboxLocked makes a running sandbox from req; f.mu is held.
func (f *fake) newSandboxLocked(req *sandboxv1.CreateRequest) *sandboxv1.Sandbox {
	id := "sb-" + string(rune('a'+len(f.sandboxes)))
	sb := &sandboxv1.Sandbox{
		Id:        id,
		Image:     req.GetImage(),
		Labels:    req.GetLabels(),
		State:     sandboxv1.State_STATE_RUNNING,
		Resources: req.GetResources(),
		Node:      "node-1",
		Backend:   "container",
		Project:   "default",
		CreatedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		ExpiresAt: timestamppb.New(time.Date(2026, 1, 2, 4, 4, 5, 0, time.UTC)),
		IdleTtl:   req.GetIdleTtl(),
		User:      req.GetUser(),
		Workdir:   req.GetWorkdir(),
		Env:       req.GetEnv(),
	}
	f.sandboxes[id] = sb
	return sb
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

// The sandbox API's second half.

func (f *fake) recordCall(m proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, m)
}

// lastCall returns the last unary request recorded.
func (f *fake) lastCall() proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return nil
	}
	return f.calls[len(f.calls)-1]
}

func (f *fake) BatchCreate(_ context.Context, req *connect.Request[sandboxv1.BatchCreateRequest]) (*connect.Response[sandboxv1.BatchCreateResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batchReq = req.Msg
	resp := &sandboxv1.BatchCreateResponse{}
	for i := range int(req.Msg.GetCount()) {
		r := &sandboxv1.BatchCreateResult{Index: int32(i)}
		if e, ok := f.batchErrs[i]; ok {
			r.Error = e
		} else {
			r.Sandbox = f.newSandboxLocked(req.Msg.GetTemplate())
		}
		resp.Results = append(resp.Results, r)
	}
	return connect.NewResponse(resp), nil
}

func (f *fake) sandbox(id string) (*sandboxv1.Sandbox, error) {
	sb, ok := f.sandboxes[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("sandbox "+id+": not found"))
	}
	return sb, nil
}

func (f *fake) SetTimeout(_ context.Context, req *connect.Request[sandboxv1.SetTimeoutRequest]) (*connect.Response[sandboxv1.SetTimeoutResponse], error) {
	f.recordCall(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.sandbox(req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	if d := req.Msg.GetTtl(); d != nil {
		sb.ExpiresAt = timestamppb.New(sb.GetCreatedAt().AsTime().Add(d.AsDuration()))
	}
	if d := req.Msg.GetIdleTtl(); d != nil {
		sb.IdleTtl = durationpb.New(d.AsDuration())
	}
	return connect.NewResponse(&sandboxv1.SetTimeoutResponse{Sandbox: sb}), nil
}

func (f *fake) UpdateLabels(_ context.Context, req *connect.Request[sandboxv1.UpdateLabelsRequest]) (*connect.Response[sandboxv1.UpdateLabelsResponse], error) {
	f.recordCall(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.sandbox(req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	labels := map[string]string{}
	for k, v := range sb.GetLabels() {
		labels[k] = v
	}
	for _, k := range req.Msg.GetRemove() {
		delete(labels, k)
	}
	for k, v := range req.Msg.GetSet() {
		labels[k] = v
	}
	sb.Labels = labels
	return connect.NewResponse(&sandboxv1.UpdateLabelsResponse{Sandbox: sb}), nil
}

func (f *fake) Watch(ctx context.Context, req *connect.Request[sandboxv1.WatchRequest], stream *connect.ServerStream[sandboxv1.WatchResponse]) error {
	f.mu.Lock()
	f.watchReq = req.Msg
	play := f.watch
	f.mu.Unlock()
	if play == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("no watch scripted"))
	}
	return play(ctx, stream.Send)
}

func (f *fake) Stats(_ context.Context, req *connect.Request[sandboxv1.StatsRequest]) (*connect.Response[sandboxv1.StatsResponse], error) {
	f.recordCall(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.sandbox(req.Msg.GetId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(f.stats), nil
}

func (f *fake) Attach(ctx context.Context, req *connect.Request[sandboxv1.AttachRequest], stream *connect.ServerStream[sandboxv1.ExecResponse]) error {
	f.recordCall(req.Msg)
	f.mu.Lock()
	play := f.attach
	f.mu.Unlock()
	if play == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("exec "+req.Msg.GetExecId()+": not found"))
	}
	return play(ctx, req.Msg, stream.Send)
}

func (f *fake) WriteStdin(_ context.Context, req *connect.Request[sandboxv1.WriteStdinRequest]) (*connect.Response[sandboxv1.WriteStdinResponse], error) {
	select {
	case f.stdin <- req.Msg:
	default:
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("fake stdin is full"))
	}
	return connect.NewResponse(&sandboxv1.WriteStdinResponse{}), nil
}

func (f *fake) Signal(_ context.Context, req *connect.Request[sandboxv1.SignalRequest]) (*connect.Response[sandboxv1.SignalResponse], error) {
	f.recordCall(req.Msg)
	return connect.NewResponse(&sandboxv1.SignalResponse{}), nil
}

func (f *fake) ResizeTTY(_ context.Context, req *connect.Request[sandboxv1.ResizeTTYRequest]) (*connect.Response[sandboxv1.ResizeTTYResponse], error) {
	f.recordCall(req.Msg)
	return connect.NewResponse(&sandboxv1.ResizeTTYResponse{}), nil
}

func (f *fake) ListExecs(_ context.Context, req *connect.Request[sandboxv1.ListExecsRequest]) (*connect.Response[sandboxv1.ListExecsResponse], error) {
	f.recordCall(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	return connect.NewResponse(&sandboxv1.ListExecsResponse{Execs: f.execInfos}), nil
}

var fakeTime = timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))

func (f *fake) Stat(_ context.Context, req *connect.Request[sandboxv1.StatRequest]) (*connect.Response[sandboxv1.StatResponse], error) {
	f.recordCall(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	key := req.Msg.GetSandboxId() + req.Msg.GetPath()
	if data, ok := f.files[key]; ok {
		return connect.NewResponse(&sandboxv1.StatResponse{Info: &sandboxv1.FileInfo{
			Path: req.Msg.GetPath(), Size: int64(len(data)), Mode: 0o644, Type: "file", ModTime: fakeTime}}), nil
	}
	if _, ok := f.dirs[req.Msg.GetPath()]; ok {
		return connect.NewResponse(&sandboxv1.StatResponse{Info: &sandboxv1.FileInfo{
			Path: req.Msg.GetPath(), Size: 4096, Mode: 0o755, IsDir: true, Type: "dir", ModTime: fakeTime}}), nil
	}
	return nil, connect.NewError(connect.CodeNotFound, errors.New(req.Msg.GetPath()+": no such file"))
}

func (f *fake) ListDir(_ context.Context, req *connect.Request[sandboxv1.ListDirRequest]) (*connect.Response[sandboxv1.ListDirResponse], error) {
	f.recordCall(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	entries, ok := f.dirs[req.Msg.GetPath()]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New(req.Msg.GetPath()+": no such directory"))
	}
	return connect.NewResponse(&sandboxv1.ListDirResponse{Entries: entries, Truncated: len(entries) > 2}), nil
}

func (f *fake) MakeDir(_ context.Context, req *connect.Request[sandboxv1.MakeDirRequest]) (*connect.Response[sandboxv1.MakeDirResponse], error) {
	f.recordCall(req.Msg)
	return connect.NewResponse(&sandboxv1.MakeDirResponse{Info: &sandboxv1.FileInfo{Path: req.Msg.GetPath(), IsDir: true}}), nil
}

func (f *fake) Remove(_ context.Context, req *connect.Request[sandboxv1.RemoveRequest]) (*connect.Response[sandboxv1.RemoveResponse], error) {
	f.recordCall(req.Msg)
	if req.Msg.GetPath() == "/nonempty" && !req.Msg.GetRecursive() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("/nonempty: directory not empty; remove it recursively"))
	}
	return connect.NewResponse(&sandboxv1.RemoveResponse{}), nil
}

func (f *fake) Rename(_ context.Context, req *connect.Request[sandboxv1.RenameRequest]) (*connect.Response[sandboxv1.RenameResponse], error) {
	f.recordCall(req.Msg)
	if req.Msg.GetTo() == "/exists" && !req.Msg.GetOverwrite() {
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("/exists: already exists"))
	}
	return connect.NewResponse(&sandboxv1.RenameResponse{}), nil
}

// DownloadTar serves the archive stored for the path, in chunks of 1000
// bytes to exercise reassembly; a path "/fail-after" sends some data, then
// fails.
func (f *fake) DownloadTar(_ context.Context, req *connect.Request[sandboxv1.DownloadTarRequest], stream *connect.ServerStream[sandboxv1.DownloadTarResponse]) error {
	f.mu.Lock()
	data, ok := f.tars[req.Msg.GetSandboxId()+req.Msg.GetPath()]
	f.mu.Unlock()
	if !ok {
		return connect.NewError(connect.CodeNotFound, errors.New(req.Msg.GetPath()+": no such file or directory"))
	}
	for len(data) > 0 {
		n := min(len(data), 1000)
		if err := stream.Send(&sandboxv1.DownloadTarResponse{Data: data[:n]}); err != nil {
			return err
		}
		data = data[n:]
	}
	if req.Msg.GetPath() == "/fail-after" {
		return connect.NewError(connect.CodeResourceExhausted, errors.New("archive larger than the limit"))
	}
	return nil
}

// UploadTar keeps the archive for DownloadTar of the same path and counts
// its entries.
func (f *fake) UploadTar(_ context.Context, stream *connect.ClientStream[sandboxv1.UploadTarRequest]) (*connect.Response[sandboxv1.UploadTarResponse], error) {
	var header *sandboxv1.UploadTarHeader
	var buf bytes.Buffer
	for stream.Receive() {
		switch m := stream.Msg().GetMsg().(type) {
		case *sandboxv1.UploadTarRequest_Header:
			header = m.Header
		case *sandboxv1.UploadTarRequest_Data:
			if header == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("data before header"))
			}
			buf.Write(m.Data)
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	if header == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no header"))
	}
	resp := &sandboxv1.UploadTarResponse{}
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			resp.Dirs++
		case tar.TypeSymlink, tar.TypeLink:
			resp.Links++
		default:
			resp.Files++
			resp.Bytes += hdr.Size
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tarHead = header
	f.tars[header.GetSandboxId()+header.GetPath()] = buf.Bytes()
	return connect.NewResponse(resp), nil
}

func (f *fake) ListSessions(_ context.Context, req *connect.Request[sandboxv1.ListSessionsRequest]) (*connect.Response[sandboxv1.ListSessionsResponse], error) {
	f.recordCall(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.sandbox(req.Msg.GetSandboxId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.ListSessionsResponse{Sessions: f.sessions}), nil
}

// DeleteSession removes the named session from f.sessions, NotFound when
// it is not there.
func (f *fake) DeleteSession(_ context.Context, req *connect.Request[sandboxv1.DeleteSessionRequest]) (*connect.Response[sandboxv1.DeleteSessionResponse], error) {
	f.recordCall(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, s := range f.sessions {
		if s.GetName() == req.Msg.GetName() {
			f.sessions = append(f.sessions[:i:i], f.sessions[i+1:]...)
			return connect.NewResponse(&sandboxv1.DeleteSessionResponse{}), nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, errors.New("session "+req.Msg.GetName()+" of sandbox "+req.Msg.GetSandboxId()+": not found"))
}

func (f *fake) GradeFrom(_ context.Context, req *connect.Request[sandboxv1.GradeFromRequest]) (*connect.Response[sandboxv1.GradeFromResponse], error) {
	f.recordCall(req.Msg)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.sandbox(req.Msg.GetSandboxId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(f.grade), nil
}
