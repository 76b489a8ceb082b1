// Package dsec is the Go client of the dsec sandbox platform: create
// sandboxes, run commands in them, move files in and out, manage images and
// API keys.
//
// It is the module github.com/dsecproject/dsec/sdk/go, which requires the
// API module (github.com/dsecproject/dsec/api), Connect, protobuf and a TOML
// parser: none of the server's dependencies (no etcd, no gRPC).
//
// A program normally finds the server and its key the way the dsec CLI
// does, then shares one Client:
//
//	cfg, err := dsec.LoadConfig(dsec.Config{}) // DSEC_ADDR, DSEC_API_KEY, config file, admin.key
//	if err != nil { ... }
//	c, err := dsec.New(cfg)
//	if err != nil { ... }
//	defer c.Close()
//
//	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "python:3.12", Memory: 1 << 30})
//	if err != nil { ... }
//	defer sb.Delete(context.WithoutCancel(ctx))
//	res, err := sb.Shell(ctx, "python3 -c 'print(6*7)'")
//	// res.Stdout == "42\n", res.ExitCode == 0
//
// # Errors
//
// Every failed call returns an error that wraps one of the kinds ErrNotFound,
// ErrInvalidArgument, … (classify it with errors.Is), usually as an *Error
// that also carries the server's message and its retry hint (RetryAfter, set
// with ErrResourceExhausted when the platform is full). A canceled context
// gives context.Canceled. Create returns a refusal at once unless
// Config.CreateRetries asks it to wait the hint and try again (each retry is
// logged at Debug; waits stop at the context's deadline). A command that
// runs and fails is not an error: its ExitStatus says how it ended.
//
// # Commands
//
// Exec and Shell run a command to its end and collect its output;
// ExecStream streams it. Start returns a Process for interactive use: write
// its input (Process.Stdin, with ExecRequest.StdinOpen or TTY), resize its
// terminal, signal it, and Wait for its output and exit. ExecDetached starts
// a command that runs on by itself; Attach follows any command again by its
// exec ID, from byte offsets of its output, and ListExecs lists them all.
//
// # Sessions and grading
//
// Sandbox.Session names a shell that lives on between commands, so that
// cwd, environment, functions and background jobs carry over, while each
// command keeps its own exec ID, output and exit code:
//
//	ss := sb.Session("main")
//	_, err = ss.Run(ctx, "cd /workspace && export MODE=test")
//	res, err = ss.Run(ctx, "pwd; echo $MODE") // "/work\ntest\n"
//
// A result's SessionLost and SessionRestarted say when a session's shell was
// lost and replaced. For graders of untrusted work, WithSealed runs a
// command with the sandbox's other processes frozen (or killed) and the
// platform's own tools first on PATH, and GradeFrom copies chosen paths into
// a fresh sandbox of the original image and runs the grader there
// (docs/grading.md in the repository says when to use which).
//
// # Rollouts and steps
//
// CreateRollout makes the sandboxes of one agent rollout together (a
// worker, the agent's sandbox, helpers) with one ID, one lifetime and a
// small status (SetRolloutStatus); Rollout(id) reconnects to it after a
// restart. An exec's StepKey (WithStepKey) names a step of the work: a
// second exec with the key is refused, and RunSteps runs a list of steps
// each at most once, reading back the journal's results of those that ran
// and following those that run (docs/rollouts.md in the repository).
//
// # Files
//
// ReadFile, WriteFile, Download and Upload move single files; Stat,
// ListDir, MakeDir, Remove and Rename act on the sandbox's tree.
// DownloadTar and UploadTar move trees as tar streams, and UploadDir and
// DownloadDir copy local directories in and out. DownloadDir extracts
// through an os.Root, so an archive from a hostile sandbox cannot write
// outside the target directory.
//
// # Connections
//
// The Client speaks Connect over HTTP/2 without TLS (h2c, prior knowledge)
// to http:// addresses, so that thousands of concurrent calls and exec
// streams share few connections, and HTTP/2 or HTTP/1.1 over TLS to https://
// ones. Config.HTTPClient replaces that transport, for example with one
// that speaks HTTP/1.1 to a proxy that lacks h2c. Config.ShortLived is for
// programs that make a call or two and exit: the first call then goes over
// a plain HTTP/1.1 connection of its own, set up and read in the calling
// goroutine, which answers sooner in a new process (the dsec CLI sets it).
package dsec
