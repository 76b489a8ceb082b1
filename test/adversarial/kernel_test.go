package adversarial

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/sdk/go/dsec"
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
	want := map[string]string{}
	for _, name := range []string{
		"acct", "add_key", "bpf", "clock_settime", "delete_module", "finit_module", "fsopen",
		"init_module", "io_uring_setup", "ioperm", "iopl", "kexec_load", "keyctl", "mknod_char",
		"mount", "name_to_handle_at", "open_by_handle_at", "open_tree", "perf_event_open",
		"personality_no_aslr", "pivot_root", "reboot", "request_key", "settimeofday", "swapon",
		"syslog", "umount2", "unshare_user", "userfaultfd", "xfs_swapext",
	} {
		want[name] = "EPERM"
	}
	want["clone3"] = "ENOSYS"
	got := probe(t, sb, "syscall", slices.Sorted(maps.Keys(want))...)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("system calls from inside a sandbox (-want +got):\n%s", d)
	}
}

// probe runs the probe's command with args in sb and returns its report:
// each line's first field and the rest.
func probe(t *testing.T, sb *dsec.Sandbox, command string, args ...string) map[string]string {
	t.Helper()
	script := "probe " + command
	for _, a := range args {
		script += " '" + a + "'"
	}
	r := Sh(t, sb, script)
	if r.Code() != 0 {
		t.Fatalf("Shell(%q) = exit %d, stderr %q; want the probe's report", script, r.Code(), r.Stderr)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		name, res, _ := strings.Cut(line, " ")
		got[name] = res
	}
	return got
}

// TestMaskedProcFiles reads, from inside, the /proc files that describe
// or reach the host's kernel and memory (/proc/kpagecgroup read by a
// recursive grep crashed a kernel in the report) and checks each gives
// nothing; and that a recursive grep over all of /proc and /sys ends and
// leaves the host answering. Protection: the runtime's masked paths
// (internal/oci: /dev/null bound over them, empty directories over the
// directories) and the sandbox's own procfs (pid namespace).
func TestMaskedProcFiles(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := Shared(t)
	var script strings.Builder
	files := []string{
		"/proc/kpagecgroup", "/proc/kpageflags", "/proc/kpagecount", "/proc/kcore", "/proc/keys",
		"/proc/timer_list", "/proc/sched_debug", "/proc/sysrq-trigger", "/proc/latency_stats",
	}
	want := map[string]string{}
	for _, f := range files {
		script.WriteString("echo " + f + " $(head -c 4096 " + f + " 2>/dev/null | wc -c)\n")
		want[f] = "0"
	}
	script.WriteString("echo /proc/acpi $(ls /proc/acpi 2>/dev/null | wc -l)\necho /sys/firmware $(ls /sys/firmware 2>/dev/null | wc -l)\n")
	want["/proc/acpi"], want["/sys/firmware"] = "0", "0"
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(MustSh(t, sb, script.String())), "\n") {
		name, n, _ := strings.Cut(line, " ")
		got[name] = n
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("bytes read from masked kernel files (-want +got):\n%s", d)
	}
	r := Sh(t, sb, "grep -rs kpage /proc/ /sys/ >/dev/null; echo done", dsec.WithTimeout(90*time.Second))
	if r.Stdout != "done\n" || r.TimedOut {
		t.Errorf("grep -r over /proc and /sys = %+v, %q; want it to end", r.ExitStatus, r.Stdout)
	}
	HostAlive(t)
}

