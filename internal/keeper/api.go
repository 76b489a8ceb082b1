// Package keeper is the per-node process that owns what must outlive a
// restart of the edge: the sandboxes' inits (it is their child subreaper),
// the commands exec'd in them and their output files, and the mounts of
// layers and root file systems (which live in the keeper's own mount
// namespace, so the host's mount table stays small and a dead keeper's
// mounts go with it).
//
// There is one keeper per node, never one per sandbox. The edge talks to it
// over a unix socket in the state directory (HTTP with JSON bodies) through
// Client; a restarted edge reconnects and finds every sandbox and exec
// again. Exec output goes to files, not to pipes held by the edge.
package keeper

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/dsecproject/dsec/internal/edge/sandbox"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// Protocol is the version of the edge↔keeper protocol; a keeper answering
// another version is restarted when it has no sandboxes, else reported.
const Protocol = 2

// CreateRequest asks for a sandbox.
type CreateRequest struct {
	ID        string            `json:"id"`
	Layers    []sandbox.Layer   `json:"layers"`
	Resources sandbox.Resources `json:"resources"`
}

// SandboxInfo is what the keeper knows of one sandbox.
type SandboxInfo struct {
	ID     string        `json:"id"`
	State  sandbox.State `json:"state"`
	Reason string        `json:"reason,omitempty"`
	Pid    int           `json:"pid,omitempty"`
	// StartTime is the init's start time in clock ticks since boot
	// (/proc/PID/stat field 22): with Pid it names the process even if the
	// pid is reused.
	StartTime uint64    `json:"start_time,omitempty"`
	Created   time.Time `json:"created"`
	// Adopted is set for sandboxes a restarted keeper found running but
	// did not start (their init is not its child).
	Adopted bool `json:"adopted,omitempty"`
	// RunningExecs counts execs that have not ended.
	RunningExecs int `json:"running_execs,omitempty"`
	// DiskLimit is the writable layer's size limit (0: not limited), and
	// Disk the name of its file system in the keeper's disk store.
	DiskLimit int64  `json:"disk_limit,omitempty"`
	Disk      string `json:"disk,omitempty"`
	// Slot names the sandbox's cgroup and runtime container when they are
	// not named by ID: a sandbox started warm, before anyone asked for it,
	// keeps the name it was started under. A warm sandbox has no ID yet.
	Slot string `json:"slot,omitempty"`
	// IDBase and IDSize are the sandbox's own host id range: id 0 inside
	// is IDBase on the host. Zero in the records of older keepers, whose
	// sandboxes shared the node's first range (see IDs).
	IDBase uint32 `json:"id_base,omitempty"`
	IDSize uint32 `json:"id_size,omitempty"`
	// NS are the device and inode numbers of the init's namespaces when it
	// started, by name ("mnt", "pid", ...): execs and file operations
	// refuse a sandbox whose init is in other namespaces now.
	NS map[string]NSID `json:"ns,omitempty"`
}

// NSID names a namespace: the device and inode of its nsfs file.
type NSID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

// IDs returns the sandbox's host id range; def is the node's first range,
// which sandboxes of older keepers (no IDBase recorded) shared.
func (i SandboxInfo) IDs(def rootfs.IDMap) rootfs.IDMap {
	if i.IDBase == 0 || i.IDSize == 0 {
		return def
	}
	return rootfs.IDMap{HostID: i.IDBase, Size: i.IDSize}
}

// slot is the name of the sandbox's cgroup and runtime container.
func (i SandboxInfo) slot() string {
	if i.Slot != "" {
		return i.Slot
	}
	return i.ID
}

// ExecRequest starts a command.
type ExecRequest struct {
	Sandbox string           `json:"sandbox"`
	Spec    sandbox.ExecSpec `json:"spec"`
}

// StdinRequest writes to an exec's stdin.
type StdinRequest struct {
	Sandbox string `json:"sandbox"`
	Exec    string `json:"exec"`
	Data    []byte `json:"data,omitempty"`
	Close   bool   `json:"close,omitempty"`
}

