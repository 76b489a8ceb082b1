package seccomp

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Action is what the kernel does with a call a rule matches: a
// SECCOMP_RET_* value.
type Action uint32

// retErrno is SECCOMP_RET_ERRNO; its low 16 bits are the errno.
const retErrno = 0x00050000

// Linux errno values the package names (the same on every architecture it
// supports).
const (
	errnoEPERM  = 1
	errnoENOSYS = 38
)

// Actions.
const (
	ActAllow       Action = 0x7fff0000             // SECCOMP_RET_ALLOW: run the call
	ActKillProcess Action = 0x80000000             // SECCOMP_RET_KILL_PROCESS: kill the process with SIGSYS
	ActEPERM       Action = retErrno | errnoEPERM  // fail the call with EPERM
	ActENOSYS      Action = retErrno | errnoENOSYS // fail the call with ENOSYS, as if the kernel lacked it
)

// ActErrno returns the action that fails a call with errno (a Linux errno
// number, at most 4095) without running it.
func ActErrno(errno uint16) Action { return retErrno | Action(errno) }

func (a Action) String() string {
	switch {
	case a == ActAllow:
		return "allow"
	case a == ActKillProcess:
		return "kill-process"
	case a == ActEPERM:
		return "errno EPERM"
	case a == ActENOSYS:
		return "errno ENOSYS"
	case a&0xffff0000 == retErrno:
		return fmt.Sprintf("errno %d", a&0xffff)
	}
	return fmt.Sprintf("action %#x", uint32(a))
}

// valid reports whether a is an action the kernel knows.
func (a Action) valid() bool {
	switch a & 0xffff0000 {
	case 0x80000000, 0x00000000, 0x00030000, 0x7ff00000, 0x7fc00000, 0x7fff0000:
		// KILL_PROCESS, KILL_THREAD, TRAP, LOG, USER_NOTIF, ALLOW
		return true
	case retErrno:
		return a&0xffff <= 4095 // MAX_ERRNO
	}
	return false
}

// Op is how an ArgMatch compares an argument.
type Op uint8

// Ops. Each compares the low 32 bits of the argument.
const (
	OpNone    Op = iota // no condition: the rule matches every call
	OpIn                // the argument equals one of Values
	OpNotIn             // the argument equals none of Values
	OpAnyBits           // the argument has any bit of the OR of Values set
)

// ArgMatch limits a rule to the calls whose argument Index matches.
//
// Only the argument's low 32 bits are compared. That is exact for the int
// and unsigned int arguments rules are meant for (ioctl's cmd, clone's and
// unshare's flags, personality's persona), which the kernel itself
// truncates to 32 bits: a caller cannot pass a value with a different high
// word to slip past a rule. It is wrong for pointer and 64-bit arguments,
// which no rule should look at.
type ArgMatch struct {
	Index  int      // argument number, 0 to 5
	Op     Op       // OpNone: every call matches
	Values []uint32 // what Op compares with; at least one unless OpNone
}

// Rule says what happens to one system call.
type Rule struct {
	// Syscall is the call's name (as in the kernel's syscall table:
	// "umount2", "_sysctl").
	Syscall string
	// Action is what the filter returns for a matching call; calls the
	// rule's Arg does not match are allowed.
	Action Action
	// Arg, unless its Op is OpNone, limits the rule to some calls.
	Arg ArgMatch
	// Reason says in one line why the rule exists.
	Reason string
}

func (r Rule) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("seccomp: rule for %q: %s: %w", r.Syscall, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
	}
	switch {
	case !knownSyscall(r.Syscall):
		return bad("no such system call in this package's tables (add it to arch.go)")
	case !r.Action.valid():
		return bad("%v is not a seccomp action", r.Action)
	case r.Arg.Op > OpAnyBits:
		return bad("unknown argument comparison %d", r.Arg.Op)
	case r.Arg.Op != OpNone && (r.Arg.Index < 0 || r.Arg.Index > 5):
		return bad("argument %d does not exist (0 to 5)", r.Arg.Index)
	case r.Arg.Op != OpNone && len(r.Arg.Values) == 0:
		return bad("argument comparison without values")
	case r.Arg.Op == OpAnyBits && !slices.ContainsFunc(r.Arg.Values, func(v uint32) bool { return v != 0 }):
		return bad("a bit mask of 0 matches no call")
	}
	return nil
}

// Policy is a set of rules, at most one per system call; every call no
// rule names is allowed. The zero Policy allows everything (but calls of
// foreign ABIs, which every compiled filter denies). Policies are values:
// the methods return modified copies and never change their receiver.
type Policy struct {
	rules map[string]Rule // by Rule.Syscall; never written after the Policy is made
}

