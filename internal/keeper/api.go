package keeper

import (
	"encoding/json"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// The keeper API: HTTP on the keeper's unix socket, JSON bodies. Every
// message of it is declared in this file, with the JSON names it has on
// the wire, and owned by this package: the types of the edge's sandbox
// contract never cross it, so the contract can change without changing
// the wire.
//
// Protocol policy (docs/architecture.md, "The node keeper"):
//   - A field, once released, keeps its name, its type and its meaning.
//     A new field is optional: its absence means what the keeper did
//     before it existed, and it is omitted when unset (omitempty), so a
//     request that uses nothing new is one an older keeper reads.
//   - Both sides ignore fields they do not know (keepers from protocol 3
//     on; protocol 2 keepers refused requests with unknown fields, so a
//     client sends a keeper of protocol 2 no new field).
//   - Protocol is raised with every change of a message or endpoint (a
//     field, an endpoint, a value of an enum). A client learns the
//     keeper's number from GET /v1/version and uses only what that number
//     has; it sends its own in the Dsec-Keeper-Protocol header.
//   - A keeper serves clients of MinProtocol up to Protocol. To a client
//     that sends no header (protocol 2's) it says it speaks protocol 2,
//     which that client requires, so an older dsec keeps working against
//     a newer keeper. Dropping anything raises MinProtocol.
//   - The messages of each released protocol are pinned under
//     testdata/v<N> and never edited; tests decode them with today's
//     types, and run today's client against a keeper replaying them and
//     yesterday's requests against today's keeper.

// Protocol is the edge↔keeper protocol this package speaks.
//
//	2: b56bd3e and before: no version negotiation, unknown request fields
//	   refused, settings never compared.
//	3: the Dsec-Keeper-Protocol header; unknown fields ignored; Version
//	   carries min_protocol and the keeper's settings; POST /v1/settings
//	   applies settings that change live; SandboxInfo.driver and .lazy;
//	   CreateRequest.driver; POST /v1/shutdown?handoff=1 hands the fd
//	   vault to the keeper that replaces this one (vault_linux.go).
//	4: shell sessions (ExecSpec.Session, .SessionShell; ExitStatus and
//	   ExecInfo's session fields; GET and DELETE /v1/sessions) and sealed
//	   execs (ExecSpec.Seal, ExitStatus.Sealed). A client sends them only
//	   to a keeper of protocol 4 or later: an older one would ignore them
//	   and run the command unsealed, outside any session.
//	5: sandbox networks (PUT, GET and DELETE /v1/network; NetworkRequest,
//	   NetworkInfo; SandboxInfo.Network). A client sends them only to a
//	   keeper of protocol 5 or later. Also GET /v1/network/node
//	   (NodeNetwork: the node's totals, for /metrics), added before
//	   protocol 5 was released, so it does not raise the protocol.
//	6: pause and resume of sandboxes (their endpoints, PauseInfo,
//	   SandboxInfo.Paused) and exec step keys (ExecSpec.StepKey,
//	   ExecInfo.StepKey). A client sends them only to a keeper of
//	   protocol 6 or later. The endpoints: POST /v1/sandbox/pause?id=ID
//	   and POST /v1/sandbox/resume?id=ID (with &wait=1: reply once the
//	   memory has moved), GET /v1/sandbox/pause?id=ID (the state, no
//	   change); Stats.SwappedBytes.
const Protocol = 6

// MinProtocol is the oldest client protocol a keeper of this package serves.
const MinProtocol = 2

// headerProtocol carries the client's protocol on every request.
const headerProtocol = "Dsec-Keeper-Protocol"

// State is a sandbox's state as the keeper sees it.
type State string

// The states of a sandbox in the keeper. The edge owns the full state
// machine; these are what the keeper reports of the init.
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StateExited   State = "exited"
)

// Layer is one read-only layer of a sandbox's root file system. Its
// fields are named on the wire as protocol 2 named them.
type Layer struct {
	// Digest names the layer, "sha256:<hex>".
	Digest string `json:"Digest"`
	// Path is a local file holding the layer's EROFS image; empty when
	// the layer is mounted from its lazy form.
	Path string `json:"Path"`
	// Lazy, when set, is the layer's lazy form.
	Lazy *LazyLayer `json:"Lazy,omitempty"`
}

// LazyLayer is a layer split for loading on demand (cluster.LazyForm).
type LazyLayer struct {
	Meta         string   `json:"Meta"`         // digest of the metadata-only EROFS image
	Data         string   `json:"Data"`         // digest of the data blob (the image's device 1)
	DataSize     int64    `json:"DataSize"`     // its size
	ChunkSize    int64    `json:"ChunkSize"`    // the unit of ChunkDigests
	ChunkDigests []string `json:"ChunkDigests"` // "sha256:<hex>" of each chunk of the data blob
}

