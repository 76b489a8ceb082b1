package adversarial

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSyscallsRefused makes, from inside a sandbox, the system calls that
// reach the host's kernel past the sandbox's namespaces (mounts, modules,
// keyrings, eBPF, perf events, userfaultfd, io_uring, new user namespaces,
// reboot, clocks, kernel log, swap, I/O ports, file handles, XFS extent
// swaps, device nodes) and checks each is refused with EPERM (clone3 with
// ENOSYS) rather than reaching the kernel code behind it. Protection: the
// default seccomp policy (internal/seccomp.Default) every exec runs under,
// and the capabilities the exec keeps (no CAP_SYS_ADMIN, CAP_SYS_MODULE,
// CAP_SYS_BOOT, CAP_SYS_TIME; device nodes need CAP_MKNOD in the host's
// user namespace).
func TestSyscallsRefused(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := Shared(t)
	InstallProbe(t, sb)
	r := Sh(t, sb, "probe syscall")
	if r.Code() != 0 {
		t.Fatalf("probe syscall = exit %d, stderr %q", r.Code(), r.Stderr)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		name, res, _ := strings.Cut(line, " ")
		got[name] = res
	}
	want := map[string]string{}
	for name := range got {
		want[name] = "EPERM"
	}
	want["clone3"] = "ENOSYS"
	if len(got) < 30 {
		t.Errorf("probe syscall made %d attempts, want at least 30:\n%s", len(got), r.Stdout)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("system calls from inside a sandbox (-want +got):\n%s", d)
	}
}
