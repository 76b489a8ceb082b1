// Package purge removes everything dsec made on a node: it stops `dsec up`
// and the keeper, kills every sandbox process, removes the cgroups, mounts,
// loop devices, runtime state and files. It works from what is on disk and
// in the kernel, so it also cleans up after crashes.
package purge

import (
	"io"
	"path/filepath"
)

// Config says what to purge.
type Config struct {
	StateDir string
	// CgroupParent holds the sandboxes' cgroups (default: what the last
	// `dsec up` recorded, else "dsec").
	CgroupParent string
	// KeepImages keeps the layer store and the cluster state (images and
	// keys) and removes the rest.
	KeepImages bool
	// Out receives one line per thing done.
	Out io.Writer
}

// RunConfig is what `dsec up` records in <state>/run/config.json for purge.
type RunConfig struct {
	CgroupParent string `json:"cgroup_parent"`
	UpPid        int    `json:"up_pid"`
}

// RunConfigPath is where RunConfig is kept.
func RunConfigPath(stateDir string) string { return filepath.Join(stateDir, "run", "config.json") }
