package edge

import (
	"context"
	"crypto/subtle"
	"io/fs"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dsecproject/dsec/api/dsec/image/v1/imagev1connect"
	nodev1 "github.com/dsecproject/dsec/api/dsec/node/v1"
	"github.com/dsecproject/dsec/api/dsec/node/v1/nodev1connect"
	"github.com/dsecproject/dsec/api/dsec/rollout/v1/rolloutv1connect"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/internal/reqlimit"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/streams"
)

// Handler returns the edge's HTTP handler: the sandbox API and the node API
// for the control plane, which must present token.
func (e *Edge) Handler(token string) http.Handler {
	mux := http.NewServeMux()
	limits := reqlimit.New(e.cfg.MaxRequestBytes)
	errs := apierr.Interceptor{
		Reporter: apierr.NewReporter(e.log, "node "+e.cfg.Node),
		Caller: func(_ context.Context, h http.Header) (string, string) {
			c := callerOf(h)
			return c.Project, c.KeyID
		},
	}
	opts := connect.WithHandlerOptions(connect.WithInterceptors(errs), limits.ConnectOption())
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(&sandboxAPI{e: e}, opts))
	mux.Handle(nodev1connect.NewNodeServiceHandler(&nodeAPI{e: e}, opts))
	mux.Handle(rolloutv1connect.NewRolloutServiceHandler(&rolloutAPI{e: e}, opts))
	mux.Handle(imagev1connect.NewLayerUseServiceHandler(&layerUseAPI{e: e}, opts))
	mux.HandleFunc(sandbox.PortTunnelPattern, e.servePortTunnel)
	return limits.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get(caller.HeaderNodeToken)
		if token == "" || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			http.Error(w, "dsec edge: only the control plane may call this node", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	}))
}

func callerOf(h http.Header) Caller { return caller.FromHeader(h) }

type sandboxAPI struct{ e *Edge }

var _ sandboxv1connect.SandboxServiceHandler = (*sandboxAPI)(nil)

func (a *sandboxAPI) Create(ctx context.Context, req *connect.Request[sandboxv1.CreateRequest]) (*connect.Response[sandboxv1.CreateResponse], error) {
	m := req.Msg
	c := callerOf(req.Header())
	if c.Rollout != "" {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "a rollout member's key cannot create sandboxes")
	}
	rec, err := a.e.Create(ctx, c, CreateParamsOf(m), m.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.CreateResponse{Sandbox: a.e.toProto(rec)}), nil
}

// CreateParamsOf converts a create request.
func CreateParamsOf(m *sandboxv1.CreateRequest) CreateParams {
	p := CreateParams{
		Image: m.GetImage(), Labels: m.GetLabels(), Env: m.GetEnv(),
		Workdir: m.GetWorkdir(), User: m.GetUser(), Backend: m.GetBackend(),
		TTL: m.GetTtl().AsDuration(), IdleTTL: m.GetIdleTtl().AsDuration(),
		PausedTTL: m.GetPausedTtl().AsDuration(), IdleAction: m.GetIdleAction(),
	}
	if len(m.GetLayers()) > 0 {
		p.Layers = m.GetLayers()
	}
	if c := m.GetLayerConfig(); c != nil {
		p.LayerConfig = &ImageConfig{Env: c.GetEnv(), Workdir: c.GetWorkdir(), User: c.GetUser()}
	}
	if r := m.GetResources(); r != nil {
		p.Resources = sandbox.Resources{MemoryBytes: r.GetMemoryBytes(), CPUs: r.GetCpus(), Pids: r.GetPids(), DiskBytes: r.GetDiskBytes()}
	}
	if spec, err := NetworkSpecOf(m.GetNetwork()); err != nil {
		p.networkErr = err
	} else if spec != nil && spec.Mode != netpolicy.ModeNone {
		p.Network = netpolicy.MarshalPolicyJSON(*spec)
	}
	return p
}

func (a *sandboxAPI) Get(ctx context.Context, req *connect.Request[sandboxv1.GetRequest]) (*connect.Response[sandboxv1.GetResponse], error) {
	rec, err := a.e.Get(ctx, callerOf(req.Header()), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.GetResponse{Sandbox: a.e.toProto(rec)}), nil
}

func (a *sandboxAPI) List(ctx context.Context, req *connect.Request[sandboxv1.ListRequest]) (*connect.Response[sandboxv1.ListResponse], error) {
	recs, err := a.e.List(ctx, callerOf(req.Header()), req.Msg.GetSelector())
	if err != nil {
		return nil, err
	}
	out := &sandboxv1.ListResponse{Sandboxes: make([]*sandboxv1.Sandbox, len(recs))}
	for i, r := range recs {
		out.Sandboxes[i] = a.e.toProto(r)
	}
	return connect.NewResponse(out), nil
}

