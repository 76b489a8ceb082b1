// Package sandbox defines the contract between an edge and its isolation
// backends (container, and later fncall, microvm, vm) and the domain types
// they share.
//
// Invariants every Backend keeps:
//   - A sandbox exists from a successful Create until Delete returns nil;
//     Delete is idempotent and removes everything Create made (processes,
//     mounts, cgroups, files), also after a crash of the edge.
//   - Sandboxes outlive the edge process: a new Backend on the same state
//     directory finds them again through List.
//   - Exec output is kept by the backend (not by the caller) so that it
//     survives a restart of the edge, and is readable from any offset.
//   - File paths are resolved in the sandbox's own view and never escape its
//     root.
package sandbox

import (
	"context"
	"io"
	"io/fs"
	"time"
)

// Backend creates and runs sandboxes of one isolation kind.
type Backend interface {
	// Name is the backend's API name ("container").
	Name() string
	// Capabilities says which optional behaviours the backend has.
	Capabilities() Capabilities

	// Create starts a sandbox and returns once its init runs.
	Create(ctx context.Context, spec Spec) (Status, error)
	// Delete stops the sandbox and removes all it used. Deleting an unknown
	// sandbox returns nil.
	Delete(ctx context.Context, id string) error
	// Status reports one sandbox; ErrNotFound when the backend has no trace
	// of it.
	Status(ctx context.Context, id string) (Status, error)
	// List reports every sandbox the backend finds on the node, including
	// ones it made before a restart.
	List(ctx context.Context) ([]Status, error)

	// StartExec starts a command. Its output goes to storage the backend
	// owns; read it with OpenOutput and wait for the end with WaitExec.
	StartExec(ctx context.Context, id string, spec ExecSpec) error
	// WaitExec blocks until the command ends or ctx is done.
	WaitExec(ctx context.Context, id, execID string) (ExitStatus, error)
	// OpenOutput opens one output stream of an exec for reading from any
	// offset, also while the command still writes it.
	OpenOutput(ctx context.Context, id, execID string, s Stream) (Output, error)

	// WriteStdin writes to a running exec's stdin and optionally closes it.
	WriteStdin(ctx context.Context, id, execID string, data []byte, close bool) error
	// Signal sends sig to an exec's process group.
	Signal(ctx context.Context, id, execID string, sig int) error
	// ResizeTTY sets a TTY exec's window size.
	ResizeTTY(ctx context.Context, id, execID string, rows, cols uint16) error
	// ListExecs returns the sandbox's command journal, oldest first.
	ListExecs(ctx context.Context, id string) ([]ExecInfo, error)
	// Stats reports the sandbox's resource use.
	Stats(ctx context.Context, id string) (Stats, error)

	// ReadFile opens a regular file in the sandbox.
	ReadFile(ctx context.Context, id, path string) (io.ReadCloser, FileInfo, error)
	// WriteFile writes a regular file in the sandbox from r, replacing it.
	WriteFile(ctx context.Context, id, path string, opts WriteOptions, r io.Reader) (FileInfo, error)

	// Stat describes a file, following symlinks inside the sandbox.
	Stat(ctx context.Context, id, path string) (FileInfo, error)
	// ReadDir lists a directory, at most limit entries (0: the backend's
	// maximum); truncated says more were left out.
	ReadDir(ctx context.Context, id, path string, limit int) (entries []FileInfo, truncated bool, err error)
	// Mkdir makes a directory owned by uid:gid (ids inside the sandbox).
	Mkdir(ctx context.Context, id, path string, mode fs.FileMode, parents bool, uid, gid uint32) (FileInfo, error)
	// Remove removes a file, or a directory tree with recursive.
	Remove(ctx context.Context, id, path string, recursive bool) error
	// Rename renames from to to; without overwrite an existing to is an
	// AlreadyExists error.
	Rename(ctx context.Context, id, from, to string, overwrite bool) error
	// DownloadTar writes the tree at path as a tar archive to w.
	DownloadTar(ctx context.Context, id, path string, w io.Writer) error
	// UploadTar extracts a tar archive into the directory dir; a bad
	// archive is refused before anything is written.
	UploadTar(ctx context.Context, id, dir string, r io.Reader, opts TarOptions) (TarStats, error)

	// Close releases what the backend holds in this process; sandboxes keep
	// running.
	Close() error
}

// EventSource is the optional capability of reporting events (init exits,
// OOM kills) as they happen. Events blocks until there are events after
// cursor (or ctx ends) and returns them with the next cursor; a cursor
// from an earlier incarnation of the backend's node process restarts the
// stream.
type EventSource interface {
	Events(ctx context.Context, cursor string) ([]Event, string, error)
}

// TarOptions say how UploadTar creates files.
type TarOptions struct {
	// MakeParents creates a missing destination directory.
	MakeParents bool
	// UID and GID own everything extracted, as seen inside the sandbox.
	UID, GID uint32
}

// TarStats counts what a tar transfer moved.
type TarStats struct {
	Files, Dirs, Links, Bytes, Skipped int64
}

// Capabilities are the optional behaviours of a backend; the conformance
// suite runs the cases whose capabilities the backend has.
type Capabilities struct {
	MemoryLimit bool // a memory limit is enforced and OOM kills are reported
	PidsLimit   bool // a limit on processes is enforced
	DiskLimit   bool // the writable layer's size is enforced
	Restart     bool // sandboxes survive a restart of the edge process
	TTY         bool // execs can run on a terminal
}

