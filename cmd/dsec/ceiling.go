//go:build !dsec_client

package main

import (
	"github.com/spf13/pflag"

	"github.com/dsecproject/dsec/internal/ceiling"
)

// ceilingFlags are the host ceilings' flags of dsec up (all four) and of
// the keeper (the host reserves).
type ceilingFlags struct {
	pids, memory, disk string
	diskOvercommit     float64
}

const reserveSyntax = "a percentage of the host's total (25%), an amount, or both meaning the larger (25%,4096)"

// registerHost registers --host-pids-reserve and --host-memory-reserve.
func (c *ceilingFlags) registerHost(f *pflag.FlagSet) {
	f.StringVar(&c.pids, "host-pids-reserve", "auto",
		"tasks (processes and threads) kept for the host out of every sandbox's reach: the sandboxes' cgroup parent gets pids.max = the host's pid_max minus this, so sandboxes fork-bombing together cannot take the host's last pids; "+
			reserveSyntax+"; auto is the larger of 25% and 4096")
	f.StringVar(&c.memory, "host-memory-reserve", "auto",
		"memory kept for the host out of every sandbox's reach: the sandboxes' cgroup parent gets a memory limit of the host's memory minus this (and --memory-overcommit counts from it); "+
			"a percentage (10%), a size (2G), or both meaning the larger (10%,1G); auto is the larger of 10% and 1G")
}

// registerDisk registers --disk-reserve and --disk-overcommit.
func (c *ceilingFlags) registerDisk(f *pflag.FlagSet) {
	f.StringVar(&c.disk, "disk-reserve", "auto",
		"free space kept on the state dir's file system: a sandbox whose writable disk (--disk of dsec run) and exec output quota (256M) do not fit the free space above it is refused; "+
			"a percentage of the file system (5%), a size (2G), or both meaning the larger (5%,2G); auto is the larger of 5% and 2G")
	f.Float64Var(&c.diskOvercommit, "disk-overcommit", 32,
		"writable disks and exec output quotas of all sandboxes may add up to this many times the free space above --disk-reserve (disks are sparse; one sandbox's must fit that space itself)")
}

// parseHost reads the host reserves; reserves left at auto are zero (the
// defaults).
func (c *ceilingFlags) parseHost() (pids, memory ceiling.Reserve, err error) {
	if pids, err = ceiling.ParseReserve(c.pids, false); err != nil {
		return pids, memory, usageErrorf("--host-pids-reserve: %v", err)
	}
	if memory, err = ceiling.ParseReserve(c.memory, true); err != nil {
		return pids, memory, usageErrorf("--host-memory-reserve: %v", err)
	}
	return pids, memory, nil
}

// parseDisk reads the disk reserve (zero at auto) and checks the
// overcommit.
func (c *ceilingFlags) parseDisk() (disk ceiling.Reserve, err error) {
	if disk, err = ceiling.ParseReserve(c.disk, true); err != nil {
		return disk, usageErrorf("--disk-reserve: %v", err)
	}
	if c.diskOvercommit < 1 {
		return disk, usageErrorf("--disk-overcommit %v: want 1 or more", c.diskOvercommit)
	}
	return disk, nil
}
