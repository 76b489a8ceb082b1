// Package apiserver is the only door to dsec: it authenticates API keys,
// authorises by project, validates requests and forwards them to the edge
// that owns a sandbox (named in the sandbox's ID) or, for new sandboxes, to
// the node placement picks. It keeps no per-sandbox state, so any number of
// replicas can serve any request.
package apiserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/dsecproject/dsec/api/dsec/admin/v1/adminv1connect"
	"github.com/dsecproject/dsec/api/dsec/image/v1/imagev1connect"
	"github.com/dsecproject/dsec/api/dsec/rollout/v1/rolloutv1connect"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/blobstore"
	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/edgeclient"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/metrics"
	"github.com/dsecproject/dsec/internal/placement"
	"github.com/dsecproject/dsec/internal/reqlimit"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/watcher"
)

// Config wires an API server.
type Config struct {
	Cluster *cluster.Store
	Blobs   *blobstore.Dir
	Watcher *watcher.Watcher
	Pool    *edgeclient.Pool
	Placer  *placement.Placer
	// DefaultBackend and DefaultMemory are what placement assumes when a
	// create request leaves them out.
	DefaultBackend string
	DefaultMemory  int64
	// Ready reports whether the platform is ready for /healthz.
	Ready  func() bool
	Logger *slog.Logger
	// Metrics, when set, counts errors by code and is served at /metrics.
	Metrics *metrics.Metrics
	// LazyLayers makes every stored layer also get its lazy form
	// (internal/lazylayer), so that nodes can mount it on demand, with
	// chunk digests for LazyChunkSize-byte chunks (0: the default).
	LazyLayers    bool
	LazyChunkSize int64
	// ServiceKeys, when set, are the in-process services' keys, which
	// authenticate besides the Cluster's (servicekey.go).
	ServiceKeys *ServiceKeys
	// MaxRequestBytes bounds request bodies and stream messages
	// (internal/reqlimit; 0: reqlimit.DefaultMaxBytes, dsec up
	// --max-request-size).
	MaxRequestBytes int64
}

// Server serves the public API.
type Server struct {
	cfg Config
	log *slog.Logger
	// errs converts and logs the errors of every call (internal/apierr).
	errs *apierr.Reporter

	// gcMu is held shared by layer uploads and exclusively by a garbage
	// collection that removes layers (imagemanage.go).
	gcMu sync.RWMutex
	// usage counts creates against per-project limits (admission.go).
	usage projectLedger
}

// New returns a server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DefaultBackend == "" {
		cfg.DefaultBackend = "container"
	}
	if cfg.DefaultMemory == 0 {
		cfg.DefaultMemory = sandbox.ContractDefaults.MemoryBytes
	}
	if cfg.Placer == nil {
		cfg.Placer = placement.New(placement.Config{})
	}
	return &Server{cfg: cfg, log: cfg.Logger, errs: apierr.NewReporter(cfg.Logger, "the API server")}
}

// Handler returns the HTTP handler of the API and /healthz.
func (s *Server) Handler() http.Handler { return s.handler(false) }

