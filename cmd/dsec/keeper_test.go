//go:build !dsec_client

package main

import (
	"testing"

	"github.com/dsecproject/dsec/internal/keeper"
)

// TestKeeperFlags: every flag keeper.Settings.Args writes (what an edge
// starts its keeper with) is a flag of `dsec keeper`, with the value
// given: a flag renamed on one side only would stop every keeper start.
func TestKeeperFlags(t *testing.T) {
	s := keeper.Settings{
		Runtime: "/usr/bin/runc", CgroupParent: "dsec-x", IDBase: 2_000_000_000, IDSize: 65536, IDRanges: 64,
		HostPidsReserve: "50%,4096", HostMemoryReserve: "2G", DiskQuota: "image", WarmPool: -1,
		BlobSource: "dir:/srv/blobs", ChunkCache: "/srv/chunks", ChunkCacheSize: 1 << 30, ChunkSize: 4 << 20,
	}
	cmd := newKeeperCmd(&globalFlags{})
	if err := cmd.ParseFlags(s.Args()); err != nil {
		t.Fatalf("dsec keeper %q: %v", s.Args(), err)
	}
	args := s.Args()
	for i := 0; i < len(args); i += 2 {
		name, want := args[i][2:], args[i+1]
		f := cmd.Flags().Lookup(name)
		if f == nil {
			t.Errorf("dsec keeper has no --%s", name)
			continue
		}
		if got := f.Value.String(); got != want {
			t.Errorf("dsec keeper --%s %s reads %q", name, want, got)
		}
	}
}
