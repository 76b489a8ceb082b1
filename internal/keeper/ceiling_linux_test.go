package keeper

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestInCgroup(t *testing.T) {
	tests := []struct {
		name, content string
		want          bool
	}{
		{"hybrid, outside", "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/x\n0::/\n", false},
		{"v1 pids inside", "8:pids:/dsec/sb\n4:memory:/\n", true},
		{"v1 memory is the parent", "8:pids:/\n4:memory:/dsec\n", true},
		{"unified inside", "0::/dsec/sb\n", true},
		{"a sibling with the same prefix", "0::/dsec-other/x\n8:pids:/dsecx\n", false},
		{"a controller that limits nothing here", "3:cpuset:/dsec\n0::/\n", false},
	}
	for _, tt := range tests {
		f := filepath.Join(t.TempDir(), "cgroup")
		if err := os.WriteFile(f, []byte(tt.content), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := inCgroup(f, "dsec")
		if err != nil || got != tt.want {
			t.Errorf("%s: inCgroup(%q, dsec) = %v, %v; want %v", tt.name, tt.content, got, err, tt.want)
		}
	}
}

// TestStartAboveTheCeiling: a sandbox asking for more pids or memory than
// all sandboxes together may have is InvalidArgument before anything is
// made (the kernel refuses such a pids.max with EINVAL, which named the
// host cgroup path), and the shape is not kept warm.
func TestStartAboveTheCeiling(t *testing.T) {
	c := &containerDriver{ceiling: ceiling.Sandboxes{Pids: 24576, MemoryBytes: 20 << 30}}
	c.warm = newWarmPoolOf(discardLogger(), 2)
	for _, tt := range []struct {
		r    Resources
		want string
	}{
		{Resources{Pids: 1e9, MemoryBytes: 1 << 30}, "pids 1000000000 is more than all sandboxes of this node may run together, 24576"},
		{Resources{Pids: 64, MemoryBytes: 1 << 40}, "memory 1 TiB is more than all sandboxes of this node may use together, 20 GiB"},
	} {
		err := c.Start(t.Context(), nil, CreateRequest{ID: "n-x", Resources: tt.r})
		if !errdefs.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Start(%+v) = %v, want InvalidArgument saying %q", tt.r, err, tt.want)
		}
	}
	if n := len(c.warm.shapes); n != 0 {
		t.Errorf("%d shapes kept warm after refused starts, want none", n)
	}
}
