package doctor

import (
	"context"
	"fmt"

	"github.com/dsecproject/dsec/internal/ceiling"
)

// checkCeilings reports the host ceilings dsec up sets by default on the
// sandboxes' cgroup parent (docs/ceilings.md).
func checkCeilings(context.Context, Env) Result {
	h, err := ceiling.ReadHost()
	if err != nil {
		return warnf("", "%v", err)
	}
	s, err := ceiling.ForSandboxes(h, ceiling.Reserve{}, ceiling.Reserve{})
	if err != nil {
		return warnf("raise kernel.pid_max, or give dsec up a smaller --host-pids-reserve or --host-memory-reserve", "%v", err)
	}
	return ceilingsResult(h, s)
}

// defaultSandboxPids is CONTRACT.md's default pids limit of a sandbox.
const defaultSandboxPids = 4096

func ceilingsResult(h ceiling.Host, s ceiling.Sandboxes) Result {
	what := fmt.Sprintf("all sandboxes together: at most %d of the host's %d tasks and %s of its %s (the host keeps %d tasks and %s)",
		s.Pids, h.Tasks, formatBytes(uint64(s.MemoryBytes)), formatBytes(uint64(h.MemoryBytes)),
		h.Tasks-s.Pids, formatBytes(uint64(h.MemoryBytes-s.MemoryBytes)))
	if s.Pids < 2*defaultSandboxPids {
		return warnf("sysctl -w kernel.pid_max=4194304 (and set it in /etc/sysctl.d/)",
			"%s: two fork-bombing sandboxes at the default pids limit of %d fill it", what, defaultSandboxPids)
	}
	return okf("%s", what)
}
