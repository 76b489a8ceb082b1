package sandbox

import "time"

// Defaults are the limits and lifetimes of a sandbox whose request leaves
// them out.
type Defaults struct {
	MemoryBytes int64
	CPUs        float64
	Pids        int64
	DiskBytes   int64
	TTL         time.Duration
	IdleTTL     time.Duration
	// PausedTTL bounds the time a sandbox may stay paused.
	PausedTTL time.Duration
}

// ContractDefaults are CONTRACT.md's defaults: memory 512 MiB, 1 CPU, 4096
// pids, a 10 GiB writable disk, hard TTL 1 h, idle TTL 15 min, paused TTL
// 24 h.
var ContractDefaults = Defaults{
	MemoryBytes: 512 << 20,
	CPUs:        1,
	Pids:        4096,
	DiskBytes:   10 << 30,
	TTL:         time.Hour,
	IdleTTL:     15 * time.Minute,
	PausedTTL:   24 * time.Hour,
}
