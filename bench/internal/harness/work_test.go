//go:build linux

package harness

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestForEach(t *testing.T) {
	var running, most, calls atomic.Int64
	err := ForEach(context.Background(), 40, 4, func(ctx context.Context, i int) error {
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		calls.Add(1)
		time.Sleep(2 * time.Millisecond)
		running.Add(-1)
		return nil
	})
	if err != nil || calls.Load() != 40 || most.Load() > 4 || most.Load() < 2 {
		t.Errorf("ForEach(40, conc 4) = %v, %d calls, at most %d at once; want nil, 40, 2..4", err, calls.Load(), most.Load())
	}

	boom := errors.New("boom")
	calls.Store(0)
	err = ForEach(context.Background(), 1000, 2, func(ctx context.Context, i int) error {
		calls.Add(1)
		if i == 3 {
			return boom
		}
		time.Sleep(time.Millisecond)
		return ctx.Err()
	})
	if !errors.Is(err, boom) || calls.Load() > 100 {
		t.Errorf("forEach with a failing call = %v after %d calls, want boom, and the rest not started", err, calls.Load())
	}
}
