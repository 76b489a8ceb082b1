package edge

import (
	"testing"

	"go.uber.org/goleak"
)

// The edge starts goroutines (reaper, event loops, watchers): none may
// outlive Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