// SignalRequest signals an exec's process group.
type SignalRequest struct {
	Sandbox string `json:"sandbox"`
	Exec    string `json:"exec"`
	Signal  int    `json:"signal"`
}

// ResizeRequest resizes a TTY exec.
type ResizeRequest struct {
	Sandbox string `json:"sandbox"`
	Exec    string `json:"exec"`
	Rows    uint16 `json:"rows"`
	Cols    uint16 `json:"cols"`
}

// EventsReply carries events and the cursor to ask from next.
type EventsReply struct {
	Events []sandbox.Event `json:"events"`
	Cursor string          `json:"cursor"`
}

// Stats are a sandbox's resource use.
type Stats struct {
	MemoryBytes int64         `json:"memory_bytes"`
	MemoryLimit int64         `json:"memory_limit"`
	CPUUsage    time.Duration `json:"cpu_usage"`
	Pids        int64         `json:"pids"`
	PidsLimit   int64         `json:"pids_limit"`
	OOMKills    uint64        `json:"oom_kills"`
	DiskBytes   int64         `json:"disk_bytes"`
	DiskLimit   int64         `json:"disk_limit"`
	OutputBytes int64         `json:"output_bytes"`
	OutputLimit int64         `json:"output_limit"`
}

// Version describes a running keeper.
type Version struct {
	Protocol int    `json:"protocol"`
	Version  string `json:"version"`
	Pid      int    `json:"pid"`
	Runtime  string `json:"runtime"`
}

// Layout names the files of a state directory that the keeper and the
// edge share.
type Layout struct{ StateDir string }

// RunDir holds the keeper's socket, lock, runtime state and mount points.
func (l Layout) RunDir() string { return filepath.Join(l.StateDir, "run") }

// Socket is the keeper's API socket.
func (l Layout) Socket() string { return filepath.Join(l.RunDir(), "keeper.sock") }

// SandboxesDir holds one directory per sandbox.
func (l Layout) SandboxesDir() string { return filepath.Join(l.StateDir, "sandboxes") }

// SandboxDir is one sandbox's directory: bundle, upper and work dirs, root
// mount point and exec outputs.
func (l Layout) SandboxDir(id string) string { return filepath.Join(l.SandboxesDir(), id) }

// ExecDir holds one exec's output files and exit record.
func (l Layout) ExecDir(id, execID string) string {
	return filepath.Join(l.SandboxDir(id), "execs", execID)
}

// OutputPath is the file of one output stream of an exec.
func (l Layout) OutputPath(id, execID string, s sandbox.Stream) string {
	return filepath.Join(l.ExecDir(id, execID), s.String())
}

// ExitRecord is written once an exec has ended and its output is on disk.
type ExitRecord struct {
	sandbox.ExitStatus
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
}

// ReadExit returns the exit record of an exec; ok is false while it runs.
func (l Layout) ReadExit(id, execID string) (rec ExitRecord, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(l.ExecDir(id, execID), "exit.json"))
	if errors.Is(err, os.ErrNotExist) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, false, fmt.Errorf("exit record of %s/%s: %w", id, execID, err)
	}
	return rec, true, nil
}

func (l Layout) writeExit(id, execID string, rec ExitRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	dir := l.ExecDir(id, execID)
	tmp := filepath.Join(dir, ".exit.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "exit.json"))
}

// wireError is an error on the wire between edge and keeper.
type wireError struct {
	Kind    string  `json:"kind"`
	Message string  `json:"message"`
	Retry   float64 `json:"retry_seconds,omitempty"`
}

func encodeError(err error) wireError {
	w := wireError{Kind: errdefs.Kind(err).Error(), Message: err.Error()}
	if d, ok := errdefs.RetryHint(err); ok {
		w.Retry = d.Seconds()
	}
	return w
}

func (w wireError) decode() error {
	kind := errdefs.ErrInternal
	for _, k := range errdefs.Kinds {
		if k.Error() == w.Kind {
			kind = k
		}
	}
	err := errdefs.Newf(kind, "%s", w.Message)
	if w.Retry > 0 {
		err = errdefs.RetryAfter(err, time.Duration(w.Retry*float64(time.Second)))
	}
	return err
}
