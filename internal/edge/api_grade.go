package edge

import (
	"context"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/sandbox"
)

func (a *sandboxAPI) GradeFrom(ctx context.Context, req *connect.Request[sandboxv1.GradeFromRequest]) (*connect.Response[sandboxv1.GradeFromResponse], error) {
	m := req.Msg
	p := GradeParams{
		Sandbox: m.GetSandboxId(), Paths: m.GetPaths(), Image: m.GetImage(),
		Argv: m.GetArgv(), Shell: m.GetShell(), Env: m.GetEnv(), Cwd: m.GetCwd(), User: m.GetUser(),
		Timeout: m.GetTimeout().AsDuration(), OutputLimit: m.GetOutputLimit(), MaxCopyBytes: m.GetMaxCopyBytes(),
	}
	if r := m.GetResources(); r != nil {
		p.Resources = sandbox.Resources{MemoryBytes: r.GetMemoryBytes(), CPUs: r.GetCpus(), Pids: r.GetPids(), DiskBytes: r.GetDiskBytes()}
	}
	res, err := a.e.GradeFrom(ctx, callerOf(req.Header()), p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.GradeFromResponse{
		Exit: exitProto(&res.Exit), Stdout: res.Stdout, Stderr: res.Stderr,
		GraderSandboxId: res.Grader, CopiedFiles: res.CopiedFiles, CopiedBytes: res.CopiedBytes,
	}), nil
}
