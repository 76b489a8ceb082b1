//go:build linux

package harness

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	RunnerMain() // the runners these tests start are this test binary
	goleak.VerifyTestMain(m)
}
