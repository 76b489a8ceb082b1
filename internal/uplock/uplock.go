// Package uplock makes one `dsec up` per state directory: the running one
// holds a lock on <state>/run/up.lock and records who it is (pid, process
// start time, API address) in <state>/run/up.json, so that a second `up`
// says who runs and `dsec down` stops exactly that process.
package uplock

import (
	"fmt"
	"path/filepath"
)

// Record says which process runs `dsec up` on a state dir.
type Record struct {
	Pid int `json:"pid"`
	// StartTime is the process's start time in clock ticks since boot
	// (field 22 of /proc/PID/stat): with Pid it names one process, never
	// a later one that reuses the pid.
	StartTime uint64 `json:"start_time"`
	// Listen is the API address.
	Listen string `json:"listen"`
}

// RunningError is what Acquire returns while another `dsec up` holds the
// state dir.
type RunningError struct {
	Record   Record
	StateDir string
}

func (e *RunningError) Error() string {
	if e.Record.Pid == 0 {
		return fmt.Sprintf("dsec is already running on %s (starting up): stop it with `dsec down`", e.StateDir)
	}
	return fmt.Sprintf("dsec is already running (pid %d, API at %s): stop it with `dsec down`", e.Record.Pid, e.Record.Listen)
}

func lockPath(stateDir string) string   { return filepath.Join(stateDir, "run", "up.lock") }
func recordPath(stateDir string) string { return filepath.Join(stateDir, "run", "up.json") }
