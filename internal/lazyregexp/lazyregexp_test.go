package lazyregexp

import (
	"sync"
	"testing"
)

func TestMatchString(t *testing.T) {
	re := New(`^[a-z]{1,3}$`)
	if re.re != nil {
		t.Fatal("New compiled the pattern; want it compiled on first use")
	}
	for _, tc := range []struct {
		s    string
		want bool
	}{{"abc", true}, {"abcd", false}, {"", false}, {"a1", false}} {
		if got := re.MatchString(tc.s); got != tc.want {
			t.Errorf("MatchString(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
	if got := re.String(); got != `^[a-z]{1,3}$` {
		t.Errorf("String() = %q", got)
	}
}

func TestConcurrentFirstUse(t *testing.T) {
	re := New(`^x+$`)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if !re.MatchString("xxx") {
				t.Error(`MatchString("xxx") = false, want true`)
			}
		})
	}
	wg.Wait()
}

func TestBadPatternPanicsAtFirstUse(t *testing.T) {
	re := New(`(`)
	defer func() {
		if recover() == nil {
			t.Error("MatchString of a bad pattern did not panic")
		}
	}()
	re.MatchString("x")
}
