package netpolicy

import (
	"strings"
	"testing"
)

func TestSandboxAPIPreamble(t *testing.T) {
	line := SandboxAPIPreamble("node-abc123")
	if len(line) > MaxAPIPreamble {
		t.Fatalf("preamble %q is longer than MaxAPIPreamble", line)
	}
	if id, err := ParseSandboxAPIPreamble(line); err != nil || id != "node-abc123" {
		t.Errorf("Parse(%q) = %q, %v", line, id, err)
	}
	for _, bad := range []string{
		"", "\n", "DSEC-SANDBOX-API 1 \n", "DSEC-SANDBOX-API 1 a b\n", "DSEC-SANDBOX-API 1 a",
		"DSEC-SANDBOX-API 2 a\n", "GET / HTTP/1.1\r\n", "DSEC-SANDBOX-API 1 a\r\n",
		"DSEC-SANDBOX-API 1 " + strings.Repeat("a", 129) + "\n", "DSEC-SANDBOX-API 1 \x00\n",
	} {
		if id, err := ParseSandboxAPIPreamble([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) = %q, want an error", bad, id)
		}
	}
}
