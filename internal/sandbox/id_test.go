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

func TestNodeOfRolloutID(t *testing.T) {
	for _, node := range []string{"node-7", "e2e", strings.Repeat("n", 40)} {
		id := NewRolloutID(node)
		if got, ok := NodeOfRolloutID(id); !ok || got != node {
			t.Errorf("NodeOfRolloutID(%q) = %q, %v, want %s", id, got, ok, node)
		}
		if len(id) > 63 || strings.ToLower(id) != id {
			t.Errorf("NewRolloutID(%s) = %q, want a lowercase DNS label", node, id)
		}
		// A rollout ID is not a sandbox ID of its node.
		if got, ok := NodeOfID(id); ok && got == node {
			t.Errorf("NodeOfID(rollout %q) = %q, want not node %s", id, got, node)
		}
	}
	for _, bad := range []string{"", "abc", "-r-aaaaaaaaaaaa", "node-aaaaaaaaaaaa", "node-r-AAAAAAAAAAAA", "node-r-aaaaaaaaaaa1",
		"node-r-aaaaaaaaaaa", "a_b-r-aaaaaaaaaaaa", strings.Repeat("a", 50) + "-r-aaaaaaaaaaaa", "node-raaaaaaaaaaaa"} {
		if node, ok := NodeOfRolloutID(bad); ok {
			t.Errorf("NodeOfRolloutID(%q) = %q, true, want false", bad, node)
		}
	}
}

func FuzzNodeOfRolloutID(f *testing.F) {
	f.Add("node-7-r-abcdefghijkl")
	f.Add("x-r-")
	f.Fuzz(func(t *testing.T, id string) {
		node, ok := NodeOfRolloutID(id)
		if !ok {
			return
		}
		if !ValidNodeName(node) || id != node+"-r-"+id[len(id)-idRandLen:] || len(id) > 63 {
			t.Errorf("NodeOfRolloutID(%q) = %q, true: not the ID's node", id, node)
		}
	})
}
