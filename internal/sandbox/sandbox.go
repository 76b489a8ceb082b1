// Package sandbox is the contract between the node core (the edge) and
// the isolation backends (container today; gVisor, microVM, VM and FnCall
// pools later), and the domain types they share. It imports nothing of
// dsec but errdefs, so the edge, the keeper, the control plane and every
// backend can depend on it.
//
// A backend implements Backend: lifecycle, exec and files, the same for
// every isolation tier. What only some backends can do is an optional
// interface found by type assertion (Pauser, Snapshotter,
// NetworkAttacher, Packer, EventSource, PortDialer); properties that are not
// operations (the limits a backend enforces, TTYs, surviving a restart)
// are declared in its Description. Capabilities joins both into the one
// list users see (dsec backends), and Lacks makes the refusal of an
// operation a backend does not have.
//
// Invariants every Backend keeps:
//   - A sandbox exists from a successful Create until Delete returns nil;
//     Delete is idempotent and removes everything Create made (processes,
//     mounts, cgroups, files), also after a crash of the edge. A Delete
//     that could not remove something returns an error (errors.Join of
//     each failure), so the caller retries it.
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
	"net"
)

// Backend creates and runs sandboxes of one isolation kind.
type Backend interface {
	// Describe names the backend, its isolation tier and the properties it
	// keeps. It does not change while the backend is open.
	Describe() Description
	Lifecycle
	Execer
	Files
	// Close releases what the backend holds in this process; sandboxes keep
	// running.
	Close() error
}

// Lifecycle makes, finds and removes sandboxes.
type Lifecycle interface {
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
	// Stats reports the sandbox's resource use.
	Stats(ctx context.Context, id string) (Stats, error)
}

// Execer runs commands in sandboxes from outside them.
type Execer interface {
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
}

// Files reads and writes files in a sandbox's own view of its file system.
type Files interface {
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
}

// EventSource is the optional capability of reporting events (init exits,
// OOM kills) as they happen. Events blocks until there are events after
// cursor (or ctx ends) and returns them with the next cursor; a cursor
// from an earlier incarnation of the backend's node process restarts the
// stream.
type EventSource interface {
	Events(ctx context.Context, cursor string) ([]Event, string, error)
}

// Sessioner is the optional capability of named shell sessions: an exec
// whose ExecSpec.Session is set runs its one command line (Argv[0]) in the
// sandbox's long-lived shell of that name, made on first use, so that cwd,
// environment, functions and background jobs carry from one command to the
// next. ListSessions lists them by name; DeleteSession kills a session's
// shell and every process it started (ErrNotFound for an unknown name).
type Sessioner interface {
	ListSessions(ctx context.Context, id string) ([]SessionInfo, error)
	DeleteSession(ctx context.Context, id, name string) error
}

// PortDialer is the optional capability of connecting to a TCP port a
// sandbox listens on, on its own loopback (127.0.0.1:PORT, or [::1]:PORT,
// as seen inside it), from outside: the way in of the platform's ports
// proxy, with or without a network attachment (a sandbox without network
// still has loopback). A port nothing listens on is Unavailable, at once.
type PortDialer interface {
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

// Pauser is the optional capability of pausing a sandbox: its processes
// stop and its memory is given back to the node (reclaimed or swapped out)
// while its state stays; Resume makes it run on where it was. Both are
// idempotent (pausing a paused sandbox reports it as it is) and survive a
// restart of the backend's processes: a paused sandbox found after one is
// still paused (Status.Paused), never thawed by it.
type Pauser interface {
	Pause(ctx context.Context, id string) (PauseInfo, error)
	Resume(ctx context.Context, id string) (PauseInfo, error)
}

// PauseInfo is where a sandbox's memory is when a Pause or Resume returns.
type PauseInfo struct {
	// Resident is the sandbox's memory in RAM; Swapped its memory out of
	// RAM, in the node's swap. A pause on a node without swap leaves
	// Resident as it was (the sandbox only stops).
	Resident, Swapped int64
}

// Snapshotter is the optional capability of saving a whole sandbox (its
// memory and devices, as a microVM can) to storage the backend owns, and
// of making a new sandbox from such a snapshot.
type Snapshotter interface {
	// Snapshot saves sandbox id under name; the sandbox runs on.
	Snapshot(ctx context.Context, id, name string) error
	// Restore creates the sandbox spec.ID from the snapshot name.
	Restore(ctx context.Context, name string, spec Spec) (Status, error)
}

// NetworkAttacher is the optional capability of putting a sandbox into a
// network attachment the node prepared, at create (Spec.Network) or while
// it runs; a nil attachment takes it out (loopback only).
type NetworkAttacher interface {
	AttachNetwork(ctx context.Context, id string, a *NetworkAttachment) error
}
