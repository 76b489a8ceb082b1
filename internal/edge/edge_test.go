package edge

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

func TestValidateLabels(t *testing.T) {
	good := map[string]string{"job": "eval-3", "example.com/team": "rl_a", "empty": ""}
	if err := ValidateLabels(good); err != nil {
		t.Errorf("ValidateLabels(%v) = %v", good, err)
	}
	for _, bad := range []map[string]string{
		{"bad key": "x"}, {"k": "bad value"}, {"": "x"}, {"k": strings.Repeat("v", 64)},
		{"-k": "x"}, {"k": "-v"},
	} {
		if err := ValidateLabels(bad); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ValidateLabels(%v) = %v, want InvalidArgument", bad, err)
		}
	}
}

func TestMatches(t *testing.T) {
	labels := map[string]string{"a": "1", "b": "2"}
	tests := []struct {
		sel  map[string]string
		want bool
	}{
		{nil, true},
		{map[string]string{"a": "1"}, true},
		{map[string]string{"a": "1", "b": "2"}, true},
		{map[string]string{"a": "2"}, false},
		{map[string]string{"c": ""}, false},
	}
	for _, tt := range tests {
		if got := matches(labels, tt.sel); got != tt.want {
			t.Errorf("matches(%v, %v) = %v, want %v", labels, tt.sel, got, tt.want)
		}
	}
}

func TestStoreRoundTripAndFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.db")
	s, err := openStore(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{ID: "n-aaaaaaaaaaaa", Image: "busybox:latest", State: StateRunning, CreatedAt: time.Now().UTC()}
	if err := s.insert(r); err != nil {
		t.Fatalf("insert = %v", err)
	}
	if err := s.insert(r); !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second insert = %v, want AlreadyExists", err)
	}
	got, err := s.get(r.ID)
	if err != nil || got.Image != r.Image {
		t.Errorf("get = %+v, %v", got, err)
	}
	if _, err := s.get("n-bbbbbbbbbbbb"); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get(missing) = %v, want NotFound", err)
	}
	s.close()

	// A file written by a newer dsec is refused, not misread.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("format"), []byte("99"))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := openStore(path, 0); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("openStore(format 99) = %v, want FailedPrecondition", err)
	}
}

func TestAdmission(t *testing.T) {
	e := &Edge{cfg: Config{Node: "n", MemoryBytes: 1 << 30, MemoryOvercommit: 2, MemoryReserve: 1}}
	var releases []func()
	for range 4 {
		rel, err := e.admit(512 << 20)
		if err != nil {
			t.Fatalf("admit within 2× of 1 GiB = %v", err)
		}
		releases = append(releases, rel)
	}
	_, err := e.admit(1)
	if !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("admit beyond the overcommit = %v, want ResourceExhausted", err)
	}
	if d, ok := errdefs.RetryHint(err); !ok || d <= 0 {
		t.Errorf("refusal has no retry hint")
	}
	releases[0]()
	releases[0]() // idempotent
	if _, err := e.admit(512 << 20); err != nil {
		t.Errorf("admit after a release = %v", err)
	}
}

func TestExecEnv(t *testing.T) {
	r := &Record{ID: "n-aaaaaaaaaaaa", ImageEnv: []string{"PATH=/opt/bin:/bin", "LANG=C"}, Env: map[string]string{"LANG": "C.UTF-8", "A": "1"}}
	got := execEnv(r, identity{Home: "/home/agent", Name: "agent"}, map[string]string{"A": "2"})
	want := []string{"A=2", "HOME=/home/agent", "HOSTNAME=n-aaaaaaaaaaaa", "LANG=C.UTF-8", "PATH=/opt/bin:/bin", "USER=agent"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("execEnv = %v, want %v", got, want)
	}
}

// FuzzCreateParams feeds arbitrary create requests to validation: it must
// never panic, and every refusal is InvalidArgument.
func FuzzCreateParams(f *testing.F) {
	f.Add("busybox", "job", "eval", "A", "1", "agent", int64(512<<20), 1.5, int64(100), int64(3600))
	f.Add("", "bad key!", "", "1A", "x\x00", "a:b:c", int64(-1), -0.5, int64(-3), int64(-1))
	f.Fuzz(func(t *testing.T, image, lk, lv, ek, ev, user string, mem int64, cpus float64, pids, ttl int64) {
		e := &Edge{cfg: Config{Node: "n", CPUs: 2, DefaultBackend: "container", Defaults: sandbox.ContractDefaults}}
		p := CreateParams{
			Image: image, Labels: map[string]string{lk: lv}, Env: map[string]string{ek: ev}, User: user,
			Resources: sandbox.Resources{MemoryBytes: mem, CPUs: cpus, Pids: pids},
			TTL:       time.Duration(ttl) * time.Second,
		}
		err := e.normalize(&p)
		if err != nil && !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("normalize = %v, want nil or InvalidArgument", err)
		}
		if err == nil {
			if p.Resources.MemoryBytes <= 0 || p.Resources.CPUs <= 0 || p.Resources.CPUs > 2 || p.Resources.Pids <= 0 || p.TTL <= 0 {
				t.Fatalf("normalize accepted %+v", p)
			}
		}
	})
}
