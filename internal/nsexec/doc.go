// Package nsexec starts commands inside a running container sandbox, and
// serves as the sandbox's init, without an OCI runtime call per exec and
// without any daemon inside the sandbox.
//
// A Go program cannot join a user or mount namespace with setns(2): the Go
// runtime is multithreaded before main runs. So the package carries a small
// C part (nsexec_linux.c, built with cgo) whose constructor runs before the
// Go runtime starts in every binary that imports this package. When the
// environment variable ModeEnv names a mode, the constructor does that
// mode's work and never returns to Go; when it is unset or empty, the
// constructor returns and the program starts normally.
//
// Modes:
//
//   - "init": the sandbox's pid 1. It closes every descriptor above 2, names
//     itself "dsec-init", blocks every signal and waits for them forever,
//     reaping every zombie on SIGCHLD and ignoring everything else. It
//     allocates nothing after start.
//   - "exec": a helper that Spawn starts. It reads an encoded ExecConfig
//     from descriptor 3, joins the cgroups listed there, joins every
//     namespace of the target process that differs from its own with one
//     setns(pidfd, ...) call, forks the command's process (which is thereby
//     inside the sandbox's pid namespace), reports one status line on
//     descriptor 4 and exits. The command's process is left orphaned and is
//     reparented to the nearest child subreaper: the caller of Spawn.
//
// The configuration travels as a sequence of records, each a little-endian
// u16 tag, a little-endian u32 payload length and the payload; see the tag
// constants in config.go, which the C decoder mirrors. Any record the C
// decoder does not know is an error, so a helper never silently ignores a
// setting.
//
// Invariants:
//   - The helper joins the sandbox's cgroups before it does anything else
//     in the sandbox, so every process it creates is accounted there.
//   - The helper is not dumpable from the moment it starts, so processes in
//     the sandbox cannot ptrace it or open its descriptors through /proc
//     while it holds host resources.
//   - No descriptor of the helper other than 0, 1 and 2 reaches the
//     command.
package nsexec
