package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestGradeFrom grades an agent's repository in a fresh sandbox of the
// same image: the links the agent planted arrive as links and lead
// nowhere but into the grader's own image, a fifo is refused, the
// grading sandbox is gone afterwards and the agent's is unchanged, its
// leftover process still running.
func TestGradeFrom(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	ctx := ctxT(t)
	key := p.AdminKey(t)
	c := p.Client(t, key)
	api := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, p.URL())
	grade := func(key string, m *sandboxv1.GradeFromRequest) (*sandboxv1.GradeFromResponse, error) {
		req := connect.NewRequest(m)
		req.Header().Set("Authorization", "Bearer "+key)
		resp, err := api.GradeFrom(ctx, req)
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}

	agent, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Labels: map[string]string{"job": "grade"}})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	t.Cleanup(func() { c.Delete(ctx, agent.ID) })
	r, err := agent.Shell(ctx, `set -e
echo AGENT-MARKER > /etc/shadow
mkdir -p /workspace/repo/pkg/deep /workspace/pipe
echo hello > /workspace/repo/main.txt
echo nested > /workspace/repo/pkg/deep/n.txt
ln -s /etc/shadow /workspace/repo/shadow
ln -s ../../../etc /workspace/repo/up
ln -s /workspace/repo /workspace/repolink
mkfifo /workspace/pipe/fifo
echo not-asked-for > /workspace/notes.txt
setsid sleep 1000 </dev/null >/dev/null 2>&1 &`)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("agent's setup = %v, exit %d, %s", err, r.ExitCode, r.Stderr)
	}

	start := time.Now()
	res, err := grade(key, &sandboxv1.GradeFromRequest{
		SandboxId: agent.ID, Paths: []string{"/workspace/repo"},
		Shell: `cat /workspace/repo/main.txt /workspace/repo/pkg/deep/n.txt
ls -la /workspace/repo
echo "link: $(readlink /workspace/repo/shadow) $(readlink /workspace/repo/up)"
cat /workspace/repo/shadow /workspace/repo/up/shadow /etc/shadow 2>&1
test -e /workspace/notes.txt && echo NOTES-COPIED
exit 5`,
		Timeout: durationpb.New(time.Minute),
	})
	if err != nil {
		t.Fatalf("GradeFrom = %v", err)
	}
	out := string(res.GetStdout())
	t.Logf("grade took %v; grader said:\n%s%s", time.Since(start), out, res.GetStderr())
	if res.GetExit().GetExitCode() != 5 || res.GetGraderSandboxId() == "" || res.GetGraderSandboxId() == agent.ID {
		t.Errorf("GradeFrom = exit %d in %q; want the command's exit 5 in a new sandbox", res.GetExit().GetExitCode(), res.GetGraderSandboxId())
	}
	for _, want := range []string{"hello\nnested\n", "shadow -> /etc/shadow", "up -> ../../../etc", "link: /etc/shadow ../../../etc"} {
		if !strings.Contains(out, want) {
			t.Errorf("grader's output lacks %q", want)
		}
	}
	if strings.Contains(out, "AGENT-MARKER") {
		t.Errorf("the grader read the agent's /etc/shadow through a copied link")
	}
	if strings.Contains(out, "NOTES-COPIED") {
		t.Errorf("the grader has /workspace/notes.txt, which was not asked for")
	}
	if res.GetCopiedFiles() != 4 || res.GetCopiedBytes() != int64(len("hello\nnested\n")) {
		t.Errorf("copied %d files, %d bytes; want 4 (2 files, 2 links), 13 bytes", res.GetCopiedFiles(), res.GetCopiedBytes())
	}

	// The same with an image named, as the API server checks it.
	res, err = grade(key, &sandboxv1.GradeFromRequest{SandboxId: agent.ID, Paths: []string{"/workspace/repo/pkg"}, Image: "busybox", Argv: []string{"cat", "/workspace/repo/pkg/deep/n.txt"}})
	if err != nil || string(res.GetStdout()) != "nested\n" {
		t.Errorf("GradeFrom(image busybox) = %q, %v", res.GetStdout(), err)
	}

	for _, tt := range []struct {
		name string
		key  string
		m    *sandboxv1.GradeFromRequest
		code connect.Code
		text string
	}{
		{"fifo", key, &sandboxv1.GradeFromRequest{SandboxId: agent.ID, Paths: []string{"/workspace/repo", "/workspace/pipe"}, Shell: "echo RAN"},
			connect.CodeFailedPrecondition, "/workspace/pipe/fifo is a fifo"},
		{"top-level link", key, &sandboxv1.GradeFromRequest{SandboxId: agent.ID, Paths: []string{"/workspace/repolink"}, Shell: "echo RAN"},
			connect.CodeFailedPrecondition, "symbolic link"},
		{"copy limit", key, &sandboxv1.GradeFromRequest{SandboxId: agent.ID, Paths: []string{"/workspace/repo"}, Shell: "echo RAN", MaxCopyBytes: 10},
			connect.CodeResourceExhausted, "max_copy_bytes"},
		{"proc", key, &sandboxv1.GradeFromRequest{SandboxId: agent.ID, Paths: []string{"/proc/1/root"}, Shell: "echo RAN"},
			connect.CodeInvalidArgument, "/proc"},
		{"unknown image", key, &sandboxv1.GradeFromRequest{SandboxId: agent.ID, Paths: []string{"/workspace/repo"}, Image: "nope", Shell: "echo RAN"},
			connect.CodeNotFound, "image nope"},
		{"another project", p.ProjectKey(t, "team-b"), &sandboxv1.GradeFromRequest{SandboxId: agent.ID, Paths: []string{"/workspace/repo"}, Shell: "echo RAN"},
			connect.CodeNotFound, "not found"},
	} {
		_, err := grade(tt.key, tt.m)
		if connect.CodeOf(err) != tt.code || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("GradeFrom(%s) = %v, want %v saying %q", tt.name, err, tt.code, tt.text)
		}
	}

	// Every grading sandbox is gone; the agent's runs on as it was.
	list, err := c.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != agent.ID {
		var ids []string
		for _, s := range list {
			ids = append(ids, s.ID)
		}
		t.Errorf("sandboxes after the grades = %v, want only the agent's %s", ids, agent.ID)
	}
	r, err = agent.Shell(ctx, "cat /etc/shadow; ls /workspace/repo; test -p /workspace/pipe/fifo && echo fifo; ps -o args | grep -c '^[s]leep 1000'")
	if err != nil || string(r.Stdout) != "AGENT-MARKER\nmain.txt\npkg\nshadow\nup\nfifo\n1\n" {
		t.Errorf("agent's sandbox after the grades: %q, %v", r.Stdout, err)
	}
}