// Layer is one read-only layer of a sandbox's root file system.
type Layer struct {
	// Digest names the layer, "sha256:<hex>".
	Digest string
	// Path is a local file holding the layer's EROFS image; empty when
	// the layer is mounted from its lazy form.
	Path string
	// Lazy, when set, is the layer's lazy form: the node fetches the
	// metadata image and mounts the data from its blob source on demand.
	Lazy *LazyLayer `json:",omitempty"`
}

// LazyLayer is a layer split for loading on demand (cluster.LazyForm).
type LazyLayer struct {
	Meta         string   // digest of the metadata-only EROFS image
	Data         string   // digest of the data blob (the image's device 1)
	DataSize     int64    // its size
	ChunkSize    int64    // the unit of ChunkDigests
	ChunkDigests []string // "sha256:<hex>" of each chunk of the data blob
}

// Resources are a sandbox's limits. Zero means the backend's default.
type Resources struct {
	MemoryBytes int64
	CPUs        float64
	Pids        int64
	DiskBytes   int64
}

// Spec is what Create needs.
type Spec struct {
	ID string
	// Layers of the root file system, lowest first.
	Layers    []Layer
	Resources Resources
	// Env is the image's environment, KEY=VALUE.
	Env []string
}

// State is a sandbox's life-cycle state as the backend sees it.
type State string

// The states a backend reports. The edge adds creating, failed and deleted.
const (
	StateRunning State = "running"
	StateExited  State = "exited"
)

// Status is what a backend knows of one sandbox.
type Status struct {
	ID    string
	State State
	// Reason explains an exited state.
	Reason string
	// Pid of the sandbox's init on the host, when it runs.
	Pid int
	// RunningExecs counts commands started through StartExec that have not
	// ended (a sandbox running one is not idle).
	RunningExecs int
}

// Stream names an exec output stream.
type Stream int

// The output streams.
const (
	Stdout Stream = 1
	Stderr Stream = 2
)

func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	}
	return "stream?"
}

// ExecSpec describes one command.
type ExecSpec struct {
	// ID is chosen by the caller, unique within the sandbox.
	ID   string
	Argv []string
	// Env is the complete environment, KEY=VALUE.
	Env []string
	// Cwd inside the sandbox; "" is /.
	Cwd string
	// UID and GID inside the sandbox.
	UID, GID uint32
	// Groups are supplementary groups.
	Groups []uint32
	// Stdin is written to the command's standard input, which is then
	// closed unless StdinOpen. Nil gives an empty stdin.
	Stdin []byte
	// StdinOpen keeps stdin open for WriteStdin, whose data the command
	// reads after Stdin.
	StdinOpen bool
	// TTY runs the command on a terminal (stdin always open; the output is
	// one stream, Stdout); Rows and Cols are its size (default 24x80).
	TTY        bool
	Rows, Cols uint16
	// Timeout kills the command's process group; zero means none.
	Timeout time.Duration
	// OutputLimit caps each output stream; zero means the backend's default.
	OutputLimit int64
}

// ExitStatus is how a command ended.
type ExitStatus struct {
	// Code is the exit code when the command exited.
	Code int
	// Signal is the signal that ended it, or 0.
	Signal          int
	TimedOut        bool
	OOMKilled       bool
	StdoutTruncated bool
	StderrTruncated bool
	// Lost: the end was not observed (the node keeper restarted while the
	// command ran).
	Lost           bool
	Started, Ended time.Time
}

// ExecInfo is one entry of a sandbox's command journal.
type ExecInfo struct {
	ID      string
	Argv    []string
	TTY     bool
	Started time.Time
	Running bool
	// Exit is set once the command has ended.
	Exit        *ExitStatus
	StdoutBytes int64
	StderrBytes int64
}

// Stats is what a sandbox uses.
type Stats struct {
	CPUUsage    time.Duration
	MemoryBytes int64
	MemoryLimit int64
	Pids        int64
	PidsLimit   int64
	DiskBytes   int64
	DiskLimit   int64
	OOMKills    int64
	OutputBytes int64
	OutputLimit int64
}

// EventType says what happened to a sandbox, as a backend observes it.
type EventType string

// The events backends report.
const (
	EventExited EventType = "exited" // its init ended
	EventOOM    EventType = "oom"    // the kernel killed one of its processes for memory
	// EventFailed: the sandbox cannot go on (a lazy layer's data could
	// not be read); Reason says why.
	EventFailed EventType = "failed"
)

// Event is a change a backend observed.
type Event struct {
	Sandbox string
	Type    EventType
	Reason  string
	Time    time.Time
}

// Output is one exec output stream.
type Output interface {
	io.ReaderAt
	// Size is the number of bytes written so far.
	Size() (int64, error)
	Close() error
}

// FileInfo describes a file in a sandbox, owners as seen inside it.
type FileInfo struct {
	Path string
	// Name is the base name (in directory listings).
	Name string
	// LinkTarget is a symlink's target.
	LinkTarget string
	Size       int64
	Mode       fs.FileMode
	ModTime    time.Time
	UID        uint32
	GID        uint32
}

// WriteOptions say how WriteFile creates a file.
type WriteOptions struct {
	// Mode is the permission bits; zero means 0644.
	Mode fs.FileMode
	// MakeParents creates missing parent directories (0755).
	MakeParents bool
	// UID and GID own the file, as seen inside the sandbox.
	UID, GID uint32
}
