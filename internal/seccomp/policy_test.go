package seccomp

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/nsexec"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// Values the tests pass that the policy does not name.
const (
	tcgets          = 0x5401  // TCGETS
	fionread        = 0x541b  // FIONREAD
	cloneVM         = 0x100   // CLONE_VM
	cloneNewNS      = 0x20000 // CLONE_NEWNS
	cloneNewNet     = 0x40000000
	cloneThreadLike = 0x3d0f00  // glibc's pthread_create flags
	sigchld         = 17        // SIGCHLD, in clone's low byte
	addrNoRandomize = 0x0040000 // ADDR_NO_RANDOMIZE
	readImpliesExec = 0x0400000 // READ_IMPLIES_EXEC
	auditArchI386   = 0x40000003
	auditArchARM    = 0x40000028
	garbageHigh     = 0xdeadbeef << 32
)

func compile(t testing.TB, p Policy, arch Arch) []byte {
	t.Helper()
	b, err := p.Compile(arch)
	if err != nil {
		t.Fatalf("Compile(%s) = %v", arch, err)
	}
	return b
}

// defaultCases are calls and what Default's filter must do with them, on
// either architecture.
func defaultCases(arch Arch) []struct {
	name string
	data seccompData
	want Action
} {
	type tc = struct {
		name string
		data seccompData
		want Action
	}
	c := func(name string, args ...uint64) seccompData { return call(arch, name, args...) }
	cases := []tc{
		{"read", c("read", 0, 0x7fff0000, 10), ActAllow},
		{"write", c("write", 1), ActAllow},
		{"openat", c("openat", 0xffffff9c, 0x7fff0000, 0), ActAllow},
		{"execve", c("execve"), ActAllow},
		{"getpid", c("getpid"), ActAllow},
		{"exit_group", c("exit_group", 3), ActAllow},
		{"setresuid", c("setresuid", 1000, 1000, 1000), ActAllow},
		{"ptrace", c("ptrace", 0), ActAllow},
		{"setns", c("setns", 3, 0), ActAllow},
		{"socket", c("socket", 2, 1, 0), ActAllow},
		{"seccomp", c("seccomp", 1, 0, 0), ActAllow},
		{"prctl", c("prctl", 38, 1), ActAllow},
		{"chdir", c("chdir"), ActAllow},

		{"keyctl", c("keyctl", 0, 0xfffffffd), ActEPERM},
		{"add_key", c("add_key"), ActEPERM},
		{"request_key", c("request_key"), ActEPERM},
		{"bpf", c("bpf", 5), ActEPERM},
		{"perf_event_open", c("perf_event_open"), ActEPERM},
		{"userfaultfd", c("userfaultfd"), ActEPERM},
		{"kexec_load", c("kexec_load"), ActEPERM},
		{"kexec_file_load", c("kexec_file_load"), ActEPERM},
		{"init_module", c("init_module"), ActEPERM},
		{"finit_module", c("finit_module"), ActEPERM},
		{"delete_module", c("delete_module"), ActEPERM},
		{"open_by_handle_at", c("open_by_handle_at"), ActEPERM},
		{"name_to_handle_at", c("name_to_handle_at"), ActEPERM},
		{"swapon", c("swapon"), ActEPERM},
		{"swapoff", c("swapoff"), ActEPERM},
		{"reboot", c("reboot", 0xfee1dead, 672274793, 0x4321fedc), ActEPERM},
		{"settimeofday", c("settimeofday"), ActEPERM},
		{"clock_settime", c("clock_settime"), ActEPERM},
		{"clock_adjtime", c("clock_adjtime"), ActEPERM},
		{"adjtimex", c("adjtimex"), ActEPERM},
		{"acct", c("acct"), ActEPERM},
		{"lookup_dcookie", c("lookup_dcookie"), ActEPERM},
		{"quotactl", c("quotactl"), ActEPERM},
		{"quotactl_fd", c("quotactl_fd"), ActEPERM},
		{"fsopen", c("fsopen"), ActEPERM},
		{"fsconfig", c("fsconfig"), ActEPERM},
		{"fsmount", c("fsmount"), ActEPERM},
		{"fspick", c("fspick"), ActEPERM},
		{"move_mount", c("move_mount"), ActEPERM},
		{"open_tree", c("open_tree"), ActEPERM},
		{"open_tree_attr", c("open_tree_attr"), ActEPERM},
		{"mount_setattr", c("mount_setattr"), ActEPERM},
		{"mount", c("mount"), ActEPERM},
		{"umount2", c("umount2"), ActEPERM},
		{"pivot_root", c("pivot_root"), ActEPERM},
		{"syslog", c("syslog", 3), ActEPERM},
		{"nfsservctl", c("nfsservctl"), ActEPERM},
		{"io_uring_setup", c("io_uring_setup", 8, 0), ActEPERM},
		{"io_uring_enter", c("io_uring_enter"), ActEPERM},
		{"io_uring_register", c("io_uring_register"), ActEPERM},

		{"clone3", c("clone3", 0x7fff0000, 88), ActENOSYS},
		{"clone fork", c("clone", sigchld), ActAllow},
		{"clone thread", c("clone", cloneThreadLike), ActAllow},
		{"clone new mount ns", c("clone", cloneNewNS|sigchld), ActAllow},
		{"clone new net ns", c("clone", cloneNewNet|sigchld), ActAllow},
		{"clone CLONE_NEWUSER", c("clone", cloneNewUser|sigchld), ActEPERM},
		{"clone CLONE_NEWUSER and more", c("clone", cloneNewUser|cloneNewNS|cloneNewNet|cloneVM), ActEPERM},
		{"clone CLONE_NEWUSER, garbage high", c("clone", garbageHigh|cloneNewUser), ActEPERM},
		{"clone garbage high only", c("clone", garbageHigh|sigchld), ActAllow},
		{"unshare CLONE_NEWUSER", c("unshare", cloneNewUser), ActEPERM},
		{"unshare CLONE_NEWUSER|CLONE_NEWNS", c("unshare", cloneNewUser|cloneNewNS), ActEPERM},
		{"unshare CLONE_NEWNS", c("unshare", cloneNewNS), ActAllow},
		{"unshare CLONE_FS", c("unshare", 0x200), ActAllow},

		{"personality query", c("personality", perQuery), ActAllow},
		{"personality PER_LINUX", c("personality", perLinux), ActAllow},
		{"personality PER_LINUX32", c("personality", perLinux32), ActAllow},
		{"personality UNAME26", c("personality", perUname26), ActAllow},
		{"personality PER_LINUX32|UNAME26", c("personality", perLinux32Uname), ActAllow},
		{"personality ADDR_NO_RANDOMIZE", c("personality", addrNoRandomize), ActEPERM},
		{"personality READ_IMPLIES_EXEC", c("personality", readImpliesExec), ActEPERM},
		{"personality 1", c("personality", 1), ActEPERM},
		// The kernel reads an unsigned int: the high word changes nothing.
		{"personality PER_LINUX, garbage high", c("personality", garbageHigh|perLinux), ActAllow},
		{"personality READ_IMPLIES_EXEC, garbage high", c("personality", garbageHigh|readImpliesExec), ActEPERM},

		{"ioctl TCGETS", c("ioctl", 0, tcgets), ActAllow},
		{"ioctl FIONREAD", c("ioctl", 3, fionread, 0x7fff0000), ActAllow},
		{"ioctl XFS_IOC_SWAPEXT", c("ioctl", 3, xfsIOCSwapext, 0x7fff0000), ActEPERM},
		{"ioctl XFS_IOC_EXCHANGE_RANGE", c("ioctl", 3, xfsIOCExchangeRange, 0x7fff0000), ActEPERM},
		{"ioctl XFS_IOC_SWAPEXT, garbage high", c("ioctl", 3, garbageHigh|xfsIOCSwapext), ActEPERM},
		{"ioctl XFS_IOC_SWAPEXT, all-ones high", c("ioctl", 3, 0xffffffff<<32|xfsIOCSwapext), ActEPERM},
		{"ioctl XFS_IOC_EXCHANGE_RANGE, garbage high", c("ioctl", 3, garbageHigh|xfsIOCExchangeRange), ActEPERM},
		{"ioctl XFS_IOC_SWAPEXT as fd", c("ioctl", xfsIOCSwapext, tcgets), ActAllow},
		{"ioctl XFS_IOC_SWAPEXT as arg", c("ioctl", 3, tcgets, xfsIOCSwapext), ActAllow},
		{"ioctl XFS_IOC_SWAPEXT+1", c("ioctl", 3, xfsIOCSwapext+1), ActAllow},

		{"unknown number", seccompData{nr: 1000, arch: arches[arch].audit}, ActAllow},
		{"other arch, read", seccompData{nr: 3, arch: auditArchI386}, ActEPERM},
		{"other arch, arm", seccompData{nr: 3, arch: auditArchARM}, ActEPERM},
		{"arch 0", seccompData{nr: 0, arch: 0}, ActEPERM},
	}
	if arch == AMD64 {
		cases = append(cases,
			tc{"mkdir", c("mkdir"), ActAllow},
			tc{"fork", c("fork"), ActAllow},
			tc{"vfork", c("vfork"), ActAllow},
			tc{"iopl", c("iopl", 3), ActEPERM},
			tc{"ioperm", c("ioperm"), ActEPERM},
			tc{"uselib", c("uselib"), ActEPERM},
			tc{"ustat", c("ustat"), ActEPERM},
			tc{"sysfs", c("sysfs"), ActEPERM},
			tc{"_sysctl", c("_sysctl"), ActEPERM},
			// i386 through int 0x80: 1 is exit there, 26 ptrace, 21 mount.
			tc{"i386 exit", seccompData{nr: 1, arch: auditArchI386}, ActEPERM},
			tc{"i386 mount", seccompData{nr: 21, arch: auditArchI386}, ActEPERM},
			tc{"x32 read", seccompData{nr: x32SyscallBit, arch: arches[AMD64].audit}, ActEPERM},
			tc{"x32 getpid", seccompData{nr: x32SyscallBit | 39, arch: arches[AMD64].audit}, ActEPERM},
			tc{"x32 ioctl", seccompData{nr: x32SyscallBit | 514, arch: arches[AMD64].audit}, ActEPERM},
			// -1 has the x32 bit set; the kernel would return ENOSYS.
			tc{"number -1", seccompData{nr: 0xffffffff, arch: arches[AMD64].audit}, ActEPERM},
		)
	} else {
		cases = append(cases, tc{"number -1", seccompData{nr: 0xffffffff, arch: arches[arch].audit}, ActAllow})
	}
	return cases
}

