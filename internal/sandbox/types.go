package sandbox

import (
	"io"
	"io/fs"
	"time"
)

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

// Spec is what Create needs: what every backend uses to make a sandbox.
type Spec struct {
	// ID names the sandbox; it is also its hostname.
	ID string
	// Layers of the root file system, lowest first.
	Layers    []Layer
	Resources Resources
	// Env is the sandbox's environment, KEY=VALUE (the image's, with the
	// sandbox's own on top): the environment of the processes the backend
	// starts on its own (a container's init, a VM's guest agent, warm
	// interpreters). Execs get theirs whole in ExecSpec.Env, which the edge
	// builds from it.
	Env []string
	// Network is the sandbox's network attachment; nil is none (loopback
	// only). A backend without NetworkAttacher refuses a non-nil one.
	Network *NetworkAttachment
	// QoS is the sandbox's CPU class.
	QoS QoSClass
}

// QoSClass is a sandbox's CPU priority class (ARCHITECTURE.md, Density and
// QoS).
type QoSClass string

// The QoS classes.
const (
	// QoSLatencySensitive is the default: ordinary CPU priority.
	QoSLatencySensitive QoSClass = ""
	// QoSBestEffort runs at idle priority (cgroup cpu.idle or SCHED_IDLE).
	QoSBestEffort QoSClass = "best-effort"
)

// NetworkAttachment is how a sandbox reaches the network: the node's
// network engine prepares it (a network namespace and the policy that
// applies in it) and the backend puts the sandbox into it.
type NetworkAttachment struct {
	// Namespace is the path of the network namespace to join (a bind
	// mount under the node's state dir).
	Namespace string
	// Policy names the policy that applies, for the backend's records.
	Policy string
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
	// Paused: its processes are stopped by a Pause (Pauser) and stay so
	// until a Resume.
	Paused bool
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
	// Session, when set, runs the command line Argv[0] (Argv has exactly
	// one element) in the sandbox's shell session of this name (Sessioner);
	// SessionShell is the shell of a new session ("": /bin/bash when the
	// image has it, else /bin/sh).
	Session      string
	SessionShell string
	// Seal runs the command sealed (backends with CapSealedExec).
	Seal Seal
	// StepKey is the caller's name for this step of its work (backends
	// with CapStepKeys): recorded in the journal (ExecInfo.StepKey); a
	// start with the step key of an earlier exec of the sandbox is
	// AlreadyExists, naming that exec. At most MaxStepKey bytes.
	StepKey string
}

// MaxStepKey is the longest exec step key, in bytes.
const MaxStepKey = 256

// Seal says how an exec is sealed from the rest of its sandbox: while it
// runs every other process of the sandbox is frozen (SealFreeze) or killed
// (SealKill), it runs in the sandbox's mount and pid view as recorded at
// create with the platform's tools first on PATH (/.dsec/bin) and the
// image's layers read-only at /.dsec/image, and nothing of the sandbox can
// ptrace or signal it.
type Seal int

const (
	SealNone Seal = iota
	SealFreeze
	SealKill
)

// SessionInfo is one shell session of a sandbox.
type SessionInfo struct {
	Name    string
	Shell   string
	Created time.Time
	// Commands run in it so far; RunningExec is the one running now.
	Commands    int64
	RunningExec string
}

// ExitStatus is how a command ended.
type ExitStatus struct {
	// Code is the exit code when the command exited.
	Code int
	// Signal is the signal that ended it, or 0 (Code is then 0 and says
	// nothing); a timed-out command reports SIGKILL.
	Signal          int
	TimedOut        bool
	OOMKilled       bool
	StdoutTruncated bool
	StderrTruncated bool
	// Lost: the end was not observed (the node keeper restarted while the
	// command ran).
	Lost bool
	// Sealed: the command ran sealed (ExecSpec.Seal).
	Sealed bool
	// SessionLost: the command's session shell ended (a timeout's grace
	// passed, the command ended the shell, the session was deleted, or the
	// keeper restarted); the next command gets a new shell.
	// SessionRestarted: the command ran in a new shell that replaced a lost
	// one, without the state earlier commands had set.
	SessionLost      bool
	SessionRestarted bool
	Started, Ended   time.Time
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
	// Session it ran in, if any; Sealed if it ran sealed.
	Session string
	Sealed  bool
	// StepKey is ExecSpec.StepKey.
	StepKey string
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
	// SwappedBytes is the sandbox's memory in swap: a paused sandbox's,
	// or what a resumed one has not used since (0 where the backend does
	// not say).
	SwappedBytes int64
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
