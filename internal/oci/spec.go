// Package oci writes the OCI runtime configuration (config.json) of a
// container sandbox. It holds the subset of the runtime spec dsec uses, so
// that crun, runc and later runsc all receive the same bundle.
package oci

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Spec is the subset of the OCI runtime spec (v1.0.2) dsec writes.
type Spec struct {
	Version  string  `json:"ociVersion"`
	Process  Process `json:"process"`
	Root     Root    `json:"root"`
	Hostname string  `json:"hostname,omitempty"`
	Mounts   []Mount `json:"mounts,omitempty"`
	Linux    Linux   `json:"linux"`
}

// Process is the container's first process.
type Process struct {
	Terminal        bool          `json:"terminal,omitempty"`
	User            User          `json:"user"`
	Args            []string      `json:"args"`
	Env             []string      `json:"env,omitempty"`
	Cwd             string        `json:"cwd"`
	Capabilities    *Capabilities `json:"capabilities,omitempty"`
	Rlimits         []Rlimit      `json:"rlimits,omitempty"`
	NoNewPrivileges bool          `json:"noNewPrivileges,omitempty"`
	OOMScoreAdj     *int          `json:"oomScoreAdj,omitempty"`
}

// User is a process's identity inside the container.
type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// Capabilities are capability names ("CAP_CHOWN") per set.
type Capabilities struct {
	Bounding    []string `json:"bounding,omitempty"`
	Effective   []string `json:"effective,omitempty"`
	Inheritable []string `json:"inheritable,omitempty"`
	Permitted   []string `json:"permitted,omitempty"`
	Ambient     []string `json:"ambient,omitempty"`
}

// Rlimit is one resource limit.
type Rlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

// Root is the container's root file system.
type Root struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly,omitempty"`
}

// Mount is one mount inside the container.
type Mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type,omitempty"`
	Source      string   `json:"source,omitempty"`
	Options     []string `json:"options,omitempty"`
}

// Linux holds the Linux-specific settings.
type Linux struct {
	UIDMappings   []IDMapping `json:"uidMappings,omitempty"`
	GIDMappings   []IDMapping `json:"gidMappings,omitempty"`
	CgroupsPath   string      `json:"cgroupsPath,omitempty"`
	Namespaces    []Namespace `json:"namespaces"`
	MaskedPaths   []string    `json:"maskedPaths,omitempty"`
	ReadonlyPaths []string    `json:"readonlyPaths,omitempty"`
}

// IDMapping maps a range of ids inside to the host.
type IDMapping struct {
	ContainerID uint32 `json:"containerID"`
	HostID      uint32 `json:"hostID"`
	Size        uint32 `json:"size"`
}

// Namespace is one namespace to create (Path empty) or join.
type Namespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

// Options describe one sandbox's container.
type Options struct {
	// Rootfs is the mounted root file system.
	Rootfs   string
	Hostname string
	// Args run as the container's init.
	Args []string
	Env  []string
	// HostUID/HostGID are the first host ids of the sandbox's range, Size
	// its length; id 0 inside is HostUID outside.
	HostUID, HostGID, Size uint32
	// UserNS, when set, is the path of a user namespace to join (with the
	// mapping above, which the runtime checks) instead of making one.
	UserNS string
	// CgroupsPath is the cgroup the runtime puts the init in.
	CgroupsPath string
	// Caps are the capability names the init keeps.
	Caps []string
}

// New returns the spec of a sandbox container: every namespace new
// (network: loopback only) but the user namespace when UserNS names one,
// the given id range, no new privileges, masked
// kernel files and docker's default capabilities.
func New(o Options) *Spec {
	caps := append([]string(nil), o.Caps...)
	return &Spec{
		Version: "1.0.2",
		Process: Process{
			User: User{UID: 0, GID: 0},
			Args: o.Args,
			Env:  o.Env,
			Cwd:  "/",
			Capabilities: &Capabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			NoNewPrivileges: true,
		},
		Root:     Root{Path: o.Rootfs},
		Hostname: o.Hostname,
		Mounts: []Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: Linux{
			UIDMappings: []IDMapping{{ContainerID: 0, HostID: o.HostUID, Size: o.Size}},
			GIDMappings: []IDMapping{{ContainerID: 0, HostID: o.HostGID, Size: o.Size}},
			CgroupsPath: o.CgroupsPath,
			Namespaces: []Namespace{
				{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"},
				{Type: "network"}, {Type: "user", Path: o.UserNS}, {Type: "cgroup"},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
				"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
				"/proc/sched_debug", "/proc/scsi", "/proc/kpagecgroup",
				"/proc/kpagecount", "/proc/kpageflags", "/proc/sysrq-trigger",
				"/sys/firmware", "/sys/devices/virtual/powercap",
			},
			ReadonlyPaths: []string{
				"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
			},
		},
	}
}

// WriteBundle writes spec as dir/config.json.
func WriteBundle(dir string, spec *Spec) error {
	b, err := json.MarshalIndent(spec, "", "\t")
	if err != nil {
		return fmt.Errorf("encode OCI config: %w", err)
	}
	tmp := filepath.Join(dir, ".config.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write OCI config: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "config.json")); err != nil {
		return fmt.Errorf("write OCI config: %w", err)
	}
	return nil
}
