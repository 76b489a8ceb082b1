package sandbox

import (
	"fmt"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Tier is an isolation tier: what stands between a sandbox's code and the
// host. The conformance suite keys on it: what a tier's isolation must
// refuse (a container's new user namespaces, say) is checked for the
// backends of that tier only.
type Tier string

// The isolation tiers (ARCHITECTURE.md, Backends).
const (
	// TierProcess: processes in shared, precreated containers (FnCall's
	// warm interpreters); cleanup between calls is best effort.
	TierProcess Tier = "process"
	// TierContainer: Linux namespaces, cgroups and a seccomp filter on the
	// host's kernel.
	TierContainer Tier = "container"
	// TierUserKernel: a kernel in user space between the sandbox and the
	// host's (gVisor).
	TierUserKernel Tier = "user-kernel"
	// TierMicroVM: a microVM with its own kernel.
	TierMicroVM Tier = "microvm"
	// TierVM: a full VM booting a complete disk image.
	TierVM Tier = "vm"
)

// Description is what a backend says of itself.
type Description struct {
	// Name is the backend's API name ("container").
	Name string
	Tier Tier
	// Features are the properties the backend keeps that are not
	// operations of their own (operations are optional interfaces).
	Features []Capability
}

// Capability names something a backend may have, as users see it in
// `dsec backends` and in refusals.
type Capability string

// The capabilities. The first group are optional interfaces a backend
// implements; the second are properties it declares in Description.
const (
	CapPause    Capability = "pause"    // Pauser
	CapSnapshot Capability = "snapshot" // Snapshotter
	CapNetwork  Capability = "network"  // NetworkAttacher
	// CapNetworkPolicy is NetworkPolicer: sandboxes get egress by a
	// policy the node enforces (docs/network.md).
	CapNetworkPolicy Capability = "network-policy"
	CapPack          Capability = "pack"     // Packer
	CapEvents        Capability = "events"   // EventSource
	CapSessions      Capability = "sessions" // Sessioner: named shell sessions (ExecSpec.Session)
	CapPorts         Capability = "ports"    // PortDialer: its listening ports reached through the ports proxy

	CapMemoryLimit Capability = "memory-limit" // memory limits enforced, OOM kills reported
	CapPidsLimit   Capability = "pids-limit"   // a limit on processes enforced
	CapDiskLimit   Capability = "disk-limit"   // the writable layer's size enforced
	CapTTY         Capability = "tty"          // execs can run on a terminal
	CapRestart     Capability = "restart"      // sandboxes survive a restart of the edge
	CapSealedExec  Capability = "sealed-exec"  // execs can run sealed
	CapQoS         Capability = "qos"          // the best-effort QoS class is applied
	CapStepKeys    Capability = "step-keys"    // execs take step keys (ExecSpec.StepKey), unique in the sandbox
)

// Capabilities lists what b has: the optional interfaces it implements and
// the features it declares, in the order of the constants above.
func Capabilities(b Backend) []Capability {
	var out []Capability
	for _, c := range []Capability{CapPause, CapSnapshot, CapNetwork, CapNetworkPolicy, CapPack, CapEvents, CapSessions, CapPorts} {
		if implements(b, c) {
			out = append(out, c)
		}
	}
	declared := map[Capability]bool{}
	for _, c := range b.Describe().Features {
		declared[c] = true
	}
	for _, c := range []Capability{CapMemoryLimit, CapPidsLimit, CapDiskLimit, CapTTY, CapRestart, CapSealedExec, CapQoS, CapStepKeys} {
		if declared[c] {
			out = append(out, c)
		}
	}
	return out
}

func implements(b Backend, c Capability) bool {
	var ok bool
	switch c {
	case CapPause:
		_, ok = b.(Pauser)
	case CapSnapshot:
		_, ok = b.(Snapshotter)
	case CapNetwork:
		_, ok = b.(NetworkAttacher)
	case CapNetworkPolicy:
		_, ok = b.(NetworkPolicer)
	case CapPack:
		_, ok = b.(Packer)
	case CapEvents:
		_, ok = b.(EventSource)
	case CapSessions:
		_, ok = b.(Sessioner)
	case CapPorts:
		_, ok = b.(PortDialer)
	}
	return ok
}

// Has reports whether b has capability c.
func Has(b Backend, c Capability) bool {
	for _, have := range Capabilities(b) {
		if have == c {
			return true
		}
	}
	return false
}

// Lacks is the refusal of an operation that needs capability c on a
// backend without it: FailedPrecondition naming both.
func Lacks(backend string, c Capability) error {
	return errdefs.Newf(errdefs.ErrFailedPrecondition,
		"the %s backend has no %s capability: run the sandbox on a backend that has it (see `dsec backends`)", backend, c)
}

// Check returns Lacks unless b has c.
func Check(b Backend, c Capability) error {
	if Has(b, c) {
		return nil
	}
	return Lacks(b.Describe().Name, c)
}

// needs lists the capabilities a spec asks for: a network attachment
// and a QoS class other than the default.
func (s Spec) needs() []Capability {
	var out []Capability
	if s.Network != nil {
		out = append(out, CapNetwork)
	}
	if s.QoS != QoSLatencySensitive {
		out = append(out, CapQoS)
	}
	return out
}

// CheckSpec refuses a spec that needs what b lacks (a network attachment
// without NetworkAttacher, a QoS class b does not apply). Every backend's
// Create calls it before it makes anything; the edge calls it before it
// admits the sandbox.
func CheckSpec(b Backend, s Spec) error {
	for _, c := range s.needs() {
		if err := Check(b, c); err != nil {
			return fmt.Errorf("sandbox %s: %w", s.ID, err)
		}
	}
	return nil
}
