package edge

import (
	"context"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/sandbox"
)

// Event types the edge publishes to watchers.
const (
	EventCreated    = "created"
	EventExited     = "exited"
	EventOOM        = "oom"
	EventTTLExpired = "ttl_expired"
	EventFailed     = "failed"
	EventDeleted    = "deleted"
	EventUpdated    = "updated"
	EventPaused     = "paused"
	EventResumed    = "resumed"
)

// Event is a state change of one sandbox.
type Event struct {
	Type   string
	Record Record // the sandbox as it is after the change
	Reason string
	Time   time.Time
}

// watcher is one Watch stream.
type watcher struct {
	caller Caller
	sel    map[string]string
	ch     chan Event
	// lost is set when the watcher fell behind and events were dropped;
	// its stream ends so the client re-lists.
	lost bool
}

// watchBuffer is how many events a slow watcher may lag before it is cut.
const watchBuffer = 1024

// bus fans events out to watchers.
type bus struct {
	mu sync.Mutex
	// guarded by mu
	watchers map[*watcher]struct{}
}

func (b *bus) subscribe(caller Caller, sel map[string]string) *watcher {
	w := &watcher{caller: caller, sel: sel, ch: make(chan Event, watchBuffer)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.watchers == nil {
		b.watchers = map[*watcher]struct{}{}
	}
	b.watchers[w] = struct{}{}
	return w
}

func (b *bus) unsubscribe(w *watcher) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.watchers, w)
}

func (b *bus) publish(ev Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for w := range b.watchers {
		if w.lost || !sees(w.caller, &ev.Record) || !matches(ev.Record.Labels, w.sel) {
			continue
		}
		select {
		case w.ch <- ev:
		default:
			w.lost = true
			close(w.ch)
		}
	}
}

// publish sends an event about r.
func (e *Edge) publish(typ string, r *Record, reason string) {
	if r == nil {
		return
	}
	e.events.publish(Event{Type: typ, Record: *r, Reason: reason, Time: time.Now().UTC()})
}

// Watch sends the events of the sandboxes caller sees that match sel until
// ctx ends or send fails. With initial, it first sends a created event for
// every such sandbox. keepalive is called when nothing happened for a while.
func (e *Edge) Watch(ctx context.Context, caller Caller, sel map[string]string, initial bool, send func(Event) error, keepalive func() error) error {
	w := e.events.subscribe(caller, sel)
	defer e.events.unsubscribe(w)
	if initial {
		recs, err := e.visible(caller, sel)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if err := send(Event{Type: EventCreated, Record: *r, Time: r.CreatedAt}); err != nil {
				return err
			}
		}
	}
	t := time.NewTicker(keepaliveInterval)
	defer t.Stop()
	for {
		select {
		case ev, ok := <-w.ch:
			if !ok {
				return errWatchBehind
			}
			if err := send(ev); err != nil {
				return err
			}
		case <-t.C:
			if err := keepalive(); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// eventLoop turns the backends' events (init exits, OOM kills) into record
// updates and published events.
func (e *Edge) eventLoop(name string, src sandbox.EventSource) {
	defer e.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-e.stop
		cancel()
	}()
	cursor := ""
	for ctx.Err() == nil {
		evs, next, err := src.Events(ctx, cursor)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			e.log.Warn("backend events", "backend", name, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		cursor = next
		for _, ev := range evs {
			e.handleBackendEvent(ev)
		}
	}
}

func (e *Edge) handleBackendEvent(ev sandbox.Event) {
	r, err := e.store.get(ev.Sandbox)
	if err != nil {
		return // deleted meanwhile, or not the edge's
	}
	switch ev.Type {
	case sandbox.EventExited:
		e.ended(r, StateExited, ev.Reason)
	case sandbox.EventFailed:
		e.ended(r, StateFailed, ev.Reason)
	case sandbox.EventOOM:
		e.publish(EventOOM, r, ev.Reason)
	}
}
