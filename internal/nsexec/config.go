package nsexec

import (
	"encoding/binary"
	"fmt"
	"math"
	"path"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// ModeEnv is the environment variable that selects what the C part of the
// binary does before the Go runtime starts: "init", "exec" or "zygote".
// Unset or empty lets the program start normally.
const ModeEnv = "_DSEC_NSEXEC"

// InitEnv returns the environment that makes a binary importing this package
// act as a sandbox init. The init reads the sandbox's seccomp filter (a
// compiled filter, as ExecConfig.Seccomp) from descriptor InitFilterFD and
// installs it before anything else; without one it exits.
func InitEnv() []string { return []string{ModeEnv + "=init"} }

// InitFilterFD is the init's descriptor of its seccomp filter.
const InitFilterFD = 4

// Limit is one limit of a user namespace: the name of a file in
// /proc/sys/user ("max_inotify_instances") and its value (NewUserNS).
type Limit struct {
	Name  string
	Value uint64
}

// PauseEnv returns the environment of a process that only waits, with
// every signal blocked (SIGKILL ends it): a holder of namespaces.
func PauseEnv() []string { return []string{ModeEnv + "=pause"} }

// Limits of an encoded configuration; the C decoder enforces the same.
const (
	// MaxConfigSize bounds an encoded ExecConfig.
	MaxConfigSize = 1 << 20
	// MaxGroups bounds ExecConfig.Groups (the kernel's NGROUPS_MAX).
	MaxGroups = 65536
	// MaxSeccompInsns bounds the seccomp filter (the kernel's BPF_MAXINSNS).
	MaxSeccompInsns = 4096
	// SockFilterSize is the size of one struct sock_filter.
	SockFilterSize = 8
)

// Record tags of the encoded configuration. Keep in sync with the enum in
// nsexec_linux.c. New tags take new numbers; numbers are never reused.
const (
	tagPid         = 1  // u32, once, required
	tagCgroupProcs = 2  // string, repeatable, in order
	tagUID         = 3  // u32, once
	tagGID         = 4  // u32, once
	tagGroups      = 5  // u32 array, once
	tagCwd         = 6  // string, once
	tagArg         = 7  // string, repeatable, at least once
	tagEnv         = 8  // string, repeatable
	tagKeepCaps    = 9  // u64, once
	tagNoNewPrivs  = 10 // empty, once
	tagSeccomp     = 11 // struct sock_filter array, once
	tagSetsid      = 12 // empty, once
	tagTTY         = 13 // empty, once
	tagMntNS       = 14 // string, once
)

// recordHeaderSize is the size of a record's tag and length.
const recordHeaderSize = 6

// ExecConfig describes one command to start inside a running sandbox.
// The zero value of every optional field means "not asked for".
type ExecConfig struct {
	// Pid is the host pid of a process inside the sandbox (its init) whose
	// namespaces the command joins. Required.
	Pid int
	// CgroupProcs are cgroup.procs files the helper writes its pid to, in
	// order, before anything else.
	CgroupProcs []string
	// UID, GID and Groups are the command's credentials as seen inside the
	// sandbox's user namespace. Groups empty clears supplementary groups.
	UID, GID uint32
	Groups   []uint32
	// Cwd is the absolute working directory inside the sandbox; empty
	// means "/".
	Cwd string
	// Argv is the command line; Argv[0] without a '/' is looked up in the
	// PATH of Env. Required.
	Argv []string
	// Env is the command's whole environment, KEY=VALUE.
	Env []string
	// KeepCaps is the capability bounding set to keep (bit n is capability
	// n); every other capability is dropped. Zero drops all.
	KeepCaps uint64
	// NoNewPrivs sets PR_SET_NO_NEW_PRIVS before the command starts.
	NoNewPrivs bool
	// Seccomp is a raw array of struct sock_filter in the host's byte
	// order; empty installs no filter. Without NoNewPrivs the filter is
	// installed before the credentials change (it must then allow
	// setgroups, setresgid, setresuid, chdir and execve), with it just
	// before execve.
	Seccomp []byte
	// Setsid makes the command a session leader.
	Setsid bool
	// TTY makes descriptor 0 (a terminal) the command's controlling
	// terminal. It needs Setsid.
	TTY bool
	// MountNS, when set, is the absolute path of a mount namespace file
	// (/proc/PID/task/TID/ns/mnt) the command enters instead of the
	// target's: before the target's user namespace, so it may be one the
	// sandbox has no power over (a sealed exec's).
	MountNS string
}

// validate checks what Encode and DecodeExecConfig both require.
func (c ExecConfig) validate() error {
	switch {
	case c.Pid <= 0 || c.Pid > math.MaxInt32:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: target pid %d is out of range", c.Pid)
	case len(c.Argv) == 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: the command is empty: give at least the program to run")
	case c.Argv[0] == "":
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: the program name is empty")
	case c.UID == math.MaxUint32 || c.GID == math.MaxUint32:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: user %d:%d is not a valid user and group", c.UID, c.GID)
	case len(c.Groups) > MaxGroups:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: %d supplementary groups are more than the limit of %d", len(c.Groups), MaxGroups)
	case c.Cwd != "" && !path.IsAbs(c.Cwd):
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: working directory %q is not absolute: start it with /", c.Cwd)
	case len(c.Seccomp)%SockFilterSize != 0 || len(c.Seccomp) > MaxSeccompInsns*SockFilterSize:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: seccomp filter of %d bytes is not 1 to %d instructions of %d bytes", len(c.Seccomp), MaxSeccompInsns, SockFilterSize)
	case c.MountNS != "" && !path.IsAbs(c.MountNS):
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: mount namespace file %q is not absolute", c.MountNS)
	case c.TTY && !c.Setsid:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: a controlling terminal needs a new session (set Setsid)")
	}
	for _, g := range c.Groups {
		if g == math.MaxUint32 {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: group %d is not a valid group", g)
		}
	}
	for _, p := range c.CgroupProcs {
		if !path.IsAbs(p) {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: cgroup file %q is not absolute", p)
		}
	}
	check := func(what string, ss ...string) error {
		for _, s := range ss {
			if strings.IndexByte(s, 0) >= 0 {
				return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: %s %q contains a NUL byte", what, s)
			}
		}
		return nil
	}
	if err := check("cgroup file", c.CgroupProcs...); err != nil {
		return err
	}
	if err := check("mount namespace file", c.MountNS); err != nil {
		return err
	}
	if err := check("working directory", c.Cwd); err != nil {
		return err
	}
	if err := check("argument", c.Argv...); err != nil {
		return err
	}
	return check("environment variable", c.Env...)
}

// Encode validates c and returns its wire form for the helper.
func (c ExecConfig) Encode() ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	var e encoder
	e.u32(tagPid, uint32(c.Pid))
	for _, p := range c.CgroupProcs {
		e.str(tagCgroupProcs, p)
	}
	e.u32(tagUID, c.UID)
	e.u32(tagGID, c.GID)
	if len(c.Groups) > 0 {
		b := make([]byte, 0, 4*len(c.Groups))
		for _, g := range c.Groups {
			b = binary.LittleEndian.AppendUint32(b, g)
		}
		e.record(tagGroups, b)
	}
	if c.Cwd != "" {
		e.str(tagCwd, c.Cwd)
	}
	for _, a := range c.Argv {
		e.str(tagArg, a)
	}
	for _, v := range c.Env {
		e.str(tagEnv, v)
	}
	e.record(tagKeepCaps, binary.LittleEndian.AppendUint64(nil, c.KeepCaps))
	if c.NoNewPrivs {
		e.record(tagNoNewPrivs, nil)
	}
	if len(c.Seccomp) > 0 {
		e.record(tagSeccomp, c.Seccomp)
	}
	if c.Setsid {
		e.record(tagSetsid, nil)
	}
	if c.TTY {
		e.record(tagTTY, nil)
	}
	if c.MountNS != "" {
		e.str(tagMntNS, c.MountNS)
	}
	if len(e.b) > MaxConfigSize {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "exec: command line and environment take %d bytes, more than the limit of %d", len(e.b), MaxConfigSize)
	}
	return e.b, nil
}

