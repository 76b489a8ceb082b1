package edge

import (
	"context"
	"io"
	"io/fs"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/streams"
)

// The API calls added for exec control, files, lifetimes and events.

func (a *sandboxAPI) BatchCreate(ctx context.Context, req *connect.Request[sandboxv1.BatchCreateRequest]) (*connect.Response[sandboxv1.BatchCreateResponse], error) {
	return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "batch create is served by the control plane, not by an edge")
}

func (a *sandboxAPI) SetTimeout(ctx context.Context, req *connect.Request[sandboxv1.SetTimeoutRequest]) (*connect.Response[sandboxv1.SetTimeoutResponse], error) {
	m := req.Msg
	t := Timeouts{IdleAction: m.GetIdleAction()}
	for _, f := range []struct {
		d   *durationpb.Duration
		set **time.Duration
	}{{m.Ttl, &t.TTL}, {m.IdleTtl, &t.IdleTTL}, {m.PausedTtl, &t.PausedTTL}} {
		if f.d != nil {
			d := f.d.AsDuration()
			*f.set = &d
		}
	}
	if t.TTL == nil && t.IdleTTL == nil && t.PausedTTL == nil && t.IdleAction == "" {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "set timeout: give ttl, idle_ttl, paused_ttl or idle_action")
	}
	r, err := a.e.SetTimeout(ctx, callerOf(req.Header()), m.GetId(), t)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.SetTimeoutResponse{Sandbox: a.e.toProto(r)}), nil
}

func (a *sandboxAPI) UpdateLabels(ctx context.Context, req *connect.Request[sandboxv1.UpdateLabelsRequest]) (*connect.Response[sandboxv1.UpdateLabelsResponse], error) {
	m := req.Msg
	r, err := a.e.UpdateLabels(ctx, callerOf(req.Header()), m.GetId(), m.GetSet(), m.GetRemove())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.UpdateLabelsResponse{Sandbox: a.e.toProto(r)}), nil
}

var eventTypeProto = map[string]sandboxv1.EventType{
	EventCreated:    sandboxv1.EventType_EVENT_TYPE_CREATED,
	EventExited:     sandboxv1.EventType_EVENT_TYPE_EXITED,
	EventOOM:        sandboxv1.EventType_EVENT_TYPE_OOM,
	EventTTLExpired: sandboxv1.EventType_EVENT_TYPE_TTL_EXPIRED,
	EventFailed:     sandboxv1.EventType_EVENT_TYPE_FAILED,
	EventDeleted:    sandboxv1.EventType_EVENT_TYPE_DELETED,
	EventUpdated:    sandboxv1.EventType_EVENT_TYPE_UPDATED,
	EventPaused:     sandboxv1.EventType_EVENT_TYPE_PAUSED,
	EventResumed:    sandboxv1.EventType_EVENT_TYPE_RESUMED,
}

func (a *sandboxAPI) Watch(ctx context.Context, req *connect.Request[sandboxv1.WatchRequest], stream *connect.ServerStream[sandboxv1.WatchResponse]) error {
	return a.e.Watch(ctx, callerOf(req.Header()), req.Msg.GetSelector(), req.Msg.GetInitial(),
		func(ev Event) error {
			return stream.Send(&sandboxv1.WatchResponse{Msg: &sandboxv1.WatchResponse_Event{Event: &sandboxv1.Event{
				Type: eventTypeProto[ev.Type], Sandbox: a.e.toProto(&ev.Record), Reason: ev.Reason, Time: timestamppb.New(ev.Time),
			}}})
		},
		func() error {
			return stream.Send(&sandboxv1.WatchResponse{Msg: &sandboxv1.WatchResponse_Keepalive{Keepalive: &sandboxv1.Keepalive{}}})
		})
}