func TestDefault(t *testing.T) {
	for _, arch := range []Arch{AMD64, ARM64} {
		t.Run(string(arch), func(t *testing.T) {
			filter := compile(t, Default(), arch)
			for _, tt := range defaultCases(arch) {
				if got := runFilter(t, filter, tt.data); got != tt.want {
					t.Errorf("%s: filter(%+v) = %v, want %v", tt.name, tt.data, got, tt.want)
				}
			}
		})
	}
}

// TestDefaultNames checks Default denies every call it must, each with a
// one-line reason.
func TestDefaultNames(t *testing.T) {
	want := []string{
		"keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
		"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
		"open_by_handle_at", "name_to_handle_at", "iopl", "ioperm", "swapon", "swapoff",
		"reboot", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "acct",
		"lookup_dcookie", "vm86", "vm86old", "quotactl", "quotactl_fd",
		"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
		"mount", "umount2", "pivot_root", "syslog", "uselib", "ustat", "sysfs", "_sysctl",
		"nfsservctl", "io_uring_setup", "io_uring_enter", "io_uring_register",
		"unshare", "clone", "clone3", "personality", "ioctl",
	}
	var got []string
	for _, r := range Default().Rules() {
		got = append(got, r.Syscall)
		if r.Reason == "" || strings.Contains(r.Reason, "\n") {
			t.Errorf("rule for %s has reason %q, want one line", r.Syscall, r.Reason)
		}
		if r.Action == ActAllow || r.Action == ActKillProcess {
			t.Errorf("rule for %s: action %v, want an errno", r.Syscall, r.Action)
		}
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Default().Rules() names differ (-want +got):\n%s", diff)
	}
}

