package dsec

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"
)

// maxBackoff bounds the wait between attempts without a server hint.
const maxBackoff = 5 * time.Second

// retryWait says whether a create that failed with err on its attempt-th
// try (1 for the first) is tried again, and after how long. keyed says the
// request has an idempotency key, so that a call whose answer was lost
// (Unavailable) cannot make a second sandbox.
func (c *Client) retryWait(ctx context.Context, err error, attempt int, keyed bool) (time.Duration, bool) {
	if attempt > c.createRetries {
		return 0, false
	}
	var de *Error
	if !errors.As(err, &de) {
		return 0, false
	}
	var wait time.Duration
	switch {
	case de.Kind == ErrResourceExhausted && de.RetryAfter > 0:
		// Up to a fifth more, so that refused callers do not come back
		// all at once.
		wait = de.RetryAfter + rand.N(de.RetryAfter/5+1)
	case de.Kind == ErrResourceExhausted, de.Kind == ErrUnavailable && keyed:
		wait = backoff(attempt)
	default:
		return 0, false
	}
	if dl, ok := ctx.Deadline(); ok && time.Now().Add(wait).After(dl) {
		return 0, false
	}
	return wait, true
}

// backoff is the exponential wait before retry number attempt (1 for the
// first): about 250ms, 500ms, 1s, … up to maxBackoff, with jitter.
func backoff(attempt int) time.Duration {
	d := maxBackoff
	if attempt < 6 {
		d = min(maxBackoff, 250*time.Millisecond<<(attempt-1))
	}
	return d/2 + rand.N(d/2+1)
}

// retry runs call until it succeeds or retryWait says to stop, logging
// each retry at Debug, and returns the last error.
func (c *Client) retry(ctx context.Context, what string, keyed bool, call func() error) error {
	for attempt := 1; ; attempt++ {
		err := call()
		if err == nil {
			return nil
		}
		wait, ok := c.retryWait(ctx, err, attempt, keyed)
		if !ok {
			return err
		}
		c.log().DebugContext(ctx, "dsec: "+what+" refused; retrying",
			"attempt", attempt, "of", c.createRetries, "wait", wait, "error", err.Error())
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			// The server's error says more than the context's.
			t.Stop()
			return err
		}
	}
}

func (c *Client) log() *slog.Logger {
	if c.logger != nil {
		return c.logger
	}
	return slog.Default()
}
