package project

import "testing"

func TestReserved(t *testing.T) {
	for _, tt := range []struct {
		name string
		want bool
	}{
		{SandboxFusion, true},
		{"dsec-anything", true},
		{Default, false},
		{"sandboxfusion", false}, // what the docs once suggested for the pool's key
		{"team-dsec-a", false},
		{"dsec", false},
		{"", false},
	} {
		if got := Reserved(tt.name); got != tt.want {
			t.Errorf("Reserved(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}
