package keeper

import (
	"os"
	"path/filepath"
	"testing"
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
