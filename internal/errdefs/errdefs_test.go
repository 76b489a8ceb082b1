package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestKind(t *testing.T) {
	tests := []struct {
		err  error
		want error
	}{
		{nil, nil},
		{fmt.Errorf("sandbox x: %w", ErrNotFound), ErrNotFound},
		{Newf(ErrInvalidArgument, "bad size %q", "12Q"), ErrInvalidArgument},
		{errors.New("boom"), ErrInternal},
		{fmt.Errorf("exec: %w", context.DeadlineExceeded), ErrDeadlineExceeded},
		{RetryAfter(Newf(ErrResourceExhausted, "node full"), time.Second), ErrResourceExhausted},
	}
	for _, tt := range tests {
		if got := Kind(tt.err); got != tt.want {
			t.Errorf("Kind(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestRetryHint(t *testing.T) {
	err := fmt.Errorf("create: %w", RetryAfter(Newf(ErrResourceExhausted, "full"), 2*time.Second))
	d, ok := RetryHint(err)
	if !ok || d != 2*time.Second {
		t.Errorf("RetryHint(%v) = %v, %v, want 2s, true", err, d, ok)
	}
	if !Is(err, ErrResourceExhausted) {
		t.Errorf("Is(%v, ResourceExhausted) = false", err)
	}
	if _, ok := RetryHint(ErrNotFound); ok {
		t.Errorf("RetryHint(ErrNotFound) reported a hint")
	}
}