// handler is Handler, or SandboxHandler with sandboxes.
func (s *Server) handler(sandboxes bool) http.Handler {
	mux := http.NewServeMux()
	auth := keyAuth{auth: s}
	interceptors := []connect.Interceptor{s.errorInterceptor(auth)}
	if sandboxes {
		auth.sandboxes = s
		interceptors = []connect.Interceptor{s.errorInterceptor(auth), sandboxGuard{}}
	}
	limits := reqlimit.New(s.cfg.MaxRequestBytes)
	opts := connect.WithHandlerOptions(connect.WithInterceptors(interceptors...), limits.ConnectOption())
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(&sandboxProxy{s: s}, opts))
	mux.Handle(rolloutv1connect.NewRolloutServiceHandler(&rolloutProxy{s: s}, opts))
	mux.Handle(imagev1connect.NewImageServiceHandler(&imageAPI{s: s}, opts))
	mux.Handle(adminv1connect.NewAdminServiceHandler(&adminAPI{s: s}, opts))
	if s.cfg.Metrics != nil && !sandboxes {
		mux.Handle("GET /metrics", s.cfg.Metrics.Handler(func(r *http.Request) bool {
			_, err := auth.authenticate(r.Context(), r.Header.Get("Authorization"))
			return err == nil
		}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Ready != nil && !s.cfg.Ready() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return limits.Handler(mux)
}

// edgeFor returns the connection to the edge that owns a sandbox.
func (s *Server) edgeFor(ctx context.Context, id string) (*edgeclient.Conn, error) {
	node, ok := sandbox.NodeOfID(id)
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%.80q is not a sandbox ID (list sandboxes with `dsec ps`)", id)
	}
	n, err := s.node(ctx, node)
	if rnode, isRollout := sandbox.NodeOfRolloutID(id); isRollout && errdefs.Is(err, errdefs.ErrNotFound) {
		if _, rerr := s.node(ctx, rnode); rerr == nil {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s is a rollout, not a sandbox: `dsec rollout get %s` lists its members' sandboxes", id, id)
		}
	}
	if err != nil {
		return nil, err
	}
	return s.cfg.Pool.Get(n.Name, n.Addr)
}

func (s *Server) node(ctx context.Context, name string) (cluster.Node, error) {
	if st, ok := s.cfg.Watcher.Node(name); ok {
		return st.Node, nil
	}
	n, err := s.cfg.Cluster.GetNode(ctx, name)
	if errdefs.Is(err, errdefs.ErrNotFound) {
		return n, errdefs.Newf(errdefs.ErrNotFound, "node %s is not in the cluster: its sandboxes are gone or its edge is down", name)
	}
	return n, err
}

// forward prepares a request to an edge on behalf of the caller.
func forward[T any](ctx context.Context, msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	setIdentity(ctx, req.Header())
	return req
}

func setIdentity(ctx context.Context, h http.Header) {
	k := keyFrom(ctx)
	caller.Caller{Project: k.Project, KeyID: k.ID, Admin: k.Admin, Rollout: k.Rollout}.SetHeader(h)
}

// edgeErr turns an edge's reply error back into a kind, with a message
// that names the node when it cannot be reached (an error that did not come
// from the edge itself). The transport's error, which names the node's
// address or socket, goes to the log only.
func edgeErr(node string, err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() == connect.CodeUnavailable && !connect.IsWireError(ce) {
		return errdefs.RetryAfter(apierr.WithDetail(
			errdefs.Newf(errdefs.ErrUnavailable, "node %s is unreachable: retry, or check `dsec up` on it", node), ce), time.Second)
	}
	return apierr.FromConnect(err)
}

type sandboxProxy struct{ s *Server }

var _ sandboxv1connect.SandboxServiceHandler = (*sandboxProxy)(nil)

func (p *sandboxProxy) Create(ctx context.Context, req *connect.Request[sandboxv1.CreateRequest]) (*connect.Response[sandboxv1.CreateResponse], error) {
	resp, err := p.s.create(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// place places an admitted sandbox (admission.go): on the least loaded of
// k random nodes that can take it, trying the next on a refusal. When none
// has room it is ResourceExhausted with a retry hint, unless none could
// ever take it (InvalidArgument: waiting cannot help). A request
// with an idempotency key always goes to the same node (rendezvous hashing
// of the key), which keeps the key's record, so that a retry finds the
// sandbox it made.
func (s *Server) place(ctx context.Context, msg *sandboxv1.CreateRequest) (*sandboxv1.CreateResponse, error) {
	backend := msg.GetBackend()
	if backend == "" {
		backend = s.cfg.DefaultBackend
	}
	mem := msg.GetResources().GetMemoryBytes()
	if mem <= 0 {
		mem = s.cfg.DefaultMemory
	}
	// Pids and disk left to the nodes' defaults are the nodes' to check.
	req := placement.Request{Backend: backend, MemoryBytes: mem,
		Pids: msg.GetResources().GetPids(), DiskBytes: msg.GetResources().GetDiskBytes()}
	nodes := s.cfg.Watcher.Placement()
	var order []string
	if key := msg.GetIdempotencyKey(); key != "" {
		order = placement.Pinned(nodes, backend, keyFrom(ctx).ID+"/"+key)
	} else {
		order = s.cfg.Placer.Order(nodes, req)
		// The reports may predate deletes (the placements since count on
		// top of them): a node that looks full may not be. Ask again.
		if len(order) == 0 && s.usage.refresh(ctx, s.cfg.Watcher, oldestReport(nodes)) {
			nodes = s.cfg.Watcher.Placement()
			order = s.cfg.Placer.Order(nodes, req)
		}
	}
	if len(order) == 0 {
		return nil, s.noRoom(nodes, req)
	}
	var lastErr error
	for i, name := range order {
		if i == 3 {
			break
		}
		st, ok := s.cfg.Watcher.Node(name)
		if !ok {
			continue
		}
		conn, err := s.cfg.Pool.Get(name, st.Node.Addr)
		if err != nil {
			lastErr = err
			continue
		}
		resp, err := conn.Sandbox.Create(ctx, forward(ctx, msg))
		if err == nil {
			s.cfg.Placer.Placed(name, resp.Msg.GetSandbox().GetId(), mem)
			s.usage.touched()
			return resp.Msg, nil
		}
		lastErr = edgeErr(name, err)
		if !errdefs.Is(lastErr, errdefs.ErrResourceExhausted) && !errdefs.Is(lastErr, errdefs.ErrUnavailable) {
			return nil, lastErr
		}
	}
	return nil, lastErr
}

// noRoom is the error of a create that no node can take now: Unavailable
// without a healthy node, InvalidArgument when no node could ever take it
// (no delete makes room: no retry hint), else ResourceExhausted naming the
// roomiest node and what it has left.
func (s *Server) noRoom(nodes []placement.Node, req placement.Request) error {
	healthy := 0
	var best *placement.Node
	var bestFree int64
	for i, n := range nodes {
		if !n.Healthy {
			continue
		}
		healthy++
		if !slices.Contains(n.Backends, req.Backend) {
			continue
		}
		if free := s.cfg.Placer.Free(n); best == nil || free > bestFree {
			best, bestFree = &nodes[i], free
		}
	}
	if healthy == 0 {
		return errdefs.RetryAfter(errdefs.Newf(errdefs.ErrUnavailable, "no healthy node (%d registered): start one with `dsec up` or `dsec edge`", len(nodes)), 2*time.Second)
	}
	if m, never := placement.Never(nodes, req); never {
		return neverFits(m, req)
	}
	if best == nil {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "no healthy node runs the %s backend (%d healthy nodes): ask for another backend or start a node with it", req.Backend, healthy)
	}
	return errdefs.RetryAfter(errdefs.Newf(errdefs.ErrResourceExhausted,
		"no node has room for a %s sandbox with %d MiB (%d healthy nodes; the roomiest, %s, has %d MiB of its %d MiB left): retry later, delete sandboxes or ask for less memory",
		req.Backend, req.MemoryBytes>>20, healthy, best.Name, max(bestFree, 0)>>20, best.MemoryAdmissible>>20), 5*time.Second)
}

// oldestReport is when the oldest of the nodes' reports was asked for.
func oldestReport(nodes []placement.Node) time.Time {
	var t time.Time
	for _, n := range nodes {
		if !n.ReportedAt.IsZero() && (t.IsZero() || n.ReportedAt.Before(t)) {
			t = n.ReportedAt
		}
	}
	return t
}

// neverFits is the error of a request no node could ever take (m).
func neverFits(m placement.Misfit, req placement.Request) error {
	switch m.Resource {
	case "memory":
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"memory %s is more than any node can ever give a %s sandbox: the most is %s, on node %s; ask for at most that (--memory)",
			formatBytes(req.MemoryBytes), req.Backend, formatBytes(m.Most), m.Node)
	case "pids":
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"pids %d is more than any node can ever give a %s sandbox: the most is %d, on node %s; ask for at most that (--pids)",
			req.Pids, req.Backend, m.Most, m.Node)
	case "disk":
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"disk %s is more than any node can ever give a %s sandbox: the most is %s, on node %s; ask for at most that (--disk)",
			formatBytes(req.DiskBytes), req.Backend, formatBytes(m.Most), m.Node)
	}
	return errdefs.Newf(errdefs.ErrInvalidArgument,
		"no node can ever give a %s sandbox memory %s, pids %d and disk %s together (each alone some node gives): ask for less (--memory, --pids, --disk)",
		req.Backend, formatBytes(req.MemoryBytes), req.Pids, formatBytes(req.DiskBytes))
}

