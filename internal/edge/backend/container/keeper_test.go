package container

import (
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
)

func TestPlan(t *testing.T) {
	base := keeper.Settings{Runtime: "/usr/bin/crun", CgroupParent: "dsec", IDBase: 1e9, IDSize: 65536, IDRanges: 16384,
		DiskQuota: "auto", WarmPool: 2, ChunkCache: "/s/chunks", ChunkSize: 1 << 20}
	with := func(f func(*keeper.Settings)) keeper.Settings {
		s := base
		f(&s)
		return s
	}
	v3 := keeper.Version{Protocol: keeper.Protocol, MinProtocol: keeper.MinProtocol, Version: "v1", Pid: 42, Settings: &base}
	v2 := keeper.Version{Protocol: 2, Version: "b56bd3e", Pid: 42}
	one := []keeper.SandboxInfo{{ID: "n-1", State: keeper.StateRunning, RunningExecs: 2}}
	lazy := []keeper.SandboxInfo{{ID: "n-1", State: keeper.StateRunning, Lazy: true}}
	idle := []keeper.SandboxInfo{{ID: "n-1", State: keeper.StateRunning}}
	tests := []struct {
		name    string
		v       keeper.Version
		want    keeper.Settings
		version string
		infos   []keeper.SandboxInfo
		action  keeperAction
		errHas  string // a refusal says this
	}{
		{"same", v3, base, "v1", one, useKeeper, ""},
		{"unknown edge version", v3, base, "", one, useKeeper, ""},
		{"warm pool changes live", v3, with(func(s *keeper.Settings) { s.WarmPool = 8 }), "v1", one, applyLive, ""},
		{"chunk size restarts with idle sandboxes", v3, with(func(s *keeper.Settings) { s.ChunkSize = 4 << 20 }), "v1", idle, replaceKeeper, ""},
		{"chunk size is refused while execs run", v3, with(func(s *keeper.Settings) { s.ChunkSize = 4 << 20 }), "v1", one, 0, "start dsec up with --chunk-size 1048576 as before, or again once they have ended"},
		{"chunk size restarts without", v3, with(func(s *keeper.Settings) { s.ChunkSize = 4 << 20 }), "v1", nil, replaceKeeper, ""},
		{"another version is replaced", v3, base, "v2", one, replaceKeeper, ""},
		{"protocol 2 is replaced", v2, base, "v2", one, replaceKeeper, ""},
		{"cgroup parent without sandboxes", v3, with(func(s *keeper.Settings) { s.CgroupParent = "other" }), "v1", nil, replaceKeeper, ""},
		{"cgroup parent with sandboxes", v3, with(func(s *keeper.Settings) { s.CgroupParent = "other" }), "v1", one, 0, "start dsec up with --cgroup-parent dsec as before"},
		{"fewer uid ranges with sandboxes", v3, with(func(s *keeper.Settings) { s.IDRanges = 10 }), "v1", one, 0, "--uid-ranges 16384"},
		{"lazy sandboxes keep a keeper of another version", v3, base, "v2", lazy, useKeeper, ""},
		{"lazy sandboxes keep a keeper of protocol 2", v2, base, "v2", lazy, useKeeper, ""},
		{"lazy sandboxes refuse a restart setting", v3, with(func(s *keeper.Settings) { s.ChunkSize = 4 << 20 }), "v1", lazy, 0, "lazy layers"},
		{"lazy sandboxes and a live change", v3, with(func(s *keeper.Settings) { s.WarmPool = 8 }), "v2", lazy, applyLive, ""},
		{"lazy sandboxes keep a keeper of the same version", v3, base, "v1", lazy, useKeeper, ""},
		{"protocol 2 with a blob source and sandboxes", v2, with(func(s *keeper.Settings) { s.BlobSource = "dir:/b" }), "v2", one, useKeeper, ""},
		{"protocol 2 with a blob source, sandboxes and a restart setting", v2, with(func(s *keeper.Settings) { s.BlobSource = "dir:/b"; s.ChunkSize = 4 << 20 }), "v2", one, 0, "lazy layers"},
		{"a newer keeper that serves us", keeper.Version{Protocol: keeper.Protocol + 1, MinProtocol: keeper.Protocol, Version: "v9", Settings: &base}, base, "v1", one, useKeeper, ""},
		{"a newer keeper that does not", keeper.Version{Protocol: keeper.Protocol + 1, MinProtocol: keeper.Protocol + 1, Version: "v9", Settings: &base}, base, "v1", one, 0, "run dsec v9 or later"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			have := base
			if tt.v.Settings != nil {
				have = *tt.v.Settings
			}
			if strings.HasPrefix(tt.name, "protocol 2 with a blob source") {
				have = tt.want
				have.BlobSource = "dir:/b"
				have.ChunkSize = base.ChunkSize
			}
			p, err := plan(tt.v, have, tt.want, tt.version, tt.infos, "/s")
			if tt.errHas != "" {
				if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("plan() = %+v, %v; want FailedPrecondition saying %q", p, err, tt.errHas)
				}
				return
			}
			if err != nil || p.action != tt.action {
				t.Fatalf("plan() = %+v, %v; want action %d", p, err, tt.action)
			}
			if p.action == replaceKeeper && p.running != sumRunning(tt.infos) {
				t.Errorf("plan().running = %d, want %d (the execs lost)", p.running, sumRunning(tt.infos))
			}
		})
	}
}

func sumRunning(infos []keeper.SandboxInfo) int {
	n := 0
	for _, in := range infos {
		n += in.RunningExecs
	}
	return n
}
