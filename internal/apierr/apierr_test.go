package apierr

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestRoundTrip(t *testing.T) {
	for _, k := range errdefs.Kinds {
		err := fmt.Errorf("sandbox x: %w", k)
		wire := ToConnect(err)
		var ce *connect.Error
		if !errors.As(wire, &ce) {
			t.Fatalf("ToConnect(%v) = %T, want *connect.Error", err, wire)
		}
		back := FromConnect(wire)
		if got := errdefs.Kind(back); got != k {
			t.Errorf("FromConnect(ToConnect(%v)) kind = %v, want %v", err, got, k)
		}
		if k == errdefs.ErrInternal {
			if strings.Contains(back.Error(), "sandbox x") {
				t.Errorf("FromConnect(ToConnect(%v)) = %q, want the text withheld", err, back.Error())
			}
		} else if back.Error() != err.Error() {
			t.Errorf("message = %q, want %q", back.Error(), err.Error())
		}
	}
}

func TestRetryHint(t *testing.T) {
	err := errdefs.RetryAfter(errdefs.Newf(errdefs.ErrResourceExhausted, "node full"), 1500*time.Millisecond)
	if got := RetryDelay(ToConnect(err)); got != 1500*time.Millisecond {
		t.Errorf("RetryDelay = %v, want 1.5s", got)
	}
}

func TestTableComplete(t *testing.T) {
	seen := map[connect.Code]bool{}
	for _, e := range table {
		if seen[e.code] {
			t.Errorf("code %v mapped twice", e.code)
		}
		seen[e.code] = true
	}
	if len(table) != len(errdefs.Kinds) {
		t.Errorf("table has %d kinds, errdefs has %d", len(table), len(errdefs.Kinds))
	}
}

// TestNoEcho checks that an error quoting a huge request value reaches the
// wire short, whether it is a kind-wrapped error or already a connect one.
func TestNoEcho(t *testing.T) {
	huge := strings.Repeat("é", 10<<20)
	for _, err := range []error{
		errdefs.Newf(errdefs.ErrInvalidArgument, "invalid image reference %q", huge),
		connect.NewError(connect.CodeInvalidArgument, errors.New(huge)),
	} {
		var ce *connect.Error
		if !errors.As(ToConnect(err), &ce) {
			t.Fatalf("ToConnect = %T, want *connect.Error", ToConnect(err))
		}
		if n := len(ce.Message()); n > MaxMessageBytes {
			t.Errorf("ToConnect(%d-byte message) = %d bytes, want at most %d", len(err.Error()), n, MaxMessageBytes)
		}
		if !utf8.ValidString(ce.Message()) {
			t.Errorf("clipped message is not valid UTF-8")
		}
		if ce.Code() != connect.CodeInvalidArgument {
			t.Errorf("code = %v, want InvalidArgument", ce.Code())
		}
	}
}