func (a *sandboxAPI) Delete(ctx context.Context, req *connect.Request[sandboxv1.DeleteRequest]) (*connect.Response[sandboxv1.DeleteResponse], error) {
	m := req.Msg
	caller := callerOf(req.Header())
	switch {
	case m.GetId() != "" && len(m.GetSelector()) > 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "delete takes an id or a selector, not both")
	case m.GetId() != "":
		if err := a.e.Delete(ctx, caller, m.GetId()); err != nil {
			return nil, err
		}
		return connect.NewResponse(&sandboxv1.DeleteResponse{Deleted: []string{m.GetId()}}), nil
	default:
		ids, err := a.e.DeleteSelector(ctx, caller, m.GetSelector())
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&sandboxv1.DeleteResponse{Deleted: ids}), nil
	}
}

func (a *sandboxAPI) Exec(ctx context.Context, req *connect.Request[sandboxv1.ExecRequest], stream *connect.ServerStream[sandboxv1.ExecResponse]) error {
	m := req.Msg
	if m.GetRows() > 0xffff || m.GetCols() > 0xffff {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "terminal size %dx%d is too large", m.GetRows(), m.GetCols())
	}
	p := ExecParams{
		Sandbox: m.GetSandboxId(), Argv: m.GetArgv(), Shell: m.GetShell(), Env: m.GetEnv(),
		Cwd: m.GetCwd(), User: m.GetUser(), Stdin: m.GetStdin(), Timeout: m.GetTimeout().AsDuration(),
		StdinOpen: m.GetStdinOpen(), TTY: m.GetTty(), Rows: uint16(m.GetRows()), Cols: uint16(m.GetCols()),
		OutputLimit: m.GetOutputLimit(), Detach: m.GetDetach(),
	}
	p.Session, p.SessionShell = m.GetSession(), m.GetSessionShell()
	p.StepKey = m.GetStepKey()
	switch m.GetSealed() {
	case sandboxv1.Seal_SEAL_UNSPECIFIED:
	case sandboxv1.Seal_SEAL_FREEZE:
		p.Seal = sandbox.SealFreeze
	case sandboxv1.Seal_SEAL_KILL:
		p.Seal = sandbox.SealKill
	default:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "sealed %d: use SEAL_FREEZE or SEAL_KILL", m.GetSealed())
	}
	return a.e.Exec(ctx, callerOf(req.Header()), p, func(ev ExecEvent) error {
		return stream.Send(execEventProto(ev))
	})
}

func execEventProto(ev ExecEvent) *sandboxv1.ExecResponse {
	switch {
	case ev.Started != "":
		return &sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Started{Started: &sandboxv1.ExecStarted{ExecId: ev.Started}}}
	case ev.Output != nil:
		return &sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Output{Output: &sandboxv1.OutputChunk{
			Stream: sandboxv1.Stream(ev.Output.Stream), Offset: ev.Output.Offset, Data: ev.Output.Data,
		}}}
	case ev.Exit != nil:
		return &sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Exit{Exit: exitProto(ev.Exit)}}
	}
	return &sandboxv1.ExecResponse{Event: &sandboxv1.ExecResponse_Keepalive{Keepalive: &sandboxv1.Keepalive{}}}
}

func exitProto(x *sandbox.ExitStatus) *sandboxv1.ExecExit {
	out := &sandboxv1.ExecExit{
		ExitCode: int32(x.Code), Signal: int32(x.Signal), TimedOut: x.TimedOut, OomKilled: x.OOMKilled,
		StdoutTruncated: x.StdoutTruncated, StderrTruncated: x.StderrTruncated, Lost: x.Lost,
		Sealed: x.Sealed,
	}
	out.SessionLost, out.SessionRestarted = x.SessionLost, x.SessionRestarted
	if !x.Ended.IsZero() && !x.Started.IsZero() {
		out.Duration = durationpb.New(x.Ended.Sub(x.Started))
	}
	return out
}

func (a *sandboxAPI) ReadFile(ctx context.Context, req *connect.Request[sandboxv1.ReadFileRequest], stream *connect.ServerStream[sandboxv1.ReadFileResponse]) error {
	m := req.Msg
	return a.e.ReadFile(ctx, callerOf(req.Header()), m.GetSandboxId(), m.GetPath(), m.GetOffset(), m.GetLimit(),
		func(info *sandbox.FileInfo, data []byte) error {
			return stream.Send(&sandboxv1.ReadFileResponse{Info: fileInfoProto(info), Data: data})
		})
}

func (a *sandboxAPI) WriteFile(ctx context.Context, stream *connect.ClientStream[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error) {
	first, err := streams.First(stream, "write file", func(m *sandboxv1.WriteFileRequest) bool { return m.GetHeader() != nil })
	if err != nil {
		return nil, err
	}
	h := first.GetHeader()
	mode, err := modeOf(h.GetMode())
	if err != nil {
		return nil, err
	}
	info, err := a.e.WriteFile(ctx, callerOf(stream.RequestHeader()), WriteParams{
		Sandbox: h.GetSandboxId(), Path: h.GetPath(), Mode: mode, MakeParents: h.GetMakeParents(), User: h.GetUser(),
	}, streams.Reader(stream, "write file", func(m *sandboxv1.WriteFileRequest) ([]byte, bool) {
		return m.GetData(), m.GetHeader() == nil
	}))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.WriteFileResponse{Info: fileInfoProto(&info)}), nil
}

