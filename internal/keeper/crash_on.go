//go:build dsec_crashhook

package keeper

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// CrashEnv names the crash point at which a test build kills the keeper
// with SIGKILL: DSEC_CRASH_AT=keeper:create:layers, say (the edge's
// points are edge:...). Only binaries built with -tags dsec_crashhook read
// it; the keeper inherits it from the dsec that starts it.
const CrashEnv = "DSEC_CRASH_AT"

// CrashPoints are the keeper's crash points of a create and a delete, in
// the order they are passed: the end of each step (phases.mark).
var CrashPoints = []string{
	"create:dirs", "create:disk", "create:userns", "create:layers", "create:overlay",
	"create:cgroup", "create:bundle", "create:runtime", "create:record",
	"delete:kill", "delete:ended", "delete:runtime", "delete:unmount", "delete:disk", "delete:cgroup", "delete:dir",
}

var crashAt = os.Getenv(CrashEnv)

func crashPoint(name string) {
	if crashAt == "" || !strings.EqualFold(crashAt, "keeper:"+name) {
		return
	}
	fmt.Fprintf(os.Stderr, "dsec keeper: crash point keeper:%s: killing myself (%s)\n", name, CrashEnv)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
