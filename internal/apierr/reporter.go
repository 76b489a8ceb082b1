package apierr

import (
	"context"
	"hash/fnv"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
)

// RepeatWindow is how long a Reporter leaves out entries identical to one
// it logged.
const RepeatWindow = 10 * time.Second

// maxRecent bounds the errors a Reporter remembers for RepeatWindow.
const maxRecent = 4096

// Call names a failed call in the log.
type Call struct {
	Procedure string // "/dsec.sandbox.v1.SandboxService/Create"
	Project   string // the caller's key's project
	KeyID     string // the caller's key's ID
	Sandbox   string // the sandbox the request names, if any
}

// A Reporter converts the errors of one server's calls for the wire and logs
// each, by the rules of the package comment. It is safe for concurrent use.
type Reporter struct {
	log   *slog.Logger
	where string
	now   func() time.Time

	mu sync.Mutex
	// recent holds the entries logged in the last RepeatWindow, by what
	// makes two entries identical. guarded by mu
	recent map[uint64]*entry
}

type entry struct {
	id     string
	at     time.Time
	repeat int // entries left out since
}

// NewReporter returns a Reporter that logs to log. where names the server
// in messages users see: "node n1", "the API server".
func NewReporter(log *slog.Logger, where string) *Reporter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if where == "" {
		where = "the server"
	}
	return &Reporter{log: log, where: where, now: time.Now, recent: map[uint64]*entry{}}
}

// ToConnect converts err, which call c failed with, for the wire and logs
// it once. The result is a *connect.Error, or nil when err is.
func (r *Reporter) ToConnect(ctx context.Context, c Call, err error) error {
	if err == nil {
		return nil
	}
	rp := classify(err)
	level := levelOf(rp)
	id := ""
	if r.log.Enabled(ctx, level) {
		id = r.logOnce(ctx, level, c, rp)
	} else if rp.withheld {
		id = newID()
	}
	return rp.build(id, c, r.where)
}

// levelOf is the level an error is logged at.
func levelOf(rp reply) slog.Level {
	if rp.remote {
		return slog.LevelDebug
	}
	level := slog.LevelDebug
	switch rp.code {
	case connect.CodeInternal, connect.CodeUnknown, connect.CodeDataLoss:
		level = slog.LevelError
	case connect.CodeUnavailable:
		level = slog.LevelWarn
	}
	if rp.withheld {
		level = max(level, slog.LevelInfo)
	}
	return level
}

// logOnce logs rp unless an identical entry was logged within
// RepeatWindow, and returns the id of the entry that describes it (empty
// when rp withholds nothing).
func (r *Reporter) logOnce(ctx context.Context, level slog.Level, c Call, rp reply) string {
	text := rp.err.Error()
	h := fnv.New64a()
	for _, s := range []string{level.String(), rp.code.String(), c.Procedure, c.Project, c.KeyID, text, rp.detail} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	key := h.Sum64()
	now := r.now()

	r.mu.Lock()
	e := r.recent[key]
	if e != nil && now.Sub(e.at) < RepeatWindow {
		e.repeat++
		r.mu.Unlock()
		return e.id
	}
	repeat := 0
	if e != nil {
		repeat = e.repeat
	}
	if len(r.recent) >= maxRecent {
		for k, old := range r.recent {
			if now.Sub(old.at) >= RepeatWindow {
				delete(r.recent, k)
			}
		}
		if len(r.recent) >= maxRecent {
			clear(r.recent)
		}
	}
	id := ""
	if rp.withheld {
		id = newID()
	}
	r.recent[key] = &entry{id: id, at: now}
	r.mu.Unlock()

	attrs := make([]slog.Attr, 0, 10)
	if id != "" {
		attrs = append(attrs, slog.String("id", id))
	}
	attrs = append(attrs, slog.String("procedure", c.Procedure), slog.String("code", rp.code.String()))
	for _, a := range []struct{ k, v string }{{"project", c.Project}, {"key", c.KeyID}, {"sandbox", c.Sandbox}} {
		if a.v != "" {
			attrs = append(attrs, slog.String(a.k, a.v))
		}
	}
	if rp.remote {
		attrs = append(attrs, slog.Bool("remote", true))
	}
	if repeat > 0 {
		attrs = append(attrs, slog.Int("repeated", repeat))
	}
	attrs = append(attrs, slog.String("err", text))
	if rp.detail != "" {
		attrs = append(attrs, slog.String("detail", rp.detail))
	}
	r.log.LogAttrs(ctx, level, "API call failed", attrs...)
	return id
}

