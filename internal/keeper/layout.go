package keeper

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Layout names the files of a state directory that the keeper and the
// edge share.
type Layout struct{ StateDir string }

// RunDir holds the keeper's socket, lock, runtime state and mount points.
func (l Layout) RunDir() string { return filepath.Join(l.StateDir, "run") }

// Socket is the keeper's API socket.
func (l Layout) Socket() string { return filepath.Join(l.RunDir(), "keeper.sock") }

// NetworkDir holds the node's router network namespace (internal/netns),
// made at the first sandbox given a network.
func (l Layout) NetworkDir() string { return filepath.Join(l.RunDir(), "net") }

// SandboxAPISocket is where dsec up serves the API to sandboxes whose
// policy allows dsec-api; the node's proxy (in the keeper) connects to it
// and says which sandbox each connection is from.
func (l Layout) SandboxAPISocket() string { return filepath.Join(l.RunDir(), "sandbox-api.sock") }

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
func (l Layout) OutputPath(id, execID string, s Stream) string {
	return filepath.Join(l.ExecDir(id, execID), s.String())
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
