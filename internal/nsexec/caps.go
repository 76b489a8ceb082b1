package nsexec

import (
	"math/bits"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// capNames maps capability numbers (linux/capability.h) to their OCI names.
// One table serves both directions.
var capNames = [...]string{
	0:  "CAP_CHOWN",
	1:  "CAP_DAC_OVERRIDE",
	2:  "CAP_DAC_READ_SEARCH",
	3:  "CAP_FOWNER",
	4:  "CAP_FSETID",
	5:  "CAP_KILL",
	6:  "CAP_SETGID",
	7:  "CAP_SETUID",
	8:  "CAP_SETPCAP",
	9:  "CAP_LINUX_IMMUTABLE",
	10: "CAP_NET_BIND_SERVICE",
	11: "CAP_NET_BROADCAST",
	12: "CAP_NET_ADMIN",
	13: "CAP_NET_RAW",
	14: "CAP_IPC_LOCK",
	15: "CAP_IPC_OWNER",
	16: "CAP_SYS_MODULE",
	17: "CAP_SYS_RAWIO",
	18: "CAP_SYS_CHROOT",
	19: "CAP_SYS_PTRACE",
	20: "CAP_SYS_PACCT",
	21: "CAP_SYS_ADMIN",
	22: "CAP_SYS_BOOT",
	23: "CAP_SYS_NICE",
	24: "CAP_SYS_RESOURCE",
	25: "CAP_SYS_TIME",
	26: "CAP_SYS_TTY_CONFIG",
	27: "CAP_MKNOD",
	28: "CAP_LEASE",
	29: "CAP_AUDIT_WRITE",
	30: "CAP_AUDIT_CONTROL",
	31: "CAP_SETFCAP",
	32: "CAP_MAC_OVERRIDE",
	33: "CAP_MAC_ADMIN",
	34: "CAP_SYSLOG",
	35: "CAP_WAKE_ALARM",
	36: "CAP_BLOCK_SUSPEND",
	37: "CAP_AUDIT_READ",
	38: "CAP_PERFMON",
	39: "CAP_BPF",
	40: "CAP_CHECKPOINT_RESTORE",
}

// DefaultCaps is docker's default capability set: CHOWN, DAC_OVERRIDE,
// FSETID, FOWNER, MKNOD, NET_RAW, SETGID, SETUID, SETFCAP, SETPCAP,
// NET_BIND_SERVICE, SYS_CHROOT, KILL and AUDIT_WRITE.
const DefaultCaps uint64 = 1<<0 | 1<<1 | 1<<3 | 1<<4 | 1<<5 | 1<<6 | 1<<7 |
	1<<8 | 1<<10 | 1<<13 | 1<<18 | 1<<27 | 1<<29 | 1<<31

// CapName returns the OCI name of capability n ("CAP_CHOWN"), or "" when n
// is not a capability this package knows.
func CapName(n int) string {
	if n < 0 || n >= len(capNames) {
		return ""
	}
	return capNames[n]
}

// CapByName returns the number of the capability named name. It accepts the
// OCI form ("CAP_NET_RAW") and docker's short form ("NET_RAW"), in any case.
func CapByName(name string) (int, bool) {
	u := strings.ToUpper(name)
	if !strings.HasPrefix(u, "CAP_") {
		u = "CAP_" + u
	}
	for n, s := range capNames {
		if s == u {
			return n, true
		}
	}
	return 0, false
}

// CapMask returns the mask of the named capabilities. An unknown name is an
// InvalidArgument error.
func CapMask(names []string) (uint64, error) {
	var m uint64
	for _, name := range names {
		n, ok := CapByName(name)
		if !ok {
			return 0, errdefs.Newf(errdefs.ErrInvalidArgument, "unknown capability %q: use a name like CAP_NET_RAW", name)
		}
		m |= 1 << n
	}
	return m, nil
}

// CapNames returns the OCI names of the capabilities in mask, lowest number
// first. Bits this package has no name for are left out.
func CapNames(mask uint64) []string {
	names := make([]string, 0, bits.OnesCount64(mask))
	for n, s := range capNames {
		if mask&(1<<n) != 0 {
			names = append(names, s)
		}
	}
	return names
}
