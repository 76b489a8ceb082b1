package doctor

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// atExit holds what the tests made for the whole test binary (the binaries
// they build), removed when it ends.
var atExit []func()

// The probes run on throwaway threads, start programs and make HTTP
// requests: none of it may outlive a check.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, f := range atExit {
		f()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}
