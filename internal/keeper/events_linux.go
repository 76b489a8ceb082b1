package keeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// eventLog keeps the keeper's recent events for long-polling clients. A
// cursor is "<epoch>:<seq>"; the epoch changes with every keeper start so a
// client holding an old cursor gets everything still kept.
type eventLog struct {
	epoch string

	mu sync.Mutex
	// guarded by mu
	seq    uint64
	events []keptEvent
	wake   chan struct{} // closed and replaced on every add
}

type keptEvent struct {
	seq uint64
	ev  Event
}

// eventsKept bounds the log; a client further behind misses the oldest.
const eventsKept = 8192

func newEventLog() *eventLog {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return &eventLog{epoch: hex.EncodeToString(b), wake: make(chan struct{})}
}

func (l *eventLog) add(id string, t EventType, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	l.events = append(l.events, keptEvent{seq: l.seq, ev: Event{Sandbox: id, Type: t, Reason: reason, Time: time.Now().UTC()}})
	if len(l.events) > eventsKept {
		l.events = append([]keptEvent(nil), l.events[len(l.events)-eventsKept:]...)
	}
	close(l.wake)
	l.wake = make(chan struct{})
}

// since returns the events after cursor, waiting up to timeout for one.
func (l *eventLog) since(ctx context.Context, cursor string, timeout time.Duration) ([]Event, string) {
	var after uint64
	if epoch, seq, ok := strings.Cut(cursor, ":"); ok && epoch == l.epoch {
		after, _ = strconv.ParseUint(seq, 10, 64)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		l.mu.Lock()
		var out []Event
		for _, e := range l.events {
			if e.seq > after {
				out = append(out, e.ev)
			}
		}
		next := fmt.Sprintf("%s:%d", l.epoch, l.seq)
		wake := l.wake
		l.mu.Unlock()
		if len(out) > 0 {
			return out, next
		}
		select {
		case <-wake:
		case <-t.C:
			return nil, next
		case <-ctx.Done():
			return nil, next
		}
	}
}

// oomInterval is how often the keeper looks for OOM kills in sandboxes.
const oomInterval = 2 * time.Second

// watchOOM reports OOM kills in running sandboxes as events until ctx ends.
func (c *containerDriver) watchOOM(ctx context.Context) {
	t := time.NewTicker(oomInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		boxes := c.k.allBoxes()
		for _, b := range boxes {
			info := b.snapshot()
			if info.State != StateRunning {
				continue
			}
			// One file per sandbox: with thousands of sandboxes a full
			// Stats of each, every interval, costs the node a core.
			n, err := c.cg.OOMKills(info.slot())
			if err != nil {
				continue
			}
			if prev := b.oomSeen.Swap(n); n > prev {
				var limit int64
				if st, err := c.cg.Stats(info.slot()); err == nil {
					limit = st.MemoryLimit
				}
				c.k.events.add(info.ID, EventOOM, fmt.Sprintf("%d process(es) killed for memory (limit %d MiB)", n-prev, limit>>20))
			}
		}
	}
}