func (a *sandboxAPI) Stats(ctx context.Context, req *connect.Request[sandboxv1.StatsRequest]) (*connect.Response[sandboxv1.StatsResponse], error) {
	r, st, err := a.e.Stats(ctx, callerOf(req.Header()), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	net := a.e.networkCounters(ctx, r)
	return connect.NewResponse(&sandboxv1.StatsResponse{
		CpuUsage: durationpb.New(st.CPUUsage), CpusLimit: r.Resources.CPUs,
		MemoryBytes: st.MemoryBytes, MemoryLimit: st.MemoryLimit, Pids: st.Pids, PidsLimit: st.PidsLimit,
		DiskBytes: st.DiskBytes, DiskLimit: st.DiskLimit, OomKills: st.OOMKills,
		OutputBytes: st.OutputBytes, OutputLimit: st.OutputLimit,
		NetBytesOut: net.BytesOut, NetBytesIn: net.BytesIn, NetConnectionsOut: net.ConnsOut, NetDenied: net.Denied,
		Networked: needsLink(r.Network), SwappedBytes: swappedOf(r),
	}), nil
}

func (a *sandboxAPI) Attach(ctx context.Context, req *connect.Request[sandboxv1.AttachRequest], stream *connect.ServerStream[sandboxv1.ExecResponse]) error {
	m := req.Msg
	return a.e.Attach(ctx, callerOf(req.Header()), m.GetSandboxId(), m.GetExecId(), m.GetStdoutOffset(), m.GetStderrOffset(),
		func(ev ExecEvent) error { return stream.Send(execEventProto(ev)) })
}

func (a *sandboxAPI) WriteStdin(ctx context.Context, req *connect.Request[sandboxv1.WriteStdinRequest]) (*connect.Response[sandboxv1.WriteStdinResponse], error) {
	m := req.Msg
	if err := a.e.WriteStdin(ctx, callerOf(req.Header()), m.GetSandboxId(), m.GetExecId(), m.GetData(), m.GetClose()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.WriteStdinResponse{}), nil
}

func (a *sandboxAPI) Signal(ctx context.Context, req *connect.Request[sandboxv1.SignalRequest]) (*connect.Response[sandboxv1.SignalResponse], error) {
	m := req.Msg
	if err := a.e.Signal(ctx, callerOf(req.Header()), m.GetSandboxId(), m.GetExecId(), int(m.GetSignal())); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.SignalResponse{}), nil
}

func (a *sandboxAPI) ResizeTTY(ctx context.Context, req *connect.Request[sandboxv1.ResizeTTYRequest]) (*connect.Response[sandboxv1.ResizeTTYResponse], error) {
	m := req.Msg
	if m.GetRows() > 0xffff || m.GetCols() > 0xffff {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "terminal size %dx%d is too large", m.GetRows(), m.GetCols())
	}
	if err := a.e.ResizeTTY(ctx, callerOf(req.Header()), m.GetSandboxId(), m.GetExecId(), uint16(m.GetRows()), uint16(m.GetCols())); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.ResizeTTYResponse{}), nil
}

