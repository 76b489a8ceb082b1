//go:build linux

package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/bench/internal/harness"
)

func TestLeftovers(t *testing.T) {
	start := harness.Footprint{Cgroups: 0, KeeperMounts: 3, StateLoopDevices: 8, SandboxDirs: 0}
	tests := []struct {
		name string
		now  harness.Footprint
		want []string
	}{
		{"clean", start, nil},
		{"fewer is clean", harness.Footprint{KeeperMounts: 2, StateLoopDevices: 4}, nil},
		{"left", harness.Footprint{Cgroups: 10, CgroupProcesses: 1, KeeperMounts: 5, StateLoopDevices: 8, SandboxDirs: 1}, []string{
			"cgroups under the parent: 10, was 0",
			"processes in sandbox cgroups: 1, was 0",
			"mounts under the state dir (keeper): 5, was 3",
			"sandbox directories: 1, was 0",
		}},
	}
	for _, tt := range tests {
		if got := leftovers(start, tt.now); !cmp.Equal(got, tt.want) {
			t.Errorf("%s: leftovers(%+v) = %q, want %q", tt.name, tt.now, got, tt.want)
		}
	}
	if got := stoppedLeftovers(harness.Footprint{Processes: 500, LoopDevices: 3}); len(got) != 0 {
		t.Errorf("stoppedLeftovers(a host with its own processes and loops) = %q, want none", got)
	}
	if got := stoppedLeftovers(harness.Footprint{HostMounts: 1, StateLoopDevices: 2}); len(got) != 2 {
		t.Errorf("stoppedLeftovers(a mount and 2 loops left) = %q, want 2 lines", got)
	}
}
