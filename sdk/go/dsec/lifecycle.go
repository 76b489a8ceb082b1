package dsec

import (
	"context"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// MaxBatch is the most sandboxes one BatchCreate makes.
const MaxBatch = 1000

// BatchResult is the outcome of one item of a BatchCreate: the sandbox, or
// the error that kept it from being created.
type BatchResult struct {
	// Index is the item's position, 0 to count-1.
	Index int
	// Sandbox is the new sandbox; nil when Err is set.
	Sandbox *Sandbox
	// Err is an *Error whose Kind is the item's error kind (for example
	// ErrResourceExhausted, with a RetryAfter hint).
	Err error
}

// BatchCreate creates count sandboxes (1 to MaxBatch) from one template in
// one call, and returns a result per item in index order. Items fail on
// their own: the error return is for the call as a whole (a bad template, a
// server that cannot be reached). With opts.IdempotencyKey K, item i is
// keyed K/i, so a retried batch returns the sandboxes it already made.
func (c *Client) BatchCreate(ctx context.Context, opts CreateOptions, count int) ([]BatchResult, error) {
	if count < 1 || count > MaxBatch {
		return nil, newError(ErrInvalidArgument, "batch create: count %d is out of range: create 1 to %d sandboxes per call", count, MaxBatch)
	}
	tmpl, err := createRequest(opts)
	if err != nil {
		return nil, err
	}
	resp, err := c.sandboxes.BatchCreate(ctx, connect.NewRequest(&sandboxv1.BatchCreateRequest{Template: tmpl, Count: int32(count)}))
	if err != nil {
		return nil, c.err(err)
	}
	out := make([]BatchResult, 0, len(resp.Msg.GetResults()))
	for _, r := range resp.Msg.GetResults() {
		res := BatchResult{Index: int(r.GetIndex())}
		switch {
		case r.GetError() != nil:
			res.Err = itemError(r.GetError())
		case r.GetSandbox() != nil:
			res.Sandbox = c.sandboxFromProto(r.GetSandbox())
		default:
			res.Err = newError(ErrInternal, "batch create: the server sent neither a sandbox nor an error for item %d", res.Index)
		}
		out = append(out, res)
	}
	if len(out) != count {
		// Keep what was made (the caller may need to delete it) and say
		// that the answer is short.
		return out, newError(ErrInternal, "batch create: the server answered %d of %d items", len(out), count)
	}
	return out, nil
}

// itemError converts the error of one batch item. Its code is the name of
// an API code ("resource_exhausted"), mapped to a kind by the one table.
func itemError(e *sandboxv1.ItemError) *Error {
	var code connect.Code
	kind := ErrInternal
	if err := code.UnmarshalText([]byte(e.GetCode())); err == nil {
		kind = kindOf(code)
	}
	out := &Error{Kind: kind, Message: e.GetMessage()}
	if out.Message == "" {
		out.Message = kind.Error()
	}
	if e.GetRetryAfter() != nil {
		if d := e.GetRetryAfter().AsDuration(); d > 0 {
			out.RetryAfter = d
		}
	}
	return out
}

// SetTimeout changes the TTLs of a live sandbox: ttl is a new hard TTL
// counted from now, idleTTL a new idle TTL; zero leaves one as it is. s is
// updated with the server's answer (ExpiresAt, IdleTTL). SetTimeouts also
// changes the paused TTL and the idle action.
func (s *Sandbox) SetTimeout(ctx context.Context, ttl, idleTTL time.Duration) error {
	if ttl == 0 && idleTTL == 0 {
		return newError(ErrInvalidArgument, "set timeout of sandbox %s: give a TTL, an idle TTL or both", s.ID)
	}
	return s.SetTimeouts(ctx, Timeouts{TTL: ttl, IdleTTL: idleTTL})
}

// Timeouts are a live sandbox's lifetimes; zero fields stay as they are.
type Timeouts struct {
	// TTL is a new hard TTL, counted from now (for a paused sandbox, from
	// when it resumes: paused time does not count).
	TTL time.Duration
	// IdleTTL is a new idle TTL.
	IdleTTL time.Duration
	// PausedTTL is a new paused TTL, counted from the pause for a paused
	// sandbox.
	PausedTTL time.Duration
	// IdleAction is a new idle action: IdleDelete or IdlePause.
	IdleAction string
}

// SetTimeouts changes a live sandbox's lifetimes (a paused one stays
// paused). s is updated with the server's answer.
func (s *Sandbox) SetTimeouts(ctx context.Context, t Timeouts) error {
	if err := s.check(); err != nil {
		return err
	}
	if t.TTL < 0 || t.IdleTTL < 0 || t.PausedTTL < 0 {
		return newError(ErrInvalidArgument, "set timeout of sandbox %s: TTLs must be positive (got ttl %s, idle TTL %s, paused TTL %s)", s.ID, t.TTL, t.IdleTTL, t.PausedTTL)
	}
	if t == (Timeouts{}) {
		return newError(ErrInvalidArgument, "set timeout of sandbox %s: give a TTL, an idle TTL, a paused TTL or an idle action", s.ID)
	}
	resp, err := s.c.sandboxes.SetTimeout(ctx, connect.NewRequest(&sandboxv1.SetTimeoutRequest{
		Id: s.ID, Ttl: optDuration(t.TTL), IdleTtl: optDuration(t.IdleTTL),
		PausedTtl: optDuration(t.PausedTTL), IdleAction: t.IdleAction,
	}))
	if err != nil {
		return s.c.err(err)
	}
	s.update(resp.Msg.GetSandbox())
	return nil
}

// UpdateLabels sets the labels of set and removes the keys of remove (a key
// in both is set). s is updated with the server's answer.
func (s *Sandbox) UpdateLabels(ctx context.Context, set map[string]string, remove ...string) error {
	if err := s.check(); err != nil {
		return err
	}
	if len(set) == 0 && len(remove) == 0 {
		return newError(ErrInvalidArgument, "update labels of sandbox %s: nothing to set or remove", s.ID)
	}
	resp, err := s.c.sandboxes.UpdateLabels(ctx, connect.NewRequest(&sandboxv1.UpdateLabelsRequest{
		Id: s.ID, Set: set, Remove: remove,
	}))
	if err != nil {
		return s.c.err(err)
	}
	s.update(resp.Msg.GetSandbox())
	return nil
}

// update replaces s's fields with p's, when the server sent a sandbox.
func (s *Sandbox) update(p *sandboxv1.Sandbox) {
	if p == nil {
		return
	}
	*s = *s.c.sandboxFromProto(p)
}

// Stats is a sandbox's resource use and its limits.
type Stats struct {
	// CPU is the CPU time its processes have used, in total.
	CPU time.Duration
	// CPUs is its CPU cap in cores.
	CPUs float64
	// Memory and MemoryLimit are in bytes.
	Memory      int64
	MemoryLimit int64
	Pids        int64
	PidsLimit   int64
	// Disk and DiskLimit are the writable layer's use and size in bytes.
	Disk      int64
	DiskLimit int64
	// OOMKills counts the processes the kernel killed for memory.
	OOMKills int64
	// Output and OutputLimit are the bytes of exec output kept for the
	// sandbox and its quota.
	Output      int64
	OutputLimit int64
	// Network counters (zero without network; Sandbox.Network has them
	// all): bytes out and in, connections out, connections and lookups
	// refused.
	NetOut, NetIn, NetConnections, NetDenied int64
	// Networked is set when the sandbox has a network (a policy that
	// allows anything).
	Networked bool
	// Swapped is the memory of a paused sandbox out of RAM, in the node's
	// swap, as its pause left it.
	Swapped int64
}

// Stats reports the sandbox's resource use.
func (s *Sandbox) Stats(ctx context.Context) (*Stats, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	resp, err := s.c.sandboxes.Stats(ctx, connect.NewRequest(&sandboxv1.StatsRequest{Id: s.ID}))
	if err != nil {
		return nil, s.c.err(err)
	}
	m := resp.Msg
	st := &Stats{
		CPUs:        m.GetCpusLimit(),
		Memory:      m.GetMemoryBytes(),
		MemoryLimit: m.GetMemoryLimit(),
		Pids:        m.GetPids(),
		PidsLimit:   m.GetPidsLimit(),
		Disk:        m.GetDiskBytes(),
		DiskLimit:   m.GetDiskLimit(),
		OOMKills:    m.GetOomKills(),
		Output:      m.GetOutputBytes(),
		OutputLimit: m.GetOutputLimit(),
		NetOut:      m.GetNetBytesOut(), NetIn: m.GetNetBytesIn(),
		NetConnections: m.GetNetConnectionsOut(), NetDenied: m.GetNetDenied(),
		Networked: m.GetNetworked(), Swapped: m.GetSwappedBytes(),
	}
	if m.GetCpuUsage() != nil {
		st.CPU = m.GetCpuUsage().AsDuration()
	}
	return st, nil
}
