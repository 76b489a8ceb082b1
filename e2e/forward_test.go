package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/testenv"
)

// TestClientForwardsPlatformVerbs: the command line (bin/dsec) hands the
// platform's verbs to dsec-node, help included, and says what to do when
// dsec-node is missing; dsec-node warns when the dsec that handed it a
// verb is another version.
func TestClientForwardsPlatformVerbs(t *testing.T) {
	cli, node := testenv.DsecBinary(t), testenv.NodeBinary(t)
	if cli == node {
		t.Fatalf("DSEC_BIN=%s is a platform binary: this test needs the command line (bin/dsec) with dsec-node beside it", cli)
	}
	// The client alone, with neither dsec-node beside it nor on PATH.
	alone := filepath.Join(t.TempDir(), "dsec")
	b, err := os.ReadFile(cli)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(alone, b, 0o755); err != nil {
		t.Fatal(err)
	}
	env := func(extra ...string) []string {
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "DSEC_NODE_BIN=") && !strings.HasPrefix(kv, "PATH=") {
				env = append(env, kv)
			}
		}
		return append(env, append([]string{"PATH=/usr/bin:/bin"}, extra...)...)
	}
	run := func(bin string, env []string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return string(out), 0
		case errors.As(err, &ee):
			return string(out), ee.ExitCode()
		}
		t.Fatalf("%s %s: %v", bin, args, err)
		return "", 0
	}

	for _, tc := range []struct {
		args []string
		verb string
	}{
		{[]string{"up", "--help"}, "dsec up"},
		{[]string{"purge", "--yes"}, "dsec purge"},
		{[]string{"image", "import", "x", "y"}, "dsec image import"},
		{[]string{"help", "doctor"}, "dsec doctor"},
	} {
		out, code := run(alone, env(), tc.args...)
		if code != 125 || !strings.Contains(out, tc.verb+" runs in dsec-node") || !strings.Contains(out, "DSEC_NODE_BIN") {
			t.Errorf("dsec %s without dsec-node = exit %d, %q; want 125 saying %s runs in dsec-node and naming DSEC_NODE_BIN", strings.Join(tc.args, " "), code, out, tc.verb)
		}
	}
	// Client verbs need no dsec-node.
	if out, code := run(alone, env(), "ps", "--help"); code != 0 || !strings.Contains(out, "dsec ps") {
		t.Errorf("dsec ps --help without dsec-node = exit %d, %q", code, out)
	}
	if out, code := run(alone, env(), "--help"); code != 0 || !strings.Contains(out, "Run the whole platform on this machine") {
		t.Errorf("dsec --help = exit %d, %q; want the platform's verbs listed", code, out)
	}

	// With DSEC_NODE_BIN, and beside it, the verb and its help reach
	// dsec-node.
	withNode := env("DSEC_NODE_BIN=" + node)
	for _, tc := range []struct {
		bin  string
		env  []string
		args []string
		want string
	}{
		{alone, withNode, []string{"up", "--help"}, "Run the single-node platform"},
		{alone, withNode, []string{"help", "up"}, "Run the single-node platform"},
		{alone, withNode, []string{"image", "import", "--help"}, "Usage:\n  dsec image import"},
		{cli, env(), []string{"help", "purge"}, "Usage:\n  dsec purge"},
		{cli, env(), []string{"--addr", "http://127.0.0.1:1", "purge", "--help"}, "Usage:\n  dsec purge"},
	} {
		out, code := run(tc.bin, tc.env, tc.args...)
		if code != 0 || !strings.Contains(out, tc.want) || strings.Contains(out, "warning") {
			t.Errorf("dsec %s = exit %d, %q; want %q and no warning", strings.Join(tc.args, " "), code, out, tc.want)
		}
	}
	out, code := run(node, env("DSEC_FORWARDED_BY=v0.0.0-other"), "doctor", "--help")
	if code != 0 || !strings.Contains(out, "warning: dsec v0.0.0-other handed this command to dsec-node") {
		t.Errorf("dsec-node handed a verb by another version = exit %d, %q; want a warning", code, out)
	}
}