func (p *sandboxProxy) Get(ctx context.Context, req *connect.Request[sandboxv1.GetRequest]) (*connect.Response[sandboxv1.GetResponse], error) {
	return unary(ctx, p.s, req.Msg.GetId(), req.Msg, sandboxv1connect.SandboxServiceClient.Get)
}

// fanOut calls fn on every healthy node at once and returns the first
// error of a node that answered.
func (s *Server) fanOut(ctx context.Context, fn func(ctx context.Context, node string, c *edgeclient.Conn) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for _, st := range s.cfg.Watcher.Nodes() {
		if !st.Healthy {
			continue
		}
		conn, err := s.cfg.Pool.Get(st.Node.Name, st.Node.Addr)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, st.Node.Name, conn); err != nil {
				mu.Lock()
				if first == nil {
					first = edgeErr(st.Node.Name, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

func (p *sandboxProxy) List(ctx context.Context, req *connect.Request[sandboxv1.ListRequest]) (*connect.Response[sandboxv1.ListResponse], error) {
	var mu sync.Mutex
	out := &sandboxv1.ListResponse{}
	err := p.s.fanOut(ctx, func(ctx context.Context, _ string, c *edgeclient.Conn) error {
		resp, err := c.Sandbox.List(ctx, forward(ctx, req.Msg))
		if err != nil {
			return err
		}
		mu.Lock()
		out.Sandboxes = append(out.Sandboxes, resp.Msg.GetSandboxes()...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out.Sandboxes, func(i, j int) bool {
		return out.Sandboxes[i].GetCreatedAt().AsTime().Before(out.Sandboxes[j].GetCreatedAt().AsTime())
	})
	return connect.NewResponse(out), nil
}

func (p *sandboxProxy) Delete(ctx context.Context, req *connect.Request[sandboxv1.DeleteRequest]) (*connect.Response[sandboxv1.DeleteResponse], error) {
	defer p.s.usage.touched()
	m := req.Msg
	switch {
	case m.GetId() != "" && len(m.GetSelector()) > 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "delete takes an id or a selector, not both")
	case m.GetId() != "":
		resp, err := unary(ctx, p.s, m.GetId(), m, sandboxv1connect.SandboxServiceClient.Delete)
		if err == nil {
			p.s.gone([]string{m.GetId()})
		}
		return resp, err
	case len(m.GetSelector()) == 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "delete needs a sandbox id or a label selector")
	}
	var mu sync.Mutex
	out := &sandboxv1.DeleteResponse{}
	err := p.s.fanOut(ctx, func(ctx context.Context, _ string, c *edgeclient.Conn) error {
		resp, err := c.Sandbox.Delete(ctx, forward(ctx, m))
		if err != nil {
			return err
		}
		mu.Lock()
		out.Deleted = append(out.Deleted, resp.Msg.GetDeleted()...)
		mu.Unlock()
		return nil
	})
	sort.Strings(out.Deleted)
	p.s.gone(out.Deleted)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// gone tells placement that the sandboxes ids were deleted.
func (s *Server) gone(ids []string) {
	byNode := map[string][]string{}
	for _, id := range ids {
		if node, ok := sandbox.NodeOfID(id); ok {
			byNode[node] = append(byNode[node], id)
		}
	}
	for node, ids := range byNode {
		s.cfg.Placer.Gone(node, ids...)
	}
}

func (p *sandboxProxy) Exec(ctx context.Context, req *connect.Request[sandboxv1.ExecRequest], stream *connect.ServerStream[sandboxv1.ExecResponse]) error {
	return serverStream(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, stream, sandboxv1connect.SandboxServiceClient.Exec)
}

func (p *sandboxProxy) ReadFile(ctx context.Context, req *connect.Request[sandboxv1.ReadFileRequest], stream *connect.ServerStream[sandboxv1.ReadFileResponse]) error {
	return serverStream(ctx, p.s, req.Msg.GetSandboxId(), req.Msg, stream, sandboxv1connect.SandboxServiceClient.ReadFile)
}

func (p *sandboxProxy) WriteFile(ctx context.Context, stream *connect.ClientStream[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error) {
	return clientStream(ctx, p.s, stream, "write file",
		func(m *sandboxv1.WriteFileRequest) string { return m.GetHeader().GetSandboxId() },
		sandboxv1connect.SandboxServiceClient.WriteFile)
}
