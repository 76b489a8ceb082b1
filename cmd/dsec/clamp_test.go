package main

import (
	"strings"
	"testing"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func TestNoteClamped(t *testing.T) {
	tests := []struct {
		asked, got float64
		want       string
	}{
		{64, 2, "dsec: --cpus 64 was lowered to this node's 2 CPUs\n"},
		{2.5, 1, "dsec: --cpus 2.5 was lowered to this node's 1 CPU\n"},
		{1.5, 1.5, ""},
		{0, 1, ""}, // the default, not asked for
		{0.5, 0.5, ""},
	}
	for _, tt := range tests {
		var b strings.Builder
		noteClamped(&b, dsec.CreateOptions{CPUs: tt.asked}, &dsec.Sandbox{Resources: dsec.Resources{CPUs: tt.got}})
		if b.String() != tt.want {
			t.Errorf("noteClamped(asked %v, got %v) = %q, want %q", tt.asked, tt.got, b.String(), tt.want)
		}
	}
}
