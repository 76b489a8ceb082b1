package keeper

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSealedEnv(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{"no PATH", []string{"HOME=/root"}, []string{"HOME=/root", "PATH=/.dsec/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
		{"PATH kept after the tools", []string{"PATH=/opt/bin:/bin", "A=1"}, []string{"A=1", "PATH=/.dsec/bin:/opt/bin:/bin"}},
		{"LD_ dropped", []string{"LD_PRELOAD=/x.so", "LD_LIBRARY_PATH=/evil", "LD_AUDIT=/a.so", "OLD_X=1", "PATH=/bin"}, []string{"OLD_X=1", "PATH=/.dsec/bin:/bin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sealedEnv(tt.in); !cmp.Equal(got, tt.want) {
				t.Errorf("sealedEnv(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}
