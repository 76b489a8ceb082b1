// Package seccomp builds the classic-BPF seccomp filter that is the syscall
// policy of a sandbox: every command the keeper execs into a sandbox (and so
// every process an agent runs) starts under it, through nsexec's
// ExecConfig.Seccomp.
//
// A Policy is a set of rules, one per system call, each with an action
// (fail with an errno, or kill) and optionally a condition on one argument.
// Default returns the platform's policy, modelled on Docker's default profile
// for an unprivileged container; Deny, Allow and With tune it. Compile turns
// a policy into the raw bytes the kernel takes (an array of struct
// sock_filter) for one architecture, with a small assembler of its own: no
// libseccomp, no cgo.
//
// Invariants of every compiled filter:
//   - The first check is seccomp_data.arch: a call made through any other
//     calling convention than the native one (i386 through int 0x80 on
//     x86_64, arm32 compat on arm64) fails with EPERM before the number is
//     looked at, because numbers mean different calls on other ABIs. On
//     x86_64, x32 calls (number bit 0x40000000 set, native arch) fail with
//     EPERM too.
//   - Default's denials return an errno (EPERM; ENOSYS for clone3), never
//     kill, so programs see a clean error they can report or work around.
//   - Arguments are compared on their low 32 bits only, which is what the
//     kernel itself reads of the int-typed arguments conditions apply to
//     (ioctl's cmd, clone's and unshare's flags, personality's persona):
//     garbage in the high word cannot slip a call past a rule.
//   - A call that no rule names is allowed without its arguments being read,
//     so the kernel's seccomp action cache skips the filter for it.
//   - The filter is at most MaxInsns instructions; every jump is forward and
//     in range (long conditional jumps go through ja trampolines).
package seccomp
