package dsec

import (
	"context"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// Event types (Event.Type).
const (
	EventCreated = "created"
	// EventExited: the sandbox's init ended; the sandbox stays until
	// deleted.
	EventExited = "exited"
	// EventOOM: the kernel killed a process of the sandbox for memory.
	EventOOM = "oom"
	// EventTTLExpired: the hard, idle or paused TTL deleted the sandbox.
	EventTTLExpired = "ttl_expired"
	EventFailed     = "failed"
	EventDeleted    = "deleted"
	// EventUpdated: labels or TTLs changed.
	EventUpdated = "updated"
	// EventPaused: the sandbox was paused (asked for, or by its idle TTL
	// with IdlePause); EventResumed: it runs again.
	EventPaused  = "paused"
	EventResumed = "resumed"
	// EventUnknown is what an unset or newer event type reads as.
	EventUnknown = "unknown"
)

var eventNames = map[sandboxv1.EventType]string{
	sandboxv1.EventType_EVENT_TYPE_CREATED:     EventCreated,
	sandboxv1.EventType_EVENT_TYPE_EXITED:      EventExited,
	sandboxv1.EventType_EVENT_TYPE_OOM:         EventOOM,
	sandboxv1.EventType_EVENT_TYPE_TTL_EXPIRED: EventTTLExpired,
	sandboxv1.EventType_EVENT_TYPE_FAILED:      EventFailed,
	sandboxv1.EventType_EVENT_TYPE_DELETED:     EventDeleted,
	sandboxv1.EventType_EVENT_TYPE_UPDATED:     EventUpdated,
	sandboxv1.EventType_EVENT_TYPE_PAUSED:      EventPaused,
	sandboxv1.EventType_EVENT_TYPE_RESUMED:     EventResumed,
}

// Event is a change of a sandbox's state.
type Event struct {
	// Type is one of the Event* constants.
	Type string
	// Sandbox is the sandbox as it is after the change.
	Sandbox *Sandbox
	// Reason says why, for people.
	Reason string
	Time   time.Time
}

// WatchOptions select what Watch reports.
type WatchOptions struct {
	// Selector holds labels that must all match (k=v, ANDed); empty
	// watches every sandbox the key may see.
	Selector map[string]string
	// Initial also reports an EventCreated for every matching sandbox that
	// exists when the watch starts.
	Initial bool
}

// Watch calls fn with every event of the sandboxes that opts selects, in
// the order the server sends them, until ctx ends (Watch then returns nil),
// fn returns an error (Watch returns it) or the stream fails (an *Error;
// ErrUnavailable when the server ended it: watch again, with Initial to
// catch up). fn runs on the calling goroutine.
func (c *Client) Watch(ctx context.Context, opts WatchOptions, fn func(Event) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.sandboxes.Watch(ctx, connect.NewRequest(&sandboxv1.WatchRequest{Selector: opts.Selector, Initial: opts.Initial}))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return c.err(err)
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if ev == nil {
			continue // a keepalive, or a message this version does not know
		}
		if err := fn(c.eventFromProto(ev)); err != nil {
			return err
		}
	}
	if ctx.Err() != nil || endsNow(ctx) {
		return nil
	}
	if err := stream.Err(); err != nil {
		return c.err(err)
	}
	return newError(ErrUnavailable, "the server ended the watch stream; watch again (with Initial to catch up)")
}

// endsNow reports whether ctx's deadline is at most a moment away: the
// server learns it in whole milliseconds, so its copy may run out first
// and end the stream just before ctx does.
func endsNow(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && time.Until(d) < 50*time.Millisecond
}

func (c *Client) eventFromProto(p *sandboxv1.Event) Event {
	ev := Event{Type: EventUnknown, Reason: p.GetReason(), Time: timeOf(p.GetTime())}
	if n, ok := eventNames[p.GetType()]; ok {
		ev.Type = n
	}
	if p.GetSandbox() != nil {
		ev.Sandbox = c.sandboxFromProto(p.GetSandbox())
	}
	return ev
}
