package adversarial

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestGradeFromBringsNothingElse: an agent that wants its grader to read
// more than its outputs plants links in the copied tree (to its own
// /etc/shadow, to "..", to a file outside the tree) and a marker in the
// files it was not asked for. GradeFrom copies links as links, never
// followed, so the grader sees none of it; the grading sandbox is gone
// afterwards. Protection: GradeFrom's archive filter and link-keeping
// extraction (internal/edge/grade.go).
func TestGradeFromBringsNothingElse(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := NewSandbox(t, dsec.CreateOptions{})
	MustSh(t, sb, `mkdir -p /workspace/out && echo 42 > /workspace/out/answer &&
echo AGENT-SECRET > /etc/shadow && echo AGENT-OUTSIDE > /workspace/outside &&
ln -s /etc/shadow /workspace/out/shadow && ln -s .. /workspace/out/up && ln -s /workspace/outside /workspace/out/far`)
	// The attack works where links are followed: in the agent's own sandbox.
	if r := Sh(t, sb, "cat /workspace/out/shadow /workspace/out/up/outside"); !strings.Contains(r.Stdout, "AGENT-SECRET") {
		t.Fatalf("the planted links do not lead anywhere in the agent's sandbox (%q): the test proves nothing", r.Stdout)
	}
	ctx := Ctx(t, 2*time.Minute)
	res, err := sb.GradeFrom(ctx, []string{"/workspace/out"}, nil, dsec.GradeOptions{
		Shell: "cat /workspace/out/answer; cat /workspace/out/shadow /workspace/out/up/outside /workspace/out/far /etc/shadow /workspace/outside 2>/dev/null; true"})
	if err != nil {
		t.Fatalf("GradeFrom = %v", err)
	}
	out := string(res.Stdout)
	if !strings.HasPrefix(out, "42\n") {
		t.Errorf("the grader's output = %q, want the copied answer first", out)
	}
	if strings.Contains(out, "AGENT-SECRET") || strings.Contains(out, "AGENT-OUTSIDE") {
		t.Errorf("the grader read what the agent did not hand in: %q", out)
	}
	if _, err := Admin(t).Get(ctx, res.GraderSandboxID); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("Get(grading sandbox %s) after GradeFrom = %v, want ErrNotFound", res.GraderSandboxID, err)
	}
}