// decide is what a compiled filter must return, computed from the policy
// directly: the model the compiled filters are checked against.
func decide(rules []Rule, arch Arch, d seccompData) Action {
	info := arches[arch]
	if d.arch != info.audit || (info.x32 && d.nr&x32SyscallBit != 0) {
		return ActEPERM
	}
	for _, r := range rules {
		if nr, ok := info.nr[r.Syscall]; !ok || nr != d.nr {
			continue
		}
		if r.Arg.Op == OpNone {
			return r.Action
		}
		v := uint32(d.args[r.Arg.Index])
		var mask uint32
		for _, m := range r.Arg.Values {
			mask |= m
		}
		switch {
		case r.Arg.Op == OpIn && slices.Contains(r.Arg.Values, v),
			r.Arg.Op == OpNotIn && !slices.Contains(r.Arg.Values, v),
			r.Arg.Op == OpAnyBits && v&mask != 0:
			return r.Action
		}
		return ActAllow
	}
	return ActAllow
}

// testPolicies are policies the model check runs over.
func testPolicies() map[string]Policy {
	return map[string]Policy{
		"default": Default(),
		"zero":    {},
		"tuned": Default().Allow("ioctl", "mount").Deny("ptrace", "clone").With(
			Rule{Syscall: "socket", Action: ActErrno(97), Arg: ArgMatch{Index: 0, Op: OpNotIn, Values: []uint32{1, 2, 10}}},
			Rule{Syscall: "kill", Action: ActKillProcess, Arg: ArgMatch{Index: 1, Op: OpIn, Values: []uint32{9}}},
		),
	}
}