type encoder struct{ b []byte }

func (e *encoder) record(tag uint16, payload []byte) {
	e.b = binary.LittleEndian.AppendUint16(e.b, tag)
	e.b = binary.LittleEndian.AppendUint32(e.b, uint32(len(payload)))
	e.b = append(e.b, payload...)
}

func (e *encoder) str(tag uint16, s string) { e.record(tag, []byte(s)) }

func (e *encoder) u32(tag uint16, v uint32) {
	e.record(tag, binary.LittleEndian.AppendUint32(nil, v))
}

// DecodeExecConfig parses the wire form that Encode produces, with the
// rules of the C decoder: unknown tags, repeated single records and
// payloads of the wrong size are errors. It serves tests and tools; the
// helper has its own decoder.
func DecodeExecConfig(b []byte) (ExecConfig, error) {
	var c ExecConfig
	if len(b) > MaxConfigSize {
		return c, decodeErr("config of %d bytes exceeds %d", len(b), MaxConfigSize)
	}
	seen := map[uint16]bool{}
	for len(b) > 0 {
		if len(b) < recordHeaderSize {
			return c, decodeErr("truncated record header")
		}
		tag := binary.LittleEndian.Uint16(b)
		n := binary.LittleEndian.Uint32(b[2:])
		b = b[recordHeaderSize:]
		if uint64(n) > uint64(len(b)) {
			return c, decodeErr("record %d: length %d exceeds the %d bytes left", tag, n, len(b))
		}
		p := b[:n]
		b = b[n:]
		switch tag {
		case tagCgroupProcs, tagArg, tagEnv:
		default:
			if seen[tag] {
				return c, decodeErr("record %d repeated", tag)
			}
			seen[tag] = true
		}
		var err error
		switch tag {
		case tagPid:
			var v uint32
			v, err = payloadU32(tag, p)
			c.Pid = int(v)
		case tagCgroupProcs:
			c.CgroupProcs = append(c.CgroupProcs, string(p))
		case tagUID:
			c.UID, err = payloadU32(tag, p)
		case tagGID:
			c.GID, err = payloadU32(tag, p)
		case tagGroups:
			if len(p) == 0 || len(p)%4 != 0 {
				return c, decodeErr("record %d: length %d is not a positive multiple of 4", tag, len(p))
			}
			c.Groups = make([]uint32, 0, len(p)/4)
			for i := 0; i < len(p); i += 4 {
				c.Groups = append(c.Groups, binary.LittleEndian.Uint32(p[i:]))
			}
		case tagCwd:
			if len(p) == 0 {
				return c, decodeErr("record %d: empty working directory", tag)
			}
			c.Cwd = string(p)
		case tagArg:
			c.Argv = append(c.Argv, string(p))
		case tagEnv:
			c.Env = append(c.Env, string(p))
		case tagKeepCaps:
			if len(p) != 8 {
				return c, decodeErr("record %d: length %d, want 8", tag, len(p))
			}
			c.KeepCaps = binary.LittleEndian.Uint64(p)
		case tagNoNewPrivs, tagSetsid, tagTTY:
			if len(p) != 0 {
				return c, decodeErr("record %d: flag with a payload of %d bytes", tag, len(p))
			}
			switch tag {
			case tagNoNewPrivs:
				c.NoNewPrivs = true
			case tagSetsid:
				c.Setsid = true
			default:
				c.TTY = true
			}
		case tagMntNS:
			if len(p) == 0 {
				return c, decodeErr("record %d: empty mount namespace file", tag)
			}
			c.MountNS = string(p)
		case tagSeccomp:
			if len(p) == 0 {
				return c, decodeErr("record %d: empty seccomp filter", tag)
			}
			c.Seccomp = append([]byte(nil), p...)
		default:
			return c, decodeErr("unknown record tag %d", tag)
		}
		if err != nil {
			return c, err
		}
	}
	if !seen[tagPid] {
		return c, decodeErr("no target pid")
	}
	if err := c.validate(); err != nil {
		return c, err
	}
	return c, nil
}

func payloadU32(tag uint16, p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, decodeErr("record %d: length %d, want 4", tag, len(p))
	}
	return binary.LittleEndian.Uint32(p), nil
}

func decodeErr(format string, args ...any) error {
	return fmt.Errorf("decode exec config: %s: %w", fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}
