package keeper

import (
	"context"
	"os"
)

// The keeper is a backend-neutral node supervisor: its core keeps what
// every kind of sandbox needs, and a Driver per kind makes and runs them.
//
// The core (keeper_linux.go, sandbox_linux.go, exec_linux.go) owns
//   - the process side: the keeper is the child subreaper of the node, and
//     its reaper the only waiter for children; adopted inits are watched
//     through pidfds;
//   - the table of sandboxes, their records (keeper.json) and their
//     adoption by a restarted keeper;
//   - exec: the journal (spec.json, exit.json), output files with their
//     caps and quota, stdin, TTY pumps, timeouts, signals, and `lost` for
//     an exec whose end no keeper saw;
//   - the event log, the fd vault (vault_linux.go), the settings, the
//     versioned API (api.go).
//
// A driver owns what makes its kind of sandbox: for the container driver
// (container_linux.go, the first) the OCI runtime, the overlay root over
// EROFS layers (and the lazy ones it serves through FUSE), cgroups, the
// per-sandbox host id ranges and user namespaces, writable-layer disks, the
// exec zygote, warm sandboxes and packing. The seams for the next ones:
//   - a runsc driver (gVisor tier): Start runs `runsc run --detach` with
//     the same bundle; Exec runs `runsc exec` as the exec's host process,
//     which relays signals and stdio; Terminal is runsc's console socket.
//   - a VMM driver (microvm and vm tiers): Start runs QEMU as the keeper's
//     child (its pid is the sandbox's "init") with the layers as read-only
//     block devices; Exec starts a host relay that asks the guest agent
//     over the serial channel (the fd vault keeps it open across restarts)
//     and stands for the command, so signals and exit statuses go the same
//     way as a container's.
//
// Every method but Name and Run is called with the sandbox's op lock held
// by the core (create, delete, exec start), and never for one sandbox at
// once.
type Driver interface {
	// Name is the driver's name in CreateRequest.Driver and records.
	Name() string
	// Start makes and starts the sandbox req asks for as b, named by b's
	// info (ID). On success b.info has the init's Pid, StartTime and
	// State running, and b.initExit its wait status channel when the init
	// is the keeper's child; the core records and watches it. On failure
	// the core calls Destroy.
	Start(ctx context.Context, b *box, req CreateRequest) error
	// Destroy removes everything of b, the sandbox's directory last, in
	// reverse order of creation; every step is idempotent, so that a
	// half-made sandbox, or one known by its name only (after a crash), is
	// removed too. What it cannot remove it logs; a restart retries.
	Destroy(ctx context.Context, b *box)
	// Adopt takes back what the sandbox of a record a previous keeper
	// wrote holds (its id range), before the core watches its init.
	Adopt(b *box)
	// Sweep removes what the driver finds on the node that belongs to no
	// sandbox named in used (slots and disk names): what a crash left.
	Sweep(ctx context.Context, used map[string]bool)
	// Exec starts spec's command in the running sandbox b with stdio and
	// returns the host pid that stands for it: the core waits for it,
	// signals its process group and kills it at the timeout.
	Exec(ctx context.Context, b *box, spec ExecSpec, stdio [3]*os.File) (pid int, err error)
	// Terminal opens a terminal for a TTY exec of spec: the master the
	// core pumps and the slave that becomes the command's stdio.
	Terminal(b *box, spec ExecSpec) (master, slave *os.File, err error)
	// OOMKills counts the processes of b the kernel killed for memory.
	OOMKills(b *box) (int64, error)
	// Stats reports b's resource use (the core adds exec output).
	Stats(b *box) (Stats, error)
	// Run does the driver's background work (pools, watchers) until ctx
	// ends.
	Run(ctx context.Context)
	// Close releases what the driver holds in the keeper process;
	// sandboxes keep running.
	Close()
}