// TestCompileMatchesModel runs every number from 0 to 511 (and its x32
// twin) with interesting and random arguments through compiled filters
// and checks each against the model.
func TestCompileMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	interesting := []uint64{
		0, 1, sigchld, cloneNewUser, cloneNewUser | cloneNewNS, garbageHigh | cloneNewUser, perQuery, perLinux32,
		addrNoRandomize, tcgets, xfsIOCSwapext, garbageHigh | xfsIOCSwapext, xfsIOCExchangeRange, 9, 2, 97, 1 << 63,
	}
	for name, p := range testPolicies() {
		for _, arch := range []Arch{AMD64, ARM64} {
			t.Run(name+"/"+string(arch), func(t *testing.T) {
				prog, err := p.compile(arch)
				if err != nil {
					t.Fatalf("compile(%s) = %v", arch, err)
				}
				audit := arches[arch].audit
				rules := p.Rules()
				for nr := range uint32(512) {
					for _, n := range []uint32{nr, nr | x32SyscallBit} {
						for i := range 2 * len(interesting) {
							d := seccompData{nr: n, arch: audit}
							for j := range d.args {
								if i < len(interesting) {
									d.args[j] = interesting[(i+j)%len(interesting)]
								} else {
									d.args[j] = rng.Uint64() >> rng.IntN(64)
								}
							}
							got, _, err := run(prog, d.bytes())
							if want := decide(rules, arch, d); err != nil || Action(got) != want {
								t.Fatalf("filter(%+v) = %v, %v; want %v", d, Action(got), err, want)
							}
						}
					}
				}
			})
		}
	}
}

// FuzzCompiledFilter checks compiled filters against the model on any
// seccomp_data.
func FuzzCompiledFilter(f *testing.F) {
	f.Add(uint8(0), uint32(16), uint32(0xc000003e), uint64(3), uint64(xfsIOCSwapext), uint64(0))
	f.Add(uint8(1), uint32(56), uint32(0xc000003e), uint64(cloneNewUser), uint64(0), uint64(0))
	f.Add(uint8(2), uint32(92), uint32(0xc00000b7), uint64(addrNoRandomize), uint64(0), uint64(0))
	f.Add(uint8(3), uint32(x32SyscallBit|16), uint32(0xc000003e), uint64(0), uint64(0), uint64(0))
	type compiled struct {
		p    Policy
		arch Arch
		prog []insn
	}
	var filters []compiled
	for _, name := range []string{"default", "tuned"} {
		p := testPolicies()[name]
		for _, arch := range []Arch{AMD64, ARM64} {
			prog, err := p.compile(arch)
			if err != nil {
				f.Fatal(err)
			}
			filters = append(filters, compiled{p, arch, prog})
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, nr, arch uint32, a0, a1, a2 uint64) {
		c := filters[int(which)%len(filters)]
		if which&0x80 != 0 {
			arch = arches[c.arch].audit // mostly native calls
		}
		d := seccompData{nr: nr, arch: arch, args: [6]uint64{a0, a1, a2, a2, a1, a0}}
		got, _, err := run(c.prog, d.bytes())
		if want := decide(c.p.Rules(), c.arch, d); err != nil || Action(got) != want {
			t.Errorf("filter(%+v) on %s = %v, %v; want %v", d, c.arch, Action(got), err, want)
		}
	})
}