func (a *sandboxAPI) ListExecs(ctx context.Context, req *connect.Request[sandboxv1.ListExecsRequest]) (*connect.Response[sandboxv1.ListExecsResponse], error) {
	execs, err := a.e.ListExecs(ctx, callerOf(req.Header()), req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	out := &sandboxv1.ListExecsResponse{}
	for _, x := range WithStepKeys(execs, req.Msg.GetStepKeys()) {
		pi := &sandboxv1.ExecInfo{
			ExecId: x.ID, Argv: x.Argv, Tty: x.TTY, StartedAt: timestamppb.New(x.Started), Running: x.Running,
			StdoutBytes: x.StdoutBytes, StderrBytes: x.StderrBytes, Sealed: x.Sealed,
		}
		pi.Session = x.Session
		pi.StepKey = x.StepKey
		if x.Exit != nil {
			pi.Exit = exitProto(x.Exit)
		}
		out.Execs = append(out.Execs, pi)
	}
	return connect.NewResponse(out), nil
}

func (a *sandboxAPI) Stat(ctx context.Context, req *connect.Request[sandboxv1.StatRequest]) (*connect.Response[sandboxv1.StatResponse], error) {
	info, err := a.e.Stat(ctx, callerOf(req.Header()), req.Msg.GetSandboxId(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.StatResponse{Info: fileInfoProto(&info)}), nil
}

func (a *sandboxAPI) ListDir(ctx context.Context, req *connect.Request[sandboxv1.ListDirRequest]) (*connect.Response[sandboxv1.ListDirResponse], error) {
	m := req.Msg
	entries, truncated, err := a.e.ListDir(ctx, callerOf(req.Header()), m.GetSandboxId(), m.GetPath(), int(m.GetLimit()))
	if err != nil {
		return nil, err
	}
	out := &sandboxv1.ListDirResponse{Truncated: truncated}
	for i := range entries {
		out.Entries = append(out.Entries, fileInfoProto(&entries[i]))
	}
	return connect.NewResponse(out), nil
}

func (a *sandboxAPI) MakeDir(ctx context.Context, req *connect.Request[sandboxv1.MakeDirRequest]) (*connect.Response[sandboxv1.MakeDirResponse], error) {
	m := req.Msg
	mode, err := modeOf(m.GetMode())
	if err != nil {
		return nil, err
	}
	info, err := a.e.MakeDir(ctx, callerOf(req.Header()), m.GetSandboxId(), m.GetPath(), mode, m.GetParents(), m.GetUser())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.MakeDirResponse{Info: fileInfoProto(&info)}), nil
}

func (a *sandboxAPI) Remove(ctx context.Context, req *connect.Request[sandboxv1.RemoveRequest]) (*connect.Response[sandboxv1.RemoveResponse], error) {
	m := req.Msg
	if err := a.e.Remove(ctx, callerOf(req.Header()), m.GetSandboxId(), m.GetPath(), m.GetRecursive()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.RemoveResponse{}), nil
}

func (a *sandboxAPI) Rename(ctx context.Context, req *connect.Request[sandboxv1.RenameRequest]) (*connect.Response[sandboxv1.RenameResponse], error) {
	m := req.Msg
	if err := a.e.Rename(ctx, callerOf(req.Header()), m.GetSandboxId(), m.GetFrom(), m.GetTo(), m.GetOverwrite()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.RenameResponse{}), nil
}

func (a *sandboxAPI) DownloadTar(ctx context.Context, req *connect.Request[sandboxv1.DownloadTarRequest], stream *connect.ServerStream[sandboxv1.DownloadTarResponse]) error {
	w := &chunkWriter{send: func(b []byte) error {
		return stream.Send(&sandboxv1.DownloadTarResponse{Data: b})
	}}
	if err := a.e.DownloadTar(ctx, callerOf(req.Header()), req.Msg.GetSandboxId(), req.Msg.GetPath(), w); err != nil {
		return err
	}
	return w.flush()
}

func (a *sandboxAPI) UploadTar(ctx context.Context, stream *connect.ClientStream[sandboxv1.UploadTarRequest]) (*connect.Response[sandboxv1.UploadTarResponse], error) {
	first, err := streams.First(stream, "upload tar", func(m *sandboxv1.UploadTarRequest) bool { return m.GetHeader() != nil })
	if err != nil {
		return nil, err
	}
	h := first.GetHeader()
	data := streams.Reader(stream, "upload tar", func(m *sandboxv1.UploadTarRequest) ([]byte, bool) {
		return m.GetData(), m.GetHeader() == nil
	})
	st, err := a.e.UploadTar(ctx, callerOf(stream.RequestHeader()), h.GetSandboxId(), h.GetPath(), h.GetMakeParents(), h.GetUser(), data)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.UploadTarResponse{Files: st.Files, Dirs: st.Dirs, Links: st.Links, Bytes: st.Bytes}), nil
}

// modeOf converts Unix permission bits (with setuid, setgid, sticky).
func modeOf(m uint32) (fs.FileMode, error) {
	if m&^0o7777 != 0 {
		return 0, errdefs.Newf(errdefs.ErrInvalidArgument, "file mode %o: only permission bits", m)
	}
	mode := fs.FileMode(m & 0o777)
	for bit, flag := range map[uint32]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
		if m&bit != 0 {
			mode |= flag
		}
	}
	return mode, nil
}

// chunkWriter sends what is written in chunks of chunkSize.
type chunkWriter struct {
	send func([]byte) error
	buf  []byte
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		take := min(len(p), chunkSize-len(w.buf))
		w.buf = append(w.buf, p[:take]...)
		p = p[take:]
		if len(w.buf) == chunkSize {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (w *chunkWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.send(w.buf)
	w.buf = nil
	return err
}

var _ io.Writer = (*chunkWriter)(nil)

func (a *sandboxAPI) ListBackends(ctx context.Context, req *connect.Request[sandboxv1.ListBackendsRequest]) (*connect.Response[sandboxv1.ListBackendsResponse], error) {
	out := &sandboxv1.ListBackendsResponse{}
	for _, b := range a.e.Backends() {
		info := &sandboxv1.BackendInfo{Node: a.e.cfg.Node, Name: b.Name, Tier: string(b.Tier), Default: b.Default}
		for _, c := range b.Capabilities {
			info.Capabilities = append(info.Capabilities, string(c))
		}
		out.Backends = append(out.Backends, info)
	}
	return connect.NewResponse(out), nil
}

// swappedOf is r's memory out of RAM as its last pause left it, while it
// is paused; zero otherwise (the backends' stats do not say).
func swappedOf(r *Record) int64 {
	if states[r.State].reclaimed {
		return r.Swapped
	}
	return 0
}
