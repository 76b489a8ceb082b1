package sandbox

import (
	"strings"
	"testing"
)

func TestNodeOfID(t *testing.T) {
	id := NewID("node-7")
	if node, ok := NodeOfID(id); !ok || node != "node-7" {
		t.Errorf("NodeOfID(%q) = %q, %v, want node-7", id, node, ok)
	}
	if len(id) > 63 || strings.ToLower(id) != id {
		t.Errorf("NewID(node-7) = %q, want a lowercase DNS label", id)
	}
	for _, bad := range []string{"", "abc", "-aaaaaaaaaaaa", "node-AAAAAAAAAAAA", "node-aaaaaaaaaaa1", "node-aaaaaaaaaaa", "a_b-aaaaaaaaaaaa", strings.Repeat("a", 60) + "-aaaaaaaaaaaa"} {
		if node, ok := NodeOfID(bad); ok {
			t.Errorf("NodeOfID(%q) = %q, true, want false", bad, node)
		}
	}
}
