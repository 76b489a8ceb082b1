package cgroup

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMarkFake checks where marks go: the group's first directory
// (cgroup2's on hybrid hosts), as trusted.dsec.NAME.
func TestMarkFake(t *testing.T) {
	for _, tt := range []struct {
		mode Mode
		dir  string
	}{{V1, "cpu,cpuacct/dsec/sb"}, {Hybrid, "unified/dsec/sb"}, {Unified, "unified/dsec/sb"}} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			m, k := newFake(t, fakeOptions{mode: tt.mode})
			if err := m.Create("sb", limits); err != nil {
				t.Fatal(err)
			}
			k.log = nil
			if on, err := m.HasMark("sb", "paused"); err != nil || on {
				t.Errorf("HasMark before SetMark = %v, %v; want false, nil", on, err)
			}
			if err := m.SetMark("sb", "paused", true); err != nil {
				t.Fatalf("SetMark(on) = %v", err)
			}
			if on, err := m.HasMark("sb", "paused"); err != nil || !on {
				t.Errorf("HasMark after SetMark = %v, %v; want true, nil", on, err)
			}
			for range 2 { // clearing twice is fine
				if err := m.SetMark("sb", "paused", false); err != nil {
					t.Fatalf("SetMark(off) = %v", err)
				}
			}
			if on, _ := m.HasMark("sb", "paused"); on {
				t.Errorf("HasMark after clearing = true")
			}
			want := []string{"setxattr " + tt.dir + " trusted.dsec.paused", "removexattr " + tt.dir + " trusted.dsec.paused"}
			if diff := cmp.Diff(want, k.log); diff != "" {
				t.Errorf("marks' writes (-want +got):\n%s", diff)
			}
			for _, bad := range []string{"", "Paused", "a.b", "../x"} {
				if err := m.SetMark("sb", bad, true); err == nil {
					t.Errorf("SetMark(%q) = nil error, want InvalidArgument", bad)
				}
			}
			if err := m.SetMark("nosuch", "paused", true); err == nil {
				t.Errorf("SetMark on a missing group = nil error, want NotFound")
			}
		})
	}
}

// TestRealMark sets a mark on a real group, finds it with a second
// Manager (a restarted keeper) and sees it go with the group.
func TestRealMark(t *testing.T) {
	m := newReal(t)
	if err := m.Create("sb", Resources{}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetMark("sb", "paused", true); err != nil {
		t.Fatalf("SetMark = %v", err)
	}
	m2, err := New(Config{Parent: m.parent, Layout: m.layout})
	if err != nil {
		t.Fatal(err)
	}
	if on, err := m2.HasMark("sb", "paused"); err != nil || !on {
		t.Errorf("another Manager's HasMark = %v, %v; want true", on, err)
	}
	if err := m.Delete(t.Context(), "sb"); err != nil {
		t.Fatal(err)
	}
	if err := m.Create("sb", Resources{}); err != nil {
		t.Fatal(err)
	}
	if on, err := m.HasMark("sb", "paused"); err != nil || on {
		t.Errorf("HasMark of a group made again = %v, %v; want false", on, err)
	}
}