func TestDenyAllow(t *testing.T) {
	base := Default()
	tuned := base.Deny("ptrace", "clone", "vm86").Allow("mount", "keyctl", "not_a_call")
	tests := []struct {
		name string
		p    Policy
		data seccompData
		want Action
	}{
		{"Deny adds", tuned, call(AMD64, "ptrace"), ActEPERM},
		{"Deny replaces a conditional rule", tuned, call(AMD64, "clone", sigchld), ActEPERM},
		{"Allow removes", tuned, call(AMD64, "mount"), ActAllow},
		{"Allow removes too", tuned, call(AMD64, "keyctl"), ActAllow},
		{"others stay", tuned, call(AMD64, "umount2"), ActEPERM},
		{"receiver unchanged by Deny", base, call(AMD64, "ptrace"), ActAllow},
		{"receiver unchanged by Deny of a rule", base, call(AMD64, "clone", sigchld), ActAllow},
		{"receiver unchanged by Allow", base, call(AMD64, "mount"), ActEPERM},
		{"Allow of the zero policy", Policy{}.Allow("read"), call(AMD64, "mount"), ActAllow},
		{"Deny of the zero policy", Policy{}.Deny("read"), call(AMD64, "read"), ActEPERM},
		{"With an errno", Policy{}.With(Rule{Syscall: "socket", Action: ActErrno(97)}), call(AMD64, "socket", 16), ActErrno(97)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := runFilter(t, compile(t, tt.p, AMD64), tt.data); got != tt.want {
				t.Errorf("filter(%+v) = %v, want %v", tt.data, got, tt.want)
			}
		})
	}
}

func TestCompileErrors(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
		arch Arch
		want error
	}{
		{"unknown arch", Default(), "riscv64", errors.ErrUnsupported},
		{"empty arch", Default(), "", errors.ErrUnsupported},
		{"unknown call", Default().Deny("mkdri"), AMD64, errdefs.ErrInvalidArgument},
		{"empty name", Default().Deny(""), AMD64, errdefs.ErrInvalidArgument},
		{"bad action", Policy{}.With(Rule{Syscall: "read", Action: 0x12340000}), AMD64, errdefs.ErrInvalidArgument},
		{"errno too large", Policy{}.With(Rule{Syscall: "read", Action: ActErrno(4096)}), AMD64, errdefs.ErrInvalidArgument},
		{"bad op", Policy{}.With(Rule{Syscall: "read", Action: ActEPERM, Arg: ArgMatch{Op: 9, Values: []uint32{1}}}), AMD64, errdefs.ErrInvalidArgument},
		{"argument 6", Policy{}.With(Rule{Syscall: "read", Action: ActEPERM, Arg: ArgMatch{Index: 6, Op: OpIn, Values: []uint32{1}}}), AMD64, errdefs.ErrInvalidArgument},
		{"argument -1", Policy{}.With(Rule{Syscall: "read", Action: ActEPERM, Arg: ArgMatch{Index: -1, Op: OpIn, Values: []uint32{1}}}), AMD64, errdefs.ErrInvalidArgument},
		{"no values", Policy{}.With(Rule{Syscall: "read", Action: ActEPERM, Arg: ArgMatch{Op: OpNotIn}}), AMD64, errdefs.ErrInvalidArgument},
		{"zero mask", Policy{}.With(Rule{Syscall: "read", Action: ActEPERM, Arg: ArgMatch{Op: OpAnyBits, Values: []uint32{0}}}), AMD64, errdefs.ErrInvalidArgument},
		{"too long", Policy{}.With(Rule{Syscall: "read", Action: ActEPERM, Arg: ArgMatch{Op: OpIn, Values: make([]uint32, MaxInsns)}}), AMD64, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if b, err := tt.p.Compile(tt.arch); !errors.Is(err, tt.want) {
				t.Errorf("Compile(%q) = %d bytes, %v; want %v", tt.arch, len(b), err, tt.want)
			}
		})
	}
}

// TestCompileSkipsAbsentCalls checks a call that exists elsewhere is
// skipped, not an error, on an architecture without it.
func TestCompileSkipsAbsentCalls(t *testing.T) {
	a, err := Policy{}.Compile(ARM64)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Policy{}.Deny("ustat", "iopl", "vm86").Compile(ARM64)
	if err != nil || !slices.Equal(a, b) {
		t.Errorf("Compile(arm64) of calls arm64 lacks = %d bytes, %v; want the %d bytes of the empty policy", len(b), err, len(a))
	}
}