// TestKernelSettingsReadOnly writes, from inside, to host-wide sysctls, to
// sysfs and to /proc/sys through a fresh mount, and checks every write fails and
// the host's values are unchanged. Protection: /proc/sys and /sys are
// mounted read-only in the sandbox, remounting or mounting them anew
// needs CAP_SYS_ADMIN and mount(2), which seccomp refuses.
func TestKernelSettingsReadOnly(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := Shared(t)
	files := []string{"/proc/sys/vm/swappiness", "/proc/sys/vm/overcommit_memory", "/proc/sys/kernel/core_pattern", "/sys/kernel/mm/transparent_hugepage/enabled"}
	before := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("read host %s: %v", f, err)
		}
		before[f] = string(b)
	}
	for _, script := range []string{
		"echo 13 > /proc/sys/vm/swappiness",
		"echo 2 > /proc/sys/vm/overcommit_memory",
		"echo '|/tmp/pwn' > /proc/sys/kernel/core_pattern",
		"sysctl -w vm.swappiness=13",
		"echo never > /sys/kernel/mm/transparent_hugepage/enabled",
		"touch /sys/pwned",
		"mount -o remount,rw /sys",
		"mount -o remount,rw /proc/sys",
		"mkdir -p /tmp/p && mount -t proc proc /tmp/p && echo 13 > /tmp/p/sys/vm/swappiness",
		"mkdir -p /tmp/s && mount -t sysfs sysfs /tmp/s && touch /tmp/s/pwned",
	} {
		if r := Sh(t, sb, script); r.Code() == 0 {
			t.Errorf("Shell(%q) = exit 0, want a failure", script)
		}
	}
	for _, f := range files {
		if b, _ := os.ReadFile(f); string(b) != before[f] {
			t.Errorf("host %s = %q after writes from a sandbox, want %q", f, b, before[f])
			if !strings.HasPrefix(f, "/sys/") {
				_ = os.WriteFile(f, []byte(before[f]), 0o644) // undo it for the host
			}
		}
	}
}

// TestUnmaskAndRemount tries to undo the sandbox's masks and read-only
// mounts from inside with the mount tools (umount the mask over
// /proc/kcore, bind the root elsewhere, make new namespaces, join pid 1's)
// and checks each fails and the masks still hold. Protection: seccomp
// denies mount, umount2, pivot_root and the new mount API, and clone or
// unshare of a new user namespace; setns and new namespaces need
// CAP_SYS_ADMIN, which execs do not keep.
func TestUnmaskAndRemount(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := Shared(t)
	for _, script := range []string{
		"umount /proc/kcore",
		"umount -l /proc/kpagecgroup",
		"umount /proc/sys",
		"mkdir -p /tmp/b && mount --bind / /tmp/b",
		"mount -t tmpfs none /mnt",
		"unshare -U true",
		"unshare -m true",
		"unshare -n true",
		"unshare -p -f true",
		"nsenter -t 1 -m -u -i -n -p true",
		"nsenter -t 1 -U true",
	} {
		if r := Sh(t, sb, script); r.Code() == 0 {
			t.Errorf("Shell(%q) = exit 0, want a failure", script)
		}
	}
	if r := Sh(t, sb, "head -c 64 /proc/kcore | wc -c; head -c 64 /proc/kpagecgroup | wc -c"); r.Stdout != "0\n0\n" {
		t.Errorf("masked files after the attempts give %q bytes, want 0 and 0", r.Stdout)
	}
}

// TestChrootEscape makes the classic chroot escape (chroot into a
// subdirectory, climb out with "..", chroot there) and reads a host file
// that does not exist in the sandbox, and checks it stays unreadable.
// Protection: the runtime pivots the sandbox's root and detaches the old
// one, so the top of the mount namespace is the sandbox's root; a chroot
// alone would let CAP_SYS_CHROOT climb out to the host's.
func TestChrootEscape(t *testing.T) {
	Env(t)
	t.Parallel()
	sb, h := Shared(t), newHostDir(t)
	InstallProbe(t, sb)
	got := probe(t, sb, "chroot", h.path+"/secret")
	if res := got["read:"+h.path+"/secret"]; res != "ENOENT" || strings.Contains(res, h.secret) {
		t.Errorf("read of a host file after a chroot escape = %q, want ENOENT", res)
	}
}
