package server

import (
	"errors"

	"github.com/dsecproject/dsec/internal/ceiling"
)

// sandboxMemory is the memory all sandboxes together may use: the host's
// memory minus cfg.HostMemoryReserve, the keeper's memory ceiling on the
// sandboxes' cgroup parent. The edge admits memory limits against it
// (times --memory-overcommit), so admission and the kernel's ceiling
// count from the same figure. 0 (the edge's default, MemTotal) where the
// host cannot be read.
func sandboxMemory(cfg Config) (int64, error) {
	h, err := ceiling.ReadHost()
	if errors.Is(err, errors.ErrUnsupported) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	s, err := ceiling.ForSandboxes(h, cfg.HostPidsReserve, cfg.HostMemoryReserve)
	if err != nil {
		return 0, err
	}
	return s.MemoryBytes, nil
}
