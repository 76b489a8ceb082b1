package server

import (
	"errors"

	"github.com/dsecproject/dsec/internal/ceiling"
)

// sandboxCeilings are what all sandboxes together may use: the host's
// memory and tasks minus cfg.HostMemoryReserve and cfg.HostPidsReserve,
// the keeper's ceilings on the sandboxes' cgroup parent. The edge admits
// memory limits against the memory (times --memory-overcommit), so
// admission and the kernel's ceiling count from the same figure, and
// refuses a sandbox asking for more of either than all may have. Zero
// (the edge's defaults, from the host) where the host cannot be read.
func sandboxCeilings(cfg Config) (ceiling.Sandboxes, error) {
	h, err := ceiling.ReadHost()
	if errors.Is(err, errors.ErrUnsupported) {
		return ceiling.Sandboxes{}, nil
	}
	if err != nil {
		return ceiling.Sandboxes{}, err
	}
	return ceiling.ForSandboxes(h, cfg.HostPidsReserve, cfg.HostMemoryReserve)
}