// Interceptor converts the errors of every call of a server with a
// Reporter, in one place.
type Interceptor struct {
	Reporter *Reporter
	// Enter, when set, runs before each call (authentication): it returns
	// the context the handler gets, or the error the call fails with.
	Enter func(ctx context.Context, h http.Header) (context.Context, error)
	// Caller, when set, returns the project and key ID of a call's key
	// from the handler's context and the request's header.
	Caller func(ctx context.Context, h http.Header) (project, keyID string)
	// Failed, when set, is told the procedure and code of every failed
	// call (metrics).
	Failed func(procedure string, code connect.Code)
}

var _ connect.Interceptor = Interceptor{}

func (i Interceptor) done(ctx context.Context, h http.Header, procedure, sandbox string, err error) error {
	if err == nil {
		return nil
	}
	c := Call{Procedure: procedure, Sandbox: sandbox}
	if i.Caller != nil {
		c.Project, c.KeyID = i.Caller(ctx, h)
	}
	out := i.Reporter.ToConnect(ctx, c, err)
	if i.Failed != nil {
		i.Failed(procedure, connect.CodeOf(out))
	}
	return out
}

func (i Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		proc := req.Spec().Procedure
		var err error
		if i.Enter != nil {
			if ctx, err = i.Enter(ctx, req.Header()); err != nil {
				return nil, i.done(ctx, req.Header(), proc, "", err)
			}
		}
		resp, err := next(ctx, req)
		if err != nil {
			return resp, i.done(ctx, req.Header(), proc, SandboxOf(proc, req.Any()), err)
		}
		return resp, nil
	}
}

func (Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		proc := conn.Spec().Procedure
		var err error
		if i.Enter != nil {
			if ctx, err = i.Enter(ctx, conn.RequestHeader()); err != nil {
				return i.done(ctx, conn.RequestHeader(), proc, "", err)
			}
		}
		fc := &firstConn{StreamingHandlerConn: conn}
		if err := next(ctx, fc); err != nil {
			return i.done(ctx, conn.RequestHeader(), proc, fc.sandbox(), err)
		}
		return nil
	}
}

// firstConn notes the sandbox that a stream's first message (its request,
// or an upload's header) names.
type firstConn struct {
	connect.StreamingHandlerConn

	mu sync.Mutex
	// guarded by mu
	got bool
	sb  string
}

func (c *firstConn) Receive(m any) error {
	err := c.StreamingHandlerConn.Receive(m)
	if err == nil {
		c.mu.Lock()
		if !c.got {
			c.got, c.sb = true, SandboxOf(c.Spec().Procedure, m)
		}
		c.mu.Unlock()
	}
	return err
}

func (c *firstConn) sandbox() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sb
}

// SandboxOf returns the sandbox a request of procedure names: its
// sandbox_id field, or that of the header it carries, or, in the sandbox
// service, its id field.
func SandboxOf(procedure string, msg any) string {
	m, ok := msg.(proto.Message)
	if !ok {
		return ""
	}
	r := m.ProtoReflect()
	if id := stringField(r, "sandbox_id"); id != "" {
		return id
	}
	if strings.HasPrefix(procedure, "/"+sandboxv1connect.SandboxServiceName+"/") {
		if id := stringField(r, "id"); id != "" {
			return id
		}
	}
	id := ""
	r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap() {
			id = stringField(v.Message(), "sandbox_id")
		}
		return id == ""
	})
	return id
}

func stringField(r protoreflect.Message, name protoreflect.Name) string {
	fd := r.Descriptor().Fields().ByName(name)
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() {
		return ""
	}
	return r.Get(fd).String()
}
