// Package sandbox is the old home of the backend contract, which moved to
// internal/sandbox (issue 11). It only names the moved types for the
// keeper until its imports move too; new code imports internal/sandbox.
package sandbox

import "github.com/dsecproject/dsec/internal/sandbox"

// Types of internal/sandbox, under their old import path.
type (
	Layer      = sandbox.Layer
	LazyLayer  = sandbox.LazyLayer
	Resources  = sandbox.Resources
	State      = sandbox.State
	Stream     = sandbox.Stream
	ExecSpec   = sandbox.ExecSpec
	ExitStatus = sandbox.ExitStatus
	ExecInfo   = sandbox.ExecInfo
	Event      = sandbox.Event
	EventType  = sandbox.EventType
)

// Constants of internal/sandbox, under their old import path.
const (
	StateRunning = sandbox.StateRunning
	StateExited  = sandbox.StateExited
	Stdout       = sandbox.Stdout
	Stderr       = sandbox.Stderr
	EventExited  = sandbox.EventExited
	EventOOM     = sandbox.EventOOM
	EventFailed  = sandbox.EventFailed
)
