package nsexec

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func fullConfig() ExecConfig {
	return ExecConfig{
		Pid:         4242,
		CgroupProcs: []string{"/sys/fs/cgroup/pids/a/cgroup.procs", "/sys/fs/cgroup/unified/a/cgroup.procs"},
		UID:         1000,
		GID:         100,
		Groups:      []uint32{10, 20},
		Cwd:         "/work dir",
		Argv:        []string{"sh", "-c", "", "echo $HOME"},
		Env:         []string{"PATH=/bin", "HOME=/root", "EMPTY="},
		KeepCaps:    DefaultCaps,
		NoNewPrivs:  true,
		Seccomp:     make([]byte, 3*SockFilterSize),
		Setsid:      true,
		TTY:         true,
		MountNS:     "/proc/1/task/2/ns/mnt",
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		cfg  ExecConfig
	}{
		{"minimal", ExecConfig{Pid: 1, Argv: []string{"true"}}},
		{"full", fullConfig()},
		{"max pid", ExecConfig{Pid: 1<<31 - 1, Argv: []string{"/bin/true"}, UID: 1<<32 - 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.cfg.Encode()
			if err != nil {
				t.Fatalf("Encode(%+v) = %v, want nil", tt.cfg, err)
			}
			got, err := DecodeExecConfig(b)
			if err != nil {
				t.Fatalf("DecodeExecConfig(Encode(%+v)) = %v, want nil", tt.cfg, err)
			}
			if diff := cmp.Diff(tt.cfg, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("DecodeExecConfig(Encode(cfg)) differs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEncodeWireFormat(t *testing.T) {
	cfg := ExecConfig{Pid: 0x01020304, Argv: []string{"ab"}, Setsid: true}
	got, err := cfg.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{
		1, 0, 4, 0, 0, 0, 4, 3, 2, 1, // pid
		3, 0, 4, 0, 0, 0, 0, 0, 0, 0, // uid
		4, 0, 4, 0, 0, 0, 0, 0, 0, 0, // gid
		7, 0, 2, 0, 0, 0, 'a', 'b', // argv
		9, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // keep caps
		12, 0, 0, 0, 0, 0, // setsid
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Encode(%+v) differs (-want +got):\n%s", cfg, diff)
	}
}

func TestEncodeInvalid(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*ExecConfig)
	}{
		{"no pid", func(c *ExecConfig) { c.Pid = 0 }},
		{"negative pid", func(c *ExecConfig) { c.Pid = -1 }},
		{"huge pid", func(c *ExecConfig) { c.Pid = 1 << 31 }},
		{"no argv", func(c *ExecConfig) { c.Argv = nil }},
		{"empty program", func(c *ExecConfig) { c.Argv = []string{""} }},
		{"NUL in arg", func(c *ExecConfig) { c.Argv = append(c.Argv, "a\x00b") }},
		{"NUL in env", func(c *ExecConfig) { c.Env = []string{"A=\x00"} }},
		{"NUL in cwd", func(c *ExecConfig) { c.Cwd = "/a\x00" }},
		{"NUL in cgroup", func(c *ExecConfig) { c.CgroupProcs = []string{"/a\x00"} }},
		{"relative cwd", func(c *ExecConfig) { c.Cwd = "tmp" }},
		{"relative cgroup", func(c *ExecConfig) { c.CgroupProcs = []string{"cgroup.procs"} }},
		{"uid -1", func(c *ExecConfig) { c.UID = 1<<32 - 1 }},
		{"gid -1", func(c *ExecConfig) { c.GID = 1<<32 - 1 }},
		{"group -1", func(c *ExecConfig) { c.Groups = []uint32{1<<32 - 1} }},
		{"too many groups", func(c *ExecConfig) { c.Groups = make([]uint32, MaxGroups+1) }},
		{"seccomp not whole", func(c *ExecConfig) { c.Seccomp = make([]byte, 7) }},
		{"seccomp too long", func(c *ExecConfig) { c.Seccomp = make([]byte, (MaxSeccompInsns+1)*SockFilterSize) }},
		{"tty without setsid", func(c *ExecConfig) { c.Setsid = false }},
		{"relative mount namespace", func(c *ExecConfig) { c.MountNS = "ns/mnt" }},
		{"NUL in mount namespace", func(c *ExecConfig) { c.MountNS = "/proc/1/ns/mnt\x00" }},
		{"too large", func(c *ExecConfig) { c.Env = []string{strings.Repeat("x", MaxConfigSize)} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := fullConfig()
			tt.modify(&cfg)
			b, err := cfg.Encode()
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Encode(%s) = %d bytes, %v, want %v", tt.name, len(b), err, errdefs.ErrInvalidArgument)
			}
		})
	}
}

// rec builds one record of the wire format.
func rec(tag uint16, payload ...byte) []byte {
	b := binary.LittleEndian.AppendUint16(nil, tag)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

func cat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

var (
	pidRec = rec(tagPid, 1, 0, 0, 0)
	argRec = rec(tagArg, 's', 'h')
)

// badConfigs are wire forms both decoders must reject.
var badConfigs = []struct {
	name string
	in   []byte
}{
	{"empty", nil},
	{"no pid", argRec},
	{"no argv", pidRec},
	{"short header", cat(pidRec, argRec, []byte{1, 0, 0})},
	{"length past end", cat(pidRec, argRec, []byte{6, 0, 9, 0, 0, 0, '/'})},
	{"huge length", cat(pidRec, argRec, []byte{6, 0, 0xff, 0xff, 0xff, 0xff})},
	{"unknown tag", cat(pidRec, argRec, rec(99))},
	{"tag zero", cat(pidRec, argRec, rec(0))},
	{"repeated pid", cat(pidRec, pidRec, argRec)},
	{"repeated uid", cat(pidRec, argRec, rec(tagUID, 0, 0, 0, 0), rec(tagUID, 0, 0, 0, 0))},
	{"repeated setsid", cat(pidRec, argRec, rec(tagSetsid), rec(tagSetsid))},
	{"short pid", cat(rec(tagPid, 1, 0, 0), argRec)},
	{"pid zero", cat(rec(tagPid, 0, 0, 0, 0), argRec)},
	{"pid over int32", cat(rec(tagPid, 0, 0, 0, 0x80), argRec)},
	{"uid -1", cat(pidRec, argRec, rec(tagUID, 0xff, 0xff, 0xff, 0xff))},
	{"group -1", cat(pidRec, argRec, rec(tagGroups, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff))},
	{"groups not multiple of 4", cat(pidRec, argRec, rec(tagGroups, 1, 0, 0))},
	{"empty groups", cat(pidRec, argRec, rec(tagGroups))},
	{"empty cwd", cat(pidRec, argRec, rec(tagCwd))},
	{"relative cwd", cat(pidRec, argRec, rec(tagCwd, 'a'))},
	{"relative cgroup", cat(pidRec, argRec, rec(tagCgroupProcs, 'a'))},
	{"short caps", cat(pidRec, argRec, rec(tagKeepCaps, 1, 2, 3, 4))},
	{"flag with payload", cat(pidRec, argRec, rec(tagSetsid, 1))},
	{"tty without setsid", cat(pidRec, argRec, rec(tagTTY))},
	{"seccomp not whole", cat(pidRec, argRec, rec(tagSeccomp, 1, 2, 3))},
	{"empty seccomp", cat(pidRec, argRec, rec(tagSeccomp))},
	{"NUL in arg", cat(pidRec, rec(tagArg, 'a', 0))},
	{"NUL in env", cat(pidRec, argRec, rec(tagEnv, 'a', 0))},
	{"empty program", cat(pidRec, rec(tagArg))},
	{"too large", cat(pidRec, argRec, rec(tagEnv, make([]byte, MaxConfigSize)...))},
}

func TestDecodeInvalid(t *testing.T) {
	for _, tt := range badConfigs {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeExecConfig(tt.in)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("DecodeExecConfig(%s) = %+v, %v, want %v", tt.name, got, err, errdefs.ErrInvalidArgument)
			}
		})
	}
}