func TestCompileNative(t *testing.T) {
	if _, ok := arches[NativeArch()]; !ok {
		t.Skipf("no table for %s", NativeArch())
	}
	if _, err := Default().Compile(NativeArch()); err != nil {
		t.Errorf("Default().Compile(%s) = %v", NativeArch(), err)
	}
}

// TestSize reports and bounds the length of the default filter.
func TestSize(t *testing.T) {
	if MaxInsns != nsexec.MaxSeccompInsns {
		t.Errorf("MaxInsns = %d, want nsexec.MaxSeccompInsns = %d", MaxInsns, nsexec.MaxSeccompInsns)
	}
	for _, arch := range []Arch{AMD64, ARM64} {
		b := compile(t, Default(), arch)
		n := len(b) / insnSize
		t.Logf("Default().Compile(%s): %d instructions", arch, n)
		if n > 200 {
			t.Errorf("Default().Compile(%s) = %d instructions, want at most 200 (the limit is %d)", arch, n, nsexec.MaxSeccompInsns)
		}
		// The path of an allowed call is what every system call pays
		// for when the kernel's action cache cannot help.
		prog, _ := decode(b)
		_, steps, err := run(prog, call(arch, "read").bytes())
		t.Logf("Default().Compile(%s): read runs %d instructions", arch, steps)
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestXFSIoctlNumbers(t *testing.T) {
	// The values xfs_fs.h yields on x86_64 and arm64.
	if xfsIOCSwapext != 0xc0c0586d {
		t.Errorf("XFS_IOC_SWAPEXT = %#x, want 0xc0c0586d", xfsIOCSwapext)
	}
	if xfsIOCExchangeRange != 0x40285881 {
		t.Errorf("XFS_IOC_EXCHANGE_RANGE = %#x, want 0x40285881", xfsIOCExchangeRange)
	}
}

func TestActionString(t *testing.T) {
	tests := []struct {
		a    Action
		want string
	}{
		{ActAllow, "allow"},
		{ActKillProcess, "kill-process"},
		{ActEPERM, "errno EPERM"},
		{ActENOSYS, "errno ENOSYS"},
		{ActErrno(13), "errno 13"},
		{0x7ff00000, "action 0x7ff00000"},
	}
	for _, tt := range tests {
		if got := tt.a.String(); got != tt.want {
			t.Errorf("Action(%#x).String() = %q, want %q", uint32(tt.a), got, tt.want)
		}
	}
}

// TestGolden keeps a disassembly of the default filters in testdata, so a
// change of the policy shows in review as a change of the filter.
func TestGolden(t *testing.T) {
	for _, arch := range []Arch{AMD64, ARM64} {
		t.Run(string(arch), func(t *testing.T) {
			prog, err := Default().compile(arch)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			fmt.Fprintf(&b, "# Default().Compile(%s): %d instructions. Regenerate: go test ./internal/seccomp -run Golden -update\n", arch, len(prog))
			b.WriteString(disasm(prog, arch))
			path := filepath.Join("testdata", "default_"+string(arch)+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), b.String()); diff != "" {
				t.Errorf("Default().Compile(%s) differs from %s (-want +got); run with -update if intended:\n%s", arch, path, diff)
			}
		})
	}
}

// TestPolicyIsAValue checks that changing what With took or Rules returned
// does not change the policy.
func TestPolicyIsAValue(t *testing.T) {
	values := []uint32{9}
	p := Policy{}.With(Rule{Syscall: "kill", Action: ActEPERM, Arg: ArgMatch{Index: 1, Op: OpIn, Values: values}})
	values[0] = 15
	for _, r := range p.Rules() {
		r.Arg.Values[0] = 15
	}
	filter := compile(t, p, AMD64)
	if got := runFilter(t, filter, call(AMD64, "kill", 1, 9)); got != ActEPERM {
		t.Errorf("filter(kill(1, 9)) = %v, want %v", got, ActEPERM)
	}
	if got := runFilter(t, filter, call(AMD64, "kill", 1, 15)); got != ActAllow {
		t.Errorf("filter(kill(1, 15)) = %v, want %v", got, ActAllow)
	}
}
