package edge

import (
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// copyFixture copies testdata/NAME into a new temp dir and returns the
// copy's path: fixtures are never opened in place.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), filepath.Base(name))
	copyFixtureTo(t, name, path)
	return path
}

// copyFixtureTo copies testdata/NAME to path.
func copyFixtureTo(t *testing.T, name, path string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// format1Record is what a test expects of one record of the format 1
// fixture.
type format1Record struct {
	ID, State, Reason string
	Memory            int64
	Labels            map[string]string
	Env               map[string]string
	Workdir           string
}

// format1Want are the records of testdata/format1/edge.db (see its
// README.md), sorted by ID.
var format1Want = []format1Record{
	{ID: "golden-6c6uaxuap3lg", State: "running", Memory: 64 << 20, Labels: map[string]string{"fixture": "golden", "state": "running"}, Env: map[string]string{"GREETING": "hi"}, Workdir: "/tmp"},
	{ID: "golden-7naxh7jqdqkw", State: "failed", Reason: "lost: the node keeper no longer has this sandbox", Memory: 128 << 20, Labels: map[string]string{"state": "failed"}},
	{ID: "golden-dqolv2tgiwol", State: "deleting", Memory: 160 << 20, Labels: map[string]string{"state": "deleting"}},
	{ID: "golden-lskfo7xvcoqs", State: "exited", Reason: "init killed by signal 9 (killed)", Memory: 96 << 20, Labels: map[string]string{"state": "exited"}},
	{ID: "golden-zyhp347egxut", State: "running", Memory: 64 << 20, Labels: map[string]string{"idem": "yes", "state": "running"}},
}

// TestFormat1Store reads a node state written by the dsec before issue 11:
// every record, and the idempotency key, as that dsec wrote them.
func TestFormat1Store(t *testing.T) {
	s, err := openStore(copyFixture(t, "format1/edge.db"), 0)
	if err != nil {
		t.Fatalf("openStore(format 1) = %v", err)
	}
	defer s.close()
	recs, err := s.list()
	if err != nil {
		t.Fatalf("list = %v", err)
	}
	var got []format1Record
	for _, r := range recs {
		got = append(got, format1Record{
			ID: r.ID, State: string(r.State), Reason: r.Reason, Memory: r.Resources.MemoryBytes,
			Labels: r.Labels, Env: r.Env, Workdir: r.Workdir,
		})
		if r.Image != "busybox:latest" || len(r.Layers) != 1 || r.Backend != "container" || r.Project != "default" ||
			r.Resources.DiskBytes != 10<<30 || r.IdleTTL != 15*time.Minute || r.ExpiresAt.Sub(r.CreatedAt) != time.Hour {
			t.Errorf("record %s = %+v, want busybox:latest on container in project default, 10G disk, TTLs 1h/15m", r.ID, r)
		}
	}
	sort.Slice(got, func(i, j int) bool { return got[i].ID < got[j].ID })
	if diff := cmp.Diff(format1Want, got); diff != "" {
		t.Errorf("records of format 1 (-want +got):\n%s", diff)
	}
	ent, err := s.getIdem(idemKey(Caller{KeyID: "zqmuj5gm"}, "golden-key-1"))
	if err != nil || ent == nil || ent.SandboxID != "golden-zyhp347egxut" || ent.Snapshot.ID != ent.SandboxID {
		t.Errorf("idempotency key golden-key-1 = %+v, %v, want sandbox golden-zyhp347egxut", ent, err)
	}
}