func TestDecodeRecordOrder(t *testing.T) {
	// Repeatable records keep their order and may interleave with others.
	in := cat(
		rec(tagArg, 'a'), rec(tagEnv, 'X', '='), rec(tagCgroupProcs, '/', '1'),
		rec(tagPid, 7, 0, 0, 0), rec(tagArg, 'b'), rec(tagCgroupProcs, '/', '2'),
		rec(tagArg), rec(tagEnv, 'Y', '='),
	)
	got, err := DecodeExecConfig(in)
	if err != nil {
		t.Fatalf("DecodeExecConfig = %v, want nil", err)
	}
	want := ExecConfig{Pid: 7, Argv: []string{"a", "b", ""}, Env: []string{"X=", "Y="}, CgroupProcs: []string{"/1", "/2"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DecodeExecConfig differs (-want +got):\n%s", diff)
	}
}

func TestInitEnv(t *testing.T) {
	if got, want := InitEnv(), []string{"_DSEC_NSEXEC=init"}; !cmp.Equal(got, want) {
		t.Errorf("InitEnv() = %q, want %q", got, want)
	}
}

// FuzzDecodeExecConfig checks that decoding never panics and that whatever
// decodes re-encodes to the same configuration.
func FuzzDecodeExecConfig(f *testing.F) {
	for _, c := range []ExecConfig{{Pid: 1, Argv: []string{"true"}}, fullConfig()} {
		b, err := c.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(cat(rec(tagPid, 1, 0, 0, 0), rec(tagArg, 'x'), rec(tagGroups, 1, 2, 3, 4, 5, 6, 7, 8)))
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg, err := DecodeExecConfig(in)
		if err != nil {
			return
		}
		b, err := cfg.Encode()
		if err != nil {
			t.Fatalf("Encode(DecodeExecConfig(%q)) = %v, want nil", in, err)
		}
		again, err := DecodeExecConfig(b)
		if err != nil {
			t.Fatalf("DecodeExecConfig(Encode(%+v)) = %v, want nil", cfg, err)
		}
		if diff := cmp.Diff(cfg, again, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("round trip differs (-first +second):\n%s", diff)
		}
	})
}

