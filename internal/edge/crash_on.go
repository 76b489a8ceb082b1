//go:build dsec_crashhook

package edge

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// CrashEnv names the crash point at which a test build kills the process
// with SIGKILL: DSEC_CRASH_AT=edge:create:recorded, say. Only binaries
// built with -tags dsec_crashhook read it.
const CrashEnv = "DSEC_CRASH_AT"

// CrashPoints are the edge's crash points, in the order a create and a
// delete pass them.
var CrashPoints = []string{"create:recorded", "create:made", "create:running", "delete:marked", "delete:removed"}

// PauseCrashPoints are the edge's crash points of a pause and a resume, in
// the order they pass them (pause.go).
var PauseCrashPoints = []string{"pause:marked", "pause:stopped", "pause:paused", "resume:marked", "resume:started", "resume:running"}

var crashAt = os.Getenv(CrashEnv)

func crashPoint(name string) {
	if crashAt == "" || !strings.EqualFold(crashAt, "edge:"+name) {
		return
	}
	fmt.Fprintf(os.Stderr, "dsec: crash point edge:%s: killing myself (%s)\n", name, CrashEnv)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
