package dsec

import (
	"context"
	"path"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// MaxGradePaths is the most paths one GradeFrom copies.
const MaxGradePaths = 256

// GradeOptions change a GradeFrom. Zero fields take the defaults.
type GradeOptions struct {
	// Image of the grading sandbox (default: the graded sandbox's own image
	// as it was created: its layers, not its writable layer).
	Image string
	// Shell, instead of argv, is a command line run with /bin/sh -c in the
	// grading sandbox.
	Shell string
	// Env, Cwd and User are the command's, as in ExecRequest.
	Env  map[string]string
	Cwd  string
	User string
	// Timeout kills the command after this long (default 10 minutes).
	Timeout time.Duration
	// OutputLimit caps each output stream in bytes (default 16 MiB).
	OutputLimit int64
	// Memory, CPUs, Pids and Disk are the grading sandbox's resources
	// (default: the graded sandbox's).
	Memory int64
	CPUs   float64
	Pids   int64
	Disk   int64
	// MaxCopyBytes is the most bytes copied (default 1 GiB); beyond it the
	// call fails.
	MaxCopyBytes int64
}

// GradeResult is a finished GradeFrom: the command's exit status and
// output, and what was copied.
type GradeResult struct {
	ExecResult
	// GraderSandboxID is the grading sandbox, deleted when GradeFrom
	// returned.
	GraderSandboxID string
	// CopiedFiles and CopiedBytes are what was copied from the graded
	// sandbox.
	CopiedFiles int64
	CopiedBytes int64
}

// GradeFrom judges the sandbox's work outside its reach: the server makes a
// fresh sandbox from the sandbox's original image (or opts.Image), copies
// only paths (absolute; a directory with everything below it) from this
// sandbox to the same paths there (regular files and directories;
// symbolic links are copied as links, never followed; anything else is
// refused), runs argv (or opts.Shell) there, deletes it and returns the
// result. This sandbox is not changed. A command that fails is not an
// error: look at the result's exit status.
func (s *Sandbox) GradeFrom(ctx context.Context, paths []string, argv []string, opts GradeOptions) (*GradeResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if (len(argv) == 0) == (opts.Shell == "") {
		return nil, newError(ErrInvalidArgument, "grade: give either a command (argv) or a shell line (GradeOptions.Shell), not both or neither (example: []string{\"pytest\", \"/workspace/tests\"})")
	}
	if len(paths) == 0 {
		return nil, newError(ErrInvalidArgument, "grade: no paths to copy: name the sandbox's files or directories to grade (example: []string{\"/work\"})")
	}
	if len(paths) > MaxGradePaths {
		return nil, newError(ErrInvalidArgument, "grade: %d paths to copy; at most %d (copy their common directory instead)", len(paths), MaxGradePaths)
	}
	for _, p := range paths {
		if !path.IsAbs(p) {
			return nil, newError(ErrInvalidArgument, "grade: path %.80q is not absolute (example: /workspace)", p)
		}
	}
	if opts.OutputLimit < 0 || opts.MaxCopyBytes < 0 {
		return nil, newError(ErrInvalidArgument, "grade: negative output limit or copy limit")
	}
	req := &sandboxv1.GradeFromRequest{
		SandboxId:    s.ID,
		Paths:        paths,
		Image:        opts.Image,
		Argv:         argv,
		Shell:        opts.Shell,
		Env:          opts.Env,
		Cwd:          opts.Cwd,
		User:         opts.User,
		Timeout:      optDuration(opts.Timeout),
		OutputLimit:  opts.OutputLimit,
		MaxCopyBytes: opts.MaxCopyBytes,
	}
	if opts.Memory != 0 || opts.CPUs != 0 || opts.Pids != 0 || opts.Disk != 0 {
		req.Resources = &sandboxv1.Resources{MemoryBytes: opts.Memory, Cpus: opts.CPUs, Pids: opts.Pids, DiskBytes: opts.Disk}
	}
	resp, err := s.c.sandboxes.GradeFrom(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, s.c.err(err)
	}
	m := resp.Msg
	if m.GetExit() == nil {
		return nil, newError(ErrInternal, "grade of sandbox %s: the server's answer had no exit status (is it older than this client?)", s.ID)
	}
	res := &GradeResult{
		ExecResult:      ExecResult{Stdout: m.GetStdout(), Stderr: m.GetStderr()},
		GraderSandboxID: m.GetGraderSandboxId(),
		CopiedFiles:     m.GetCopiedFiles(),
		CopiedBytes:     m.GetCopiedBytes(),
	}
	res.ExitStatus = *exitStatus("", m.GetExit())
	return res, nil
}
