//go:build !linux

package doctor

import (
	"context"
	"runtime"
)

// Checks returns the checks of this platform: dsec runs sandboxes on Linux
// only, so elsewhere there is one, which fails.
func Checks() []Check {
	return []Check{{Name: "linux", Required: true, Run: func(context.Context, Env) Result {
		return failf("run dsec on a Linux node", "this is %s: dsec runs sandboxes on Linux only", runtime.GOOS)
	}}}
}
