package lazyfs_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a serving goroutine or a
// watchdog behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
