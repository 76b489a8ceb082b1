package main

import (
	"strings"
	"testing"
)

// TestUpLimitFlags: dsec up has --max-request-size and
// --metrics-per-sandbox, explained in --help, and refuses a request limit
// too small to carry a call.
func TestUpLimitFlags(t *testing.T) {
	out, _, code := dsecRun(t, "http://127.0.0.1:1", "", "up", "--help")
	if code != 0 {
		t.Fatalf("dsec up --help exits %d", code)
	}
	for _, flag := range []string{"--max-request-size", "--metrics-per-sandbox"} {
		if !strings.Contains(out, flag) {
			t.Errorf("dsec up --help does not explain %s", flag)
		}
	}
	for _, size := range []string{"1K", "x"} {
		_, errOut, code := dsecRun(t, "http://127.0.0.1:1", "", "up", "--state-dir", t.TempDir(), "--max-request-size", size)
		if code != 2 || !strings.Contains(errOut, "--max-request-size") || !strings.Contains(errOut, "want a size") {
			t.Errorf("dsec up --max-request-size %s = exit %d, %q; want a usage error naming the flag", size, code, errOut)
		}
	}
}