// Resources are a sandbox's limits; zero means the keeper's default.
type Resources struct {
	MemoryBytes int64   `json:"MemoryBytes"`
	CPUs        float64 `json:"CPUs"`
	Pids        int64   `json:"Pids"`
	DiskBytes   int64   `json:"DiskBytes"`
}

// CreateRequest asks for a sandbox.
type CreateRequest struct {
	ID        string    `json:"id"`
	Layers    []Layer   `json:"layers"`
	Resources Resources `json:"resources"`
	// Driver names the driver that runs the sandbox (protocol 3); empty
	// is the container driver, the only one before.
	Driver string `json:"driver,omitempty"`
}

// SandboxInfo is what the keeper knows of one sandbox. It is also the
// sandbox's record on disk (keeper.json), which a restarted keeper adopts
// the sandbox from.
type SandboxInfo struct {
	ID     string `json:"id"`
	State  State  `json:"state"`
	Reason string `json:"reason,omitempty"`
	Pid    int    `json:"pid,omitempty"`
	// StartTime is the init's start time in clock ticks since boot
	// (/proc/PID/stat field 22): with Pid it names the process even if the
	// pid is reused.
	StartTime uint64    `json:"start_time,omitempty"`
	Created   time.Time `json:"created"`
	// Driver runs the sandbox (protocol 3; empty in the records of
	// protocol 2 keepers: the container driver).
	Driver string `json:"driver,omitempty"`
	// Adopted is set for sandboxes a restarted keeper found running but
	// did not start (their init is not its child).
	Adopted bool `json:"adopted,omitempty"`
	// Lazy is set when a layer of the sandbox is mounted from its lazy
	// form, whose data this keeper serves (protocol 3): the sandbox cannot
	// be handed to another keeper.
	Lazy bool `json:"lazy,omitempty"`
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
	// Network is the sandbox's network policy document (protocol 5), empty
	// when it has none: a restarted keeper enforces it again before the
	// sandbox can send a packet.
	Network json.RawMessage `json:"network,omitempty"`
	// Paused: its processes are stopped by a pause until a resume
	// (protocol 6). A restarted keeper keeps a paused sandbox paused: the
	// record of it is not this field of keeper.json but the driver's (a
	// mark of a container's cgroup; pause_linux.go).
	Paused bool `json:"paused,omitempty"`
}

