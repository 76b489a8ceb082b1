package edge

import (
	"testing"

	"github.com/dsecproject/dsec/internal/project"
)

func TestCallerSees(t *testing.T) {
	pool := &Record{ID: "n-pool", Project: project.SandboxFusion}
	tenant := &Record{ID: "n-tenant", Project: "team-a"}
	def := &Record{ID: "n-default", Project: project.Default}
	for _, tt := range []struct {
		name   string
		caller Caller
		r      *Record
		want   bool
	}{
		{"own project", Caller{Project: "team-a"}, tenant, true},
		{"other project", Caller{Project: "team-b"}, tenant, false},
		{"default key, default sandbox", Caller{Project: project.Default}, def, true},
		{"default key, pool sandbox", Caller{Project: project.Default}, pool, false},
		{"admin, tenant sandbox", Caller{Project: project.Default, Admin: true}, tenant, true},
		{"admin, pool sandbox", Caller{Project: project.Default, Admin: true}, pool, false},
		{"pool's service key, pool sandbox", Caller{Project: project.SandboxFusion}, pool, true},
		{"pool's service key, tenant sandbox", Caller{Project: project.SandboxFusion}, tenant, false},
	} {
		if got := sees(tt.caller, tt.r); got != tt.want {
			t.Errorf("%s: %+v sees %s (project %s) = %v, want %v", tt.name, tt.caller, tt.r.ID, tt.r.Project, got, tt.want)
		}
	}
}
