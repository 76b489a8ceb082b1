package edge

import (
	"testing"
	"time"
)

// TestIdleExpiry checks Sandbox.idle_expires_at: the last use plus the idle
// TTL, unset while a stream is open, without an idle TTL, before any use
// is known, or while paused.
func TestIdleExpiry(t *testing.T) {
	last := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := &Edge{activity: map[string]time.Time{"a": last}, streams: map[string]int{}}
	r := &Record{ID: "a", State: StateRunning, IdleTTL: 15 * time.Minute}
	if got := e.idleExpiry(r); got == nil || !got.AsTime().Equal(last.Add(15*time.Minute)) {
		t.Errorf("idle expiry = %v, want %v", got, last.Add(15*time.Minute))
	}
	if got := e.idleExpiry(&Record{ID: "a", State: StatePaused, IdleTTL: 15 * time.Minute}); got != nil {
		t.Errorf("idle expiry while paused = %v, want none", got)
	}
	e.streams["a"] = 1
	if got := e.idleExpiry(r); got != nil {
		t.Errorf("idle expiry with a stream open = %v, want none", got)
	}
	if got := e.idleExpiry(&Record{ID: "a", State: StateRunning}); got != nil {
		t.Errorf("idle expiry without an idle TTL = %v, want none", got)
	}
	if got := e.idleExpiry(&Record{ID: "b", State: StateRunning, IdleTTL: time.Minute}); got != nil {
		t.Errorf("idle expiry of an unseen sandbox = %v, want none", got)
	}
}
