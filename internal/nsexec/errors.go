package nsexec

import (
	"fmt"
	"syscall"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// HelperError is a setup failure the exec helper reported: the step that
// failed, what it worked on, and the errno. It unwraps to an errdefs kind
// and to the errno, so both errors.Is(err, errdefs.ErrFailedPrecondition)
// and errors.Is(err, syscall.ENOENT) work.
type HelperError struct {
	// Step names the failed step: "chdir", "setresuid", "setns", ...
	Step string
	// Detail is what the step worked on (a path, an id); may be empty.
	Detail string
	Errno  syscall.Errno

	kind error
	msg  string
}

func (e *HelperError) Error() string   { return e.msg }
func (e *HelperError) Unwrap() []error { return []error{e.kind, e.Errno} }

// newHelperError classifies a failure and words it for the user.
func newHelperError(step, detail string, errno syscall.Errno, cfg *ExecConfig) *HelperError {
	e := &HelperError{Step: step, Detail: detail, Errno: errno, kind: errdefs.ErrInternal}
	switch {
	case step == "chdir" && (errno == syscall.ENOENT || errno == syscall.ENOTDIR ||
		errno == syscall.EACCES || errno == syscall.ELOOP || errno == syscall.ENAMETOOLONG):
		e.kind = errdefs.ErrFailedPrecondition
		e.msg = fmt.Sprintf("exec: working directory %q: %v: create it in the sandbox or choose another", detail, errno)
	case step == "setresuid" && errno == syscall.EINVAL:
		e.kind = errdefs.ErrInvalidArgument
		e.msg = fmt.Sprintf("exec: user %d does not exist in the sandbox's user namespace: choose a uid the sandbox maps", cfg.UID)
	case (step == "setresgid" || step == "setgroups") && errno == syscall.EINVAL:
		e.kind = errdefs.ErrInvalidArgument
		e.msg = fmt.Sprintf("exec: group %d or a supplementary group %v does not exist in the sandbox's user namespace: choose groups the sandbox maps", cfg.GID, cfg.Groups)
	case (step == "open target" || step == "stat namespace") && (errno == syscall.ESRCH || errno == syscall.ENOENT):
		e.kind = errdefs.ErrFailedPrecondition
		e.msg = fmt.Sprintf("exec: the sandbox's process %d is not running: the sandbox has stopped", cfg.Pid)
	case step == "fork" && errno == syscall.EAGAIN:
		e.kind = errdefs.ErrResourceExhausted
		e.msg = "exec: the sandbox reached its limit of processes: wait for some to end or raise the pids limit"
	case step == "fork" && errno == syscall.ENOMEM:
		// In a pid namespace whose init has exited, fork fails with ENOMEM.
		e.kind = errdefs.ErrFailedPrecondition
		e.msg = "exec: cannot start a process in the sandbox: its init has exited, or memory is exhausted"
	case step == "fork worker" && (errno == syscall.EAGAIN || errno == syscall.ENOMEM):
		// The zygote's fork, in the caller's cgroup, not the sandbox's.
		e.kind = errdefs.ErrResourceExhausted
		e.msg = fmt.Sprintf("exec: the node cannot start another process now (%v): retry later", errno)
	case step == "zygote request":
		e.msg = fmt.Sprintf("exec: the exec zygote rejected a malformed request: %s: %v", detail, errno)
	case step == "exec" && errno == syscall.E2BIG:
		e.kind = errdefs.ErrInvalidArgument
		e.msg = fmt.Sprintf("exec: %s: the command line and environment are too long: shorten them", detail)
	default:
		if detail != "" {
			e.msg = fmt.Sprintf("exec: %s %s: %v", step, detail, errno)
		} else {
			e.msg = fmt.Sprintf("exec: %s: %v", step, errno)
		}
	}
	return e
}
