package keeper

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// newCgroups returns the manager of the sandboxes' cgroups with the host
// ceilings set on their parent: the host's task limit and memory minus
// what is kept for the host. The keeper itself, its exec zygote and its
// exec helpers (until they join a sandbox) stay outside the parent, in
// the cgroup dsec up was started in, so sandboxes at the ceiling cannot
// starve them: the host's reserve is theirs too.
func (c *containerDriver) newCgroups(layout cgroup.Layout) (*cgroup.Manager, error) {
	h, err := ceiling.ReadHost()
	if err != nil {
		return nil, err
	}
	s, err := ceiling.ForSandboxes(h, c.cfg.HostPidsReserve, c.cfg.HostMemoryReserve)
	if err != nil {
		return nil, err
	}
	c.ceiling = s
	cg, err := cgroup.New(cgroup.Config{Parent: c.cfg.CgroupParent, Layout: layout,
		Ceiling: cgroup.Resources{Pids: s.Pids, MemoryBytes: s.MemoryBytes}})
	if err != nil {
		return nil, err
	}
	switch err := cg.ApplyCeiling(); {
	case errdefs.Is(err, errdefs.ErrResourceExhausted):
		// Sandboxes adopted from before use more than a new, lower
		// memory ceiling: keep them and the pids ceiling, and say so.
		c.log.Error("the host memory ceiling is not set", "err", err)
	case err != nil:
		return nil, fmt.Errorf("host ceilings: %w", err)
	}
	c.log.Info("host ceilings of all sandboxes set", "cgroup", c.cfg.CgroupParent,
		"pids", s.Pids, "host_tasks", h.Tasks, "memory", s.MemoryBytes, "host_memory", h.MemoryBytes)
	if under, err := inCgroup("/proc/self/cgroup", c.cfg.CgroupParent); err == nil && under {
		c.log.Warn("the keeper runs inside the sandboxes' cgroup parent, so sandboxes at its ceiling can starve it: start dsec up outside it",
			"cgroup", c.cfg.CgroupParent)
	}
	return cg, nil
}

// checkCeiling refuses, with InvalidArgument and without a host path, a
// sandbox asking for more pids or memory than all sandboxes together may
// use: the kernel would refuse the limit (pids.max has a maximum) or
// never let it reach it. The edge refuses such requests first
// (internal/edge checkFits); this is for any other client of the keeper.
func (c *containerDriver) checkCeiling(r Resources) error {
	if most := c.ceiling.Pids; most > 0 && r.Pids > most {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"pids %d is more than all sandboxes of this node may run together, %d: ask for at most that (--pids)", r.Pids, most)
	}
	if most := c.ceiling.MemoryBytes; most > 0 && r.MemoryBytes > most {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"memory %s is more than all sandboxes of this node may use together, %s: ask for at most that (--memory)",
			ceiling.FormatBytes(r.MemoryBytes), ceiling.FormatBytes(most))
	}
	return nil
}

// inCgroup reports whether the process whose cgroup file (/proc/PID/cgroup)
// is file is in the top-level group parent, or below it, in a hierarchy
// that limits pids or memory (or in the cgroup2 one).
func inCgroup(file, parent string) (bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), ":", 3)
		if len(fields) != 3 {
			continue
		}
		ctrls := strings.Split(fields[1], ",")
		if fields[1] != "" && !slices.Contains(ctrls, "pids") && !slices.Contains(ctrls, "memory") {
			continue
		}
		p := fields[2]
		if p == "/"+parent || strings.HasPrefix(p, "/"+parent+"/") {
			return true, nil
		}
	}
	return false, sc.Err()
}