// PauseInfo is a sandbox's pause state and where its memory is (protocol
// 6): the reply of POST and GET /v1/sandbox/pause and of POST
// /v1/sandbox/resume.
type PauseInfo struct {
	Paused bool `json:"paused"`
	// Resident is the sandbox's memory in RAM, Swapped its memory in the
	// node's swap, in bytes.
	Resident int64 `json:"resident"`
	Swapped  int64 `json:"swapped"`
	// Locked is the part of Resident no reclaim can move (pages the
	// sandbox locked with mlock).
	Locked int64 `json:"locked,omitempty"`
	// Moving: the keeper still moves the memory, out of RAM after a pause
	// or back after a resume.
	Moving bool `json:"moving,omitempty"`
	// Warning says why memory stayed in RAM after the last pause: no swap
	// on the node, the swap full, locked pages.
	Warning string `json:"warning,omitempty"`
	// Stopped, in the reply of the pause that stopped the sandbox, is how
	// long the keeper took to (record and) stop its processes, from the
	// request's arrival at the sandbox to its group frozen: the pause
	// without the call's transport.
	Stopped time.Duration `json:"stopped_ns,omitempty"`
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

// ExecSpec describes one command. Its fields are named on the wire as
// protocol 2 named them.
type ExecSpec struct {
	// ID is chosen by the caller, unique within the sandbox.
	ID   string   `json:"ID"`
	Argv []string `json:"Argv"`
	// Env is the complete environment, KEY=VALUE.
	Env []string `json:"Env"`
	// Cwd inside the sandbox; "" is /.
	Cwd string `json:"Cwd"`
	// UID and GID inside the sandbox; Groups are supplementary groups.
	UID    uint32   `json:"UID"`
	GID    uint32   `json:"GID"`
	Groups []uint32 `json:"Groups"`
	// Stdin is written to the command's standard input, which is then
	// closed unless StdinOpen.
	Stdin     []byte `json:"Stdin"`
	StdinOpen bool   `json:"StdinOpen"`
	// TTY runs the command on a terminal of Rows x Cols (default 24x80).
	TTY  bool   `json:"TTY"`
	Rows uint16 `json:"Rows"`
	Cols uint16 `json:"Cols"`
	// Timeout kills the command's process group (nanoseconds; 0: none).
	Timeout time.Duration `json:"Timeout"`
	// OutputLimit caps each output stream; 0 is the keeper's default.
	OutputLimit int64 `json:"OutputLimit"`
	// Session runs the command line Argv[0] in the sandbox's shell session
	// of this name (protocol 4); SessionShell is a new session's shell.
	Session      string `json:"Session,omitempty"`
	SessionShell string `json:"SessionShell,omitempty"`
	// Seal: 1 freezes, 2 kills the sandbox's other processes while the
	// command runs sealed (protocol 4; sandbox.Seal).
	Seal int `json:"Seal,omitempty"`
	// StepKey is the caller's name for this step of its work (protocol
	// 6): at most 256 bytes, recorded in the journal; a start with the
	// step key of an earlier exec of the sandbox is refused with
	// AlreadyExists naming that exec.
	StepKey string `json:"StepKey,omitempty"`
}

// ExecRequest starts a command.
type ExecRequest struct {
	Sandbox string   `json:"sandbox"`
	Spec    ExecSpec `json:"spec"`
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

// ExitStatus is how a command ended.
type ExitStatus struct {
	Code            int  `json:"Code"`
	Signal          int  `json:"Signal"`
	TimedOut        bool `json:"TimedOut"`
	OOMKilled       bool `json:"OOMKilled"`
	StdoutTruncated bool `json:"StdoutTruncated"`
	StderrTruncated bool `json:"StderrTruncated"`
	// Lost: no keeper saw the end (a keeper restarted while it ran).
	Lost bool `json:"Lost"`
	// Sealed, SessionLost, SessionRestarted: sandbox.ExitStatus's
	// (protocol 4).
	Sealed           bool      `json:"Sealed,omitempty"`
	SessionLost      bool      `json:"SessionLost,omitempty"`
	SessionRestarted bool      `json:"SessionRestarted,omitempty"`
	Started          time.Time `json:"Started"`
	Ended            time.Time `json:"Ended"`
}

// SessionInfo is one shell session of a sandbox (protocol 4: GET
// /v1/sessions?sandbox=ID lists them as {"sessions": [...]}, DELETE
// /v1/sessions?sandbox=ID&name=NAME ends one).
type SessionInfo struct {
	Name        string    `json:"name"`
	Shell       string    `json:"shell"`
	Created     time.Time `json:"created"`
	Commands    int64     `json:"commands"`
	RunningExec string    `json:"running_exec,omitempty"`
}

// sessionsReply is the reply of GET /v1/sessions.
type sessionsReply struct {
	Sessions []SessionInfo `json:"sessions"`
}

// ExitRecord is written once an exec has ended and its output is on disk
// (exit.json), and is the reply of a wait.
type ExitRecord struct {
	ExitStatus
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
}

// ExecInfo is one entry of a sandbox's command journal.
type ExecInfo struct {
	ID      string    `json:"ID"`
	Argv    []string  `json:"Argv"`
	TTY     bool      `json:"TTY"`
	Started time.Time `json:"Started"`
	Running bool      `json:"Running"`
	// Exit is set once the command has ended (or was lost).
	Exit        *ExitStatus `json:"Exit"`
	StdoutBytes int64       `json:"StdoutBytes"`
	StderrBytes int64       `json:"StderrBytes"`
	// Session it ran in; Sealed if it ran sealed (protocol 4).
	Session string `json:"Session,omitempty"`
	Sealed  bool   `json:"Sealed,omitempty"`
	// StepKey is ExecSpec.StepKey (protocol 6).
	StepKey string `json:"StepKey,omitempty"`
}

// journalEntry is an exec's spec.json: what ListExecs reports of it.
type journalEntry struct {
	ID      string    `json:"id"`
	Argv    []string  `json:"argv"`
	TTY     bool      `json:"tty,omitempty"`
	Started time.Time `json:"started"`
	Session string    `json:"session,omitempty"`
	// Sealed: the command runs sealed (protocol 4).
	Sealed bool `json:"sealed,omitempty"`
	// StepKey: ExecSpec.StepKey (protocol 6).
	StepKey string `json:"step_key,omitempty"`
}

// Stream names an exec output stream (the numbers of sandbox.Stream).
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

// EventType says what happened to a sandbox.
type EventType string

// The events a keeper reports.
const (
	EventExited EventType = "exited" // its init ended
	EventOOM    EventType = "oom"    // the kernel killed one of its processes for memory
	EventFailed EventType = "failed" // it cannot go on (a lazy layer's data could not be read)
)

// Event is a change the keeper observed.
type Event struct {
	Sandbox string    `json:"Sandbox"`
	Type    EventType `json:"Type"`
	Reason  string    `json:"Reason"`
	Time    time.Time `json:"Time"`
}

// EventsReply carries events and the cursor to ask from next.
type EventsReply struct {
	Events []Event `json:"events"`
	Cursor string  `json:"cursor"`
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
	// SwappedBytes is the sandbox's memory in swap (protocol 6): a paused
	// sandbox's, or what a resumed one has not used since.
	SwappedBytes int64 `json:"swapped_bytes,omitempty"`
}

// NetworkRequest sets a sandbox's network (protocol 5): PUT
// /v1/network?sandbox=ID. The first PUT for a sandbox gives it a link to
// the node's router namespace (internal/netns) and the node resolver; each
// later one replaces the policy, which applies to new connections at once
// and closes established connections it no longer allows.
type NetworkRequest struct {
	// Policy is the policy's JSON document (internal/netpolicy,
	// ParsePolicyJSON), as the edge validated and stored it. Mode none
	// keeps the link but allows nothing.
	Policy json.RawMessage `json:"policy"`
}

// NetworkInfo is a sandbox's network as the keeper enforces it: the reply
// of PUT and GET /v1/network?sandbox=ID. DELETE /v1/network?sandbox=ID
// removes the link (the sandbox keeps loopback only); deleting the
// sandbox does that too.
type NetworkInfo struct {
	// Policy is the policy in force (a JSON document), empty when the
	// sandbox has no network.
	Policy json.RawMessage `json:"policy,omitempty"`
	// Address is the sandbox's own address on its link (eth0), Router the
	// router end's: the sandbox's gateway and resolver.
	Address string `json:"address,omitempty"`
	Router  string `json:"router,omitempty"`
	// Counters since the link was made.
	BytesOut    int64 `json:"bytes_out"`
	BytesIn     int64 `json:"bytes_in"`
	ConnsOut    int64 `json:"conns_out"`
	ConnsActive int64 `json:"conns_active"`
	Denied      int64 `json:"denied"`
	DNSQueries  int64 `json:"dns_queries"`
	DNSDenied   int64 `json:"dns_denied"`
	// Denials are the most recent denied attempts, oldest first (at most
	// 64 kept).
	Denials []Denial `json:"denials,omitempty"`
}

// NodeNetwork is the node's network as a whole (protocol 5): the reply of
// GET /v1/network/node. The counters add up every sandbox's since the
// keeper opened the node's network, deleted sandboxes' included, so they
// only grow while the keeper runs (a new keeper starts again from zero);
// ConnsActive is the connections open now. A node that has not opened
// its network (no sandbox was given one) answers zeros.
type NodeNetwork struct {
	BytesOut    int64 `json:"bytes_out"`
	BytesIn     int64 `json:"bytes_in"`
	ConnsOut    int64 `json:"conns_out"`
	ConnsActive int64 `json:"conns_active"`
	Denied      int64 `json:"denied"`
	DNSQueries  int64 `json:"dns_queries"`
	DNSDenied   int64 `json:"dns_denied"`
	// Links are the sandboxes' links in the router namespace;
	// ProxySandboxes and ResolverSandboxes the sandboxes the proxy and
	// the node resolver keep state for (a deleted sandbox leaves none).
	Links             int `json:"links"`
	ProxySandboxes    int `json:"proxy_sandboxes"`
	ResolverSandboxes int `json:"resolver_sandboxes"`
}

// Denial is one denied connection or name lookup.
type Denial struct {
	Time time.Time `json:"time"`
	// Dest is "ADDR:PORT/tcp", "ADDR:PORT/udp" or, for a lookup, the name.
	Dest string `json:"dest"`
	// Name is the SNI or Host the connection named, if any.
	Name string `json:"name,omitempty"`
	// Reason is netpolicy's decision text ("denied by rule 3 (deny npm)").
	Reason string `json:"reason"`
}

// Version describes a running keeper.
type Version struct {
	// Protocol is the protocol the keeper speaks with this client: its own,
	// or 2 for a client that did not say its own.
	Protocol int    `json:"protocol"`
	Version  string `json:"version"`
	Pid      int    `json:"pid"`
	Runtime  string `json:"runtime"`
	// MinProtocol is the oldest client protocol the keeper serves
	// (protocol 3).
	MinProtocol int `json:"min_protocol,omitempty"`
	// Settings are what the keeper was started with (protocol 3; nil from
	// a protocol 2 keeper).
	Settings *Settings `json:"settings,omitempty"`
	// Drivers are the sandbox drivers the keeper has (protocol 3).
	Drivers []string `json:"drivers,omitempty"`
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
