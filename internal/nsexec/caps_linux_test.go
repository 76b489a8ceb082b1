package nsexec

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestCapTableMatchesKernelNumbers(t *testing.T) {
	// The numbers come from linux/capability.h, through x/sys/unix.
	want := map[string]int{
		"CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE,
		"CAP_DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH, "CAP_FOWNER": unix.CAP_FOWNER,
		"CAP_FSETID": unix.CAP_FSETID, "CAP_KILL": unix.CAP_KILL, "CAP_SETGID": unix.CAP_SETGID,
		"CAP_SETUID": unix.CAP_SETUID, "CAP_SETPCAP": unix.CAP_SETPCAP,
		"CAP_LINUX_IMMUTABLE": unix.CAP_LINUX_IMMUTABLE, "CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE,
		"CAP_NET_BROADCAST": unix.CAP_NET_BROADCAST, "CAP_NET_ADMIN": unix.CAP_NET_ADMIN,
		"CAP_NET_RAW": unix.CAP_NET_RAW, "CAP_IPC_LOCK": unix.CAP_IPC_LOCK, "CAP_IPC_OWNER": unix.CAP_IPC_OWNER,
		"CAP_SYS_MODULE": unix.CAP_SYS_MODULE, "CAP_SYS_RAWIO": unix.CAP_SYS_RAWIO,
		"CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT, "CAP_SYS_PTRACE": unix.CAP_SYS_PTRACE,
		"CAP_SYS_PACCT": unix.CAP_SYS_PACCT, "CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN,
		"CAP_SYS_BOOT": unix.CAP_SYS_BOOT, "CAP_SYS_NICE": unix.CAP_SYS_NICE,
		"CAP_SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "CAP_SYS_TIME": unix.CAP_SYS_TIME,
		"CAP_SYS_TTY_CONFIG": unix.CAP_SYS_TTY_CONFIG, "CAP_MKNOD": unix.CAP_MKNOD,
		"CAP_LEASE": unix.CAP_LEASE, "CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE,
		"CAP_AUDIT_CONTROL": unix.CAP_AUDIT_CONTROL, "CAP_SETFCAP": unix.CAP_SETFCAP,
		"CAP_MAC_OVERRIDE": unix.CAP_MAC_OVERRIDE, "CAP_MAC_ADMIN": unix.CAP_MAC_ADMIN,
		"CAP_SYSLOG": unix.CAP_SYSLOG, "CAP_WAKE_ALARM": unix.CAP_WAKE_ALARM,
		"CAP_BLOCK_SUSPEND": unix.CAP_BLOCK_SUSPEND, "CAP_AUDIT_READ": unix.CAP_AUDIT_READ,
		"CAP_PERFMON": unix.CAP_PERFMON, "CAP_BPF": unix.CAP_BPF,
		"CAP_CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
	}
	if len(capNames) != len(want) || len(capNames) != unix.CAP_LAST_CAP+1 {
		t.Errorf("len(capNames) = %d, want %d (CAP_LAST_CAP+1 = %d)", len(capNames), len(want), unix.CAP_LAST_CAP+1)
	}
	for name, n := range want {
		if got, ok := CapByName(name); !ok || got != n {
			t.Errorf("CapByName(%q) = %d, %v, want %d, true", name, got, ok, n)
		}
		if got := CapName(n); got != name {
			t.Errorf("CapName(%d) = %q, want %q", n, got, name)
		}
	}
}

func TestCapByNameForms(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"CAP_NET_RAW", unix.CAP_NET_RAW, true},
		{"net_raw", unix.CAP_NET_RAW, true},
		{"cap_sys_admin", unix.CAP_SYS_ADMIN, true},
		{"CAP_NOPE", 0, false},
		{"", 0, false},
		{"CAP_", 0, false},
	}
	for _, tt := range tests {
		if got, ok := CapByName(tt.in); got != tt.want || ok != tt.ok {
			t.Errorf("CapByName(%q) = %d, %v, want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
	for _, n := range []int{-1, len(capNames), 64} {
		if got := CapName(n); got != "" {
			t.Errorf("CapName(%d) = %q, want \"\"", n, got)
		}
	}
}

func TestDefaultCaps(t *testing.T) {
	// docker's default bounding set reads 00000000a80425fb in /proc/<pid>/status.
	if DefaultCaps != 0xa80425fb {
		t.Errorf("DefaultCaps = %#x, want 0xa80425fb", DefaultCaps)
	}
	names := []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
		"CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SYS_CHROOT",
		"CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP",
	}
	if got := CapNames(DefaultCaps); !cmp.Equal(got, names) {
		t.Errorf("CapNames(DefaultCaps) = %q, want %q", got, names)
	}
	mask, err := CapMask(names)
	if err != nil || mask != DefaultCaps {
		t.Errorf("CapMask(%q) = %#x, %v, want %#x, nil", names, mask, err, DefaultCaps)
	}
}

func TestCapMaskUnknown(t *testing.T) {
	_, err := CapMask([]string{"CAP_CHOWN", "CAP_FLY"})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("CapMask(CAP_FLY) = %v, want %v", err, errdefs.ErrInvalidArgument)
	}
}

func TestCapNamesIgnoresUnknownBits(t *testing.T) {
	if got, want := CapNames(1<<63|1), []string{"CAP_CHOWN"}; !cmp.Equal(got, want) {
		t.Errorf("CapNames(1<<63|1) = %q, want %q", got, want)
	}
}