// FuzzEncodeExecConfig checks that every configuration Encode accepts
// decodes to itself.
func FuzzEncodeExecConfig(f *testing.F) {
	f.Add(1, "/bin/sh", "-c", "PATH=/bin", "/", "/sys/fs/cgroup/x/cgroup.procs", uint32(0), uint32(0), uint32(10), uint64(DefaultCaps), []byte{}, true, false)
	f.Add(99, "true", "", "", "", "", uint32(1), uint32(2), uint32(3), uint64(0), make([]byte, 8), false, true)
	f.Fuzz(func(t *testing.T, pid int, argv0, arg1, env, cwd, cgroup string, uid, gid, group uint32, caps uint64, seccomp []byte, nnp, tty bool) {
		cfg := ExecConfig{
			Pid: pid, Argv: []string{argv0, arg1}, Env: []string{env}, Cwd: cwd,
			UID: uid, GID: gid, Groups: []uint32{group, uid}, KeepCaps: caps,
			Seccomp: seccomp, NoNewPrivs: nnp, Setsid: tty || nnp, TTY: tty,
		}
		if cgroup != "" {
			cfg.CgroupProcs = []string{cgroup}
		}
		b, err := cfg.Encode()
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Encode(%+v) = %v, want nil or %v", cfg, err, errdefs.ErrInvalidArgument)
			}
			return
		}
		got, err := DecodeExecConfig(b)
		if err != nil {
			t.Fatalf("DecodeExecConfig(Encode(%+v)) = %v, want nil", cfg, err)
		}
		if diff := cmp.Diff(cfg, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("DecodeExecConfig(Encode(cfg)) differs (-want +got):\n%s", diff)
		}
	})
}
