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
//   - "zygote": a fork server that StartZygote starts once, so that an exec
//     costs a fork of a small single-threaded process instead of an execve
//     of the whole binary. It serves requests on a SOCK_SEQPACKET socket on
//     descriptor 3, one after the other; for each it forks a worker, which
//     does what the exec helper does and answers on the request's own
//     status descriptor, and goes back to the socket without waiting for
//     it. The kernel reaps the workers (SIGCHLD is ignored). The zygote
//     ignores every signal it can, is not dumpable, dies with its parent
//     and exits when the other end of its socket closes.
//
// A zygote request is one SEQPACKET message: an 8-byte header (a magic
// word and the config's length, little-endian), the encoded config and,
// as SCM_RIGHTS, four descriptors: the status descriptor, stdin, stdout and
// stderr. A config larger than a chunk (64 KiB; one message must fit the
// socket's send buffer) continues in further messages, each a header (a
// second magic word and the offset of its bytes) and the next bytes, sent
// without another request in between. The zygote answers a malformed
// request with an "err" line on its status descriptor, when it has one,
// and goes on serving. Its only message back is a ready word once set up.
// The constants live in nsexec_linux.h, which both sides read.
//
// The configuration travels as a sequence of records, each a little-endian
// u16 tag, a little-endian u32 payload length and the payload; see the tag
// constants in config.go, which the C decoder mirrors. Any record the C
// decoder does not know is an error, so a helper never silently ignores a
// setting.
//
// Invariants (the helper being the exec helper or a zygote's worker):
//   - The helper joins the sandbox's cgroups before it does anything else
//     in the sandbox, so every process it creates is accounted there.
//   - The helper is not dumpable from the moment it starts, so processes in
//     the sandbox cannot ptrace it or open its descriptors through /proc
//     while it holds host resources.
//   - No descriptor of the helper other than 0, 1 and 2 reaches the
//     command.
//   - A zygote holds only descriptors 0-3 between requests and allocates
//     nothing per request.
package nsexec
