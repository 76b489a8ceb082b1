package keeper

import "time"

// The messages of protocol 2 as b56bd3e declared them (keeper/api.go and
// the edge/sandbox types it sent), frozen: they stand for an old peer in
// the compatibility tests. Never change them.

type v2Layer struct {
	Digest string
	Path   string
	Lazy   *v2LazyLayer `json:",omitempty"`
}

type v2LazyLayer struct {
	Meta         string
	Data         string
	DataSize     int64
	ChunkSize    int64
	ChunkDigests []string
}

type v2Resources struct {
	MemoryBytes int64
	CPUs        float64
	Pids        int64
	DiskBytes   int64
}

type v2CreateRequest struct {
	ID        string      `json:"id"`
	Layers    []v2Layer   `json:"layers"`
	Resources v2Resources `json:"resources"`
}

type v2SandboxInfo struct {
	ID           string            `json:"id"`
	State        string            `json:"state"`
	Reason       string            `json:"reason,omitempty"`
	Pid          int               `json:"pid,omitempty"`
	StartTime    uint64            `json:"start_time,omitempty"`
	Created      time.Time         `json:"created"`
	Adopted      bool              `json:"adopted,omitempty"`
	RunningExecs int               `json:"running_execs,omitempty"`
	DiskLimit    int64             `json:"disk_limit,omitempty"`
	Disk         string            `json:"disk,omitempty"`
	Slot         string            `json:"slot,omitempty"`
	IDBase       uint32            `json:"id_base,omitempty"`
	IDSize       uint32            `json:"id_size,omitempty"`
	NS           map[string]v2NSID `json:"ns,omitempty"`
}

type v2NSID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

type v2ExecSpec struct {
	ID          string
	Argv        []string
	Env         []string
	Cwd         string
	UID, GID    uint32
	Groups      []uint32
	Stdin       []byte
	StdinOpen   bool
	TTY         bool
	Rows, Cols  uint16
	Timeout     time.Duration
	OutputLimit int64
}

type v2ExecRequest struct {
	Sandbox string     `json:"sandbox"`
	Spec    v2ExecSpec `json:"spec"`
}

type v2StdinRequest struct {
	Sandbox string `json:"sandbox"`
	Exec    string `json:"exec"`
	Data    []byte `json:"data,omitempty"`
	Close   bool   `json:"close,omitempty"`
}

type v2SignalRequest struct {
	Sandbox string `json:"sandbox"`
	Exec    string `json:"exec"`
	Signal  int    `json:"signal"`
}

type v2ResizeRequest struct {
	Sandbox string `json:"sandbox"`
	Exec    string `json:"exec"`
	Rows    uint16 `json:"rows"`
	Cols    uint16 `json:"cols"`
}

type v2PackRequest struct {
	Sandbox string   `json:"sandbox"`
	Scrub   []string `json:"scrub,omitempty"`
}

type v2ExitStatus struct {
	Code            int
	Signal          int
	TimedOut        bool
	OOMKilled       bool
	StdoutTruncated bool
	StderrTruncated bool
	Lost            bool
	Started, Ended  time.Time
}

type v2ExitRecord struct {
	v2ExitStatus
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
}

type v2ExecInfo struct {
	ID          string
	Argv        []string
	TTY         bool
	Started     time.Time
	Running     bool
	Exit        *v2ExitStatus
	StdoutBytes int64
	StderrBytes int64
}

type v2Event struct {
	Sandbox string
	Type    string
	Reason  string
	Time    time.Time
}

type v2EventsReply struct {
	Events []v2Event `json:"events"`
	Cursor string    `json:"cursor"`
}

type v2Stats struct {
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

type v2Version struct {
	Protocol int    `json:"protocol"`
	Version  string `json:"version"`
	Pid      int    `json:"pid"`
	Runtime  string `json:"runtime"`
}

type v2WireError struct {
	Kind    string  `json:"kind"`
	Message string  `json:"message"`
	Retry   float64 `json:"retry_seconds,omitempty"`
}