// With returns p with rules added, each replacing p's rule for the same
// system call.
func (p Policy) With(rules ...Rule) Policy {
	m := maps.Clone(p.rules)
	if m == nil {
		m = make(map[string]Rule, len(rules))
	}
	for _, r := range rules {
		r.Arg.Values = slices.Clone(r.Arg.Values)
		m[r.Syscall] = r
	}
	return Policy{rules: m}
}

// Deny returns p with every call of each named system call failing with
// EPERM, whatever rule p had for it.
func (p Policy) Deny(names ...string) Policy {
	rules := make([]Rule, len(names))
	for i, n := range names {
		rules[i] = Rule{Syscall: n, Action: ActEPERM, Reason: "denied by Policy.Deny"}
	}
	return p.With(rules...)
}

// Allow returns p without rules for the named system calls, so they are
// allowed.
func (p Policy) Allow(names ...string) Policy {
	m := maps.Clone(p.rules)
	for _, n := range names {
		delete(m, n)
	}
	return Policy{rules: m}
}

// Rules returns a copy of p's rules sorted by system call name.
func (p Policy) Rules() []Rule {
	rules := slices.SortedFunc(maps.Values(p.rules), func(a, b Rule) int { return cmp.Compare(a.Syscall, b.Syscall) })
	for i := range rules {
		rules[i].Arg.Values = slices.Clone(rules[i].Arg.Values)
	}
	return rules
}

// Offsets in struct seccomp_data (linux/seccomp.h): int nr; __u32 arch;
// __u64 instruction_pointer; __u64 args[6].
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// argLow is the offset of the low 32 bits of argument i, on the
// little-endian architectures Compile supports.
func argLow(i int) uint32 { return offArgs + 8*uint32(i) }

// Compile returns p as a seccomp filter for arch: an array of struct
// sock_filter, little endian, as nsexec.ExecConfig.Seccomp takes it. It
// fails with errdefs.ErrInvalidArgument for a rule it cannot compile and
// with errors.ErrUnsupported for an architecture it has no table for.
//
// The filter denies with EPERM every call made through another ABI than
// arch's native one, then compares the call's number with every rule's
// system call in turn; rules for calls arch does not have are skipped.
func (p Policy) Compile(arch Arch) ([]byte, error) {
	prog, err := p.compile(arch)
	if err != nil {
		return nil, err
	}
	return encode(prog), nil
}

func (p Policy) compile(arch Arch) ([]insn, error) {
	info, err := lookupArch(arch)
	if err != nil {
		return nil, err
	}
	type numbered struct {
		Rule
		nr uint32
	}
	var rules []numbered
	for _, r := range p.Rules() {
		if err := r.validate(); err != nil {
			return nil, err
		}
		if nr, ok := info.nr[r.Syscall]; ok {
			rules = append(rules, numbered{r, nr})
		}
	}
	slices.SortFunc(rules, func(a, b numbered) int { return cmp.Compare(a.nr, b.nr) })

	// Each action's ret is emitted once, at the end; jumps go to its label.
	var acts []Action
	act := func(x Action) string {
		if !slices.Contains(acts, x) {
			acts = append(acts, x)
		}
		return fmt.Sprintf("ret %#x", uint32(x))
	}
	var a asm
	a.ld(offArch)
	a.jeq(info.audit, "", act(ActEPERM))
	a.ld(offNr)
	if info.x32 {
		a.jset(x32SyscallBit, act(ActEPERM), "")
	}
	for _, r := range rules {
		if r.Arg.Op == OpNone {
			a.jeq(r.nr, act(r.Action), "")
		} else {
			a.jeq(r.nr, "rule "+r.Syscall, "")
		}
	}
	a.ret(uint32(ActAllow)) // most calls end here
	for _, r := range rules {
		if r.Arg.Op == OpNone {
			continue
		}
		a.label("rule " + r.Syscall)
		a.ld(argLow(r.Arg.Index))
		hit, miss := act(r.Action), act(ActAllow)
		switch r.Arg.Op {
		case OpIn, OpNotIn:
			if r.Arg.Op == OpNotIn {
				hit, miss = miss, hit
			}
			for i, v := range r.Arg.Values {
				next := ""
				if i == len(r.Arg.Values)-1 {
					next = miss
				}
				a.jeq(v, hit, next)
			}
		case OpAnyBits:
			var mask uint32
			for _, v := range r.Arg.Values {
				mask |= v
			}
			a.jset(mask, hit, miss)
		}
	}
	for _, x := range acts {
		a.label(act(x))
		a.ret(uint32(x))
	}
	prog, err := a.assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: compile for %s: %w", arch, err)
	}
	return prog, nil
}