func fileInfoProto(i *sandbox.FileInfo) *sandboxv1.FileInfo {
	if i == nil {
		return nil
	}
	mode := uint32(i.Mode.Perm())
	if i.Mode&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if i.Mode&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if i.Mode&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return &sandboxv1.FileInfo{
		Path: i.Path, Size: i.Size, Mode: mode, ModTime: timestamppb.New(i.ModTime),
		IsDir: i.Mode.IsDir(), Uid: i.UID, Gid: i.GID,
		Name: i.Name, LinkTarget: i.LinkTarget, Type: fileType(i.Mode),
	}
}

func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "file"
}

var stateProto = map[State]sandboxv1.State{
	StateCreating: sandboxv1.State_STATE_CREATING,
	StateRunning:  sandboxv1.State_STATE_RUNNING,
	// A pause in flight: it runs until it is stopped; a resume in
	// flight: it is paused until it runs.
	StatePausing:  sandboxv1.State_STATE_RUNNING,
	StatePaused:   sandboxv1.State_STATE_PAUSED,
	StateResuming: sandboxv1.State_STATE_PAUSED,
	StateExited:   sandboxv1.State_STATE_EXITED,
	StateFailed:   sandboxv1.State_STATE_FAILED,
	StateDeleting: sandboxv1.State_STATE_DELETED,
}

// toProto is r in the API's form. While the hard TTL clock is stopped
// (paused), expires_at is when the hard TTL would end the sandbox were it
// resumed now; paused_at and paused_expires_at are set while it is
// paused.
func (e *Edge) toProto(r *Record) *sandboxv1.Sandbox {
	now := time.Now()
	out := &sandboxv1.Sandbox{
		Id: r.ID, Image: r.Image, Labels: r.Labels, State: stateProto[r.State], Reason: r.Reason,
		Resources: &sandboxv1.Resources{
			MemoryBytes: r.Resources.MemoryBytes, Cpus: r.Resources.CPUs,
			Pids: r.Resources.Pids, DiskBytes: r.Resources.DiskBytes,
		},
		Node: e.cfg.Node, Backend: r.Backend, Project: r.Project,
		CreatedAt: timestamppb.New(r.CreatedAt), ExpiresAt: timestamppb.New(hardExpiry(r, now)),
		IdleTtl: durationpb.New(r.IdleTTL), User: r.User, Workdir: r.Workdir, Env: r.Env,
		IdleExpiresAt: e.idleExpiry(r), Network: NetworkProto(r.Network),
		IdleAction: idleAction(r), PausedTtl: durationpb.New(pausedTTLOf(r, e.cfg.Defaults.PausedTTL)),
		Rollout: r.Rollout,
	}
	if !r.PausedAt.IsZero() {
		out.PausedAt = timestamppb.New(r.PausedAt)
		out.PausedExpiresAt = timestamppb.New(pausedExpiry(r, e.cfg.Defaults.PausedTTL))
	}
	return out
}

// idleExpiry is when r's idle TTL ends (or pauses) it unless something
// uses it: nil while a stream is open, without an idle TTL, in a state
// where the idle TTL does not run (paused), or before any activity is
// known.
func (e *Edge) idleExpiry(r *Record) *timestamppb.Timestamp {
	if r.IdleTTL <= 0 || !states[r.State].reapable {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	last, ok := e.activity[r.ID]
	if !ok || e.streams[r.ID] > 0 {
		return nil
	}
	return timestamppb.New(last.Add(r.IdleTTL))
}

type nodeAPI struct{ e *Edge }

func (a *nodeAPI) Status(ctx context.Context, _ *connect.Request[nodev1.StatusRequest]) (*connect.Response[nodev1.StatusResponse], error) {
	st, err := a.e.Status()
	if err != nil {
		return nil, err
	}
	projects := make(map[string]*nodev1.ProjectUsage, len(st.Projects))
	for name, u := range st.Projects {
		projects[name] = &nodev1.ProjectUsage{Sandboxes: u.Sandboxes, MemoryBytes: u.MemoryBytes}
	}
	return connect.NewResponse(&nodev1.StatusResponse{
		Node: st.Node, Backends: st.Backends, Sandboxes: st.Sandboxes, Cpus: float64(st.CPUs),
		MemoryBytes: st.MemoryBytes, MemoryCommittedBytes: st.MemoryCommitted,
		MemoryAdmissibleBytes: st.MemoryAdmissible, MemoryAvailableBytes: st.MemoryAvailable,
		Version: a.e.cfg.Version, Projects: projects,
		PidsMax: a.e.cfg.PidsCeiling, DiskMaxBytes: a.e.mostDisk(),
	}), nil
}
