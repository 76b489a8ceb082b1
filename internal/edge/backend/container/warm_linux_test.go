package container

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

// TestWarmSandboxes creates sandboxes of one shape: after the first, the
// keeper keeps some started, and the next create claims one, which then
// behaves as its own sandbox (hostname, exec, files, delete).
func TestWarmSandboxes(t *testing.T) {
	n := newNode(t)
	b := n.open(t)
	defer b.Close()
	ctx := context.Background()
	spec := func(id string) sandbox.Spec {
		return sandbox.Spec{ID: id, Layers: n.layers, Resources: sandbox.Resources{MemoryBytes: 64 << 20, CPUs: 1, Pids: 64, DiskBytes: 64 << 20}}
	}
	warmDirs := func() []string {
		m, _ := filepath.Glob(filepath.Join(n.stateDir, "sandboxes", "warm_*"))
		return m
	}
	if _, err := b.Create(ctx, spec("cold")); err != nil {
		t.Fatalf("Create = %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(warmDirs()) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := len(warmDirs()); got < 2 {
		t.Fatalf("warm sandboxes after a create = %d, want 2", got)
	}
	// Wait until they are started (their record is written last).
	for _, d := range warmDirs() {
		for {
			if _, err := os.Stat(filepath.Join(d, "keeper.json")); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Another shape is not served from this one's pool.
	other := spec("other")
	other.Resources.MemoryBytes = 32 << 20
	if _, err := b.Create(ctx, other); err != nil {
		t.Fatalf("Create(other shape) = %v", err)
	}
	if info, err := b.Keeper().Status(ctx, "other"); err != nil || info.Slot != "" {
		t.Errorf("Status(other) = %+v, %v: want a sandbox started for it", info, err)
	}

	if _, err := b.Create(ctx, spec("claimed")); err != nil {
		t.Fatalf("Create = %v", err)
	}
	info, err := b.Keeper().Status(ctx, "claimed")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(info.Slot, "warm_") {
		t.Fatalf("Status(claimed).Slot = %q, want a warm sandbox", info.Slot)
	}
	r, err := sandboxtest.ExecErr(ctx, b, "claimed", sandbox.ExecSpec{Argv: []string{"sh", "-c", "hostname; echo hi > /f; cat /f"}, Env: []string{"PATH=/bin"}})
	if err != nil || r.Code != 0 {
		t.Fatalf("exec in a claimed sandbox = %+v, %v", r, err)
	}
	if want := "claimed\nhi\n"; r.Stdout != want {
		t.Errorf("claimed sandbox says %q, want %q", r.Stdout, want)
	}
	if st, err := b.Stats(ctx, "claimed"); err != nil || st.MemoryLimit != 64<<20 || st.Pids < 1 {
		t.Errorf("Stats(claimed) = %+v, %v: want its memory limit and its processes", st, err)
	}
	if _, err := os.Stat(filepath.Join(n.stateDir, "sandboxes", "claimed", "keeper.json")); err != nil {
		t.Errorf("claimed sandbox's directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(n.stateDir, "sandboxes", info.Slot)); !os.IsNotExist(err) {
		t.Errorf("warm directory %s after the claim: %v, want it renamed", info.Slot, err)
	}
	for _, id := range []string{"cold", "other", "claimed"} {
		if err := b.Delete(ctx, id); err != nil {
			t.Errorf("Delete(%s) = %v", id, err)
		}
	}
	for _, h := range hierarchies() {
		if _, err := os.Stat(filepath.Join(h, n.cgroupParent, info.Slot)); !os.IsNotExist(err) {
			t.Errorf("cgroup %s of a deleted claimed sandbox: %v, want it gone", filepath.Join(h, info.Slot), err)
		}
	}
}
