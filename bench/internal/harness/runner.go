//go:build linux

package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	runnerEnv     = "DSEC_BENCH_RUNNER"
	runnerHideEnv = "DSEC_BENCH_RUNNER_HIDE_CGROUP2"
	// hybridCgroup2 is where a hybrid host mounts cgroup2 beside the v1
	// hierarchies; crun refuses to run where it sees it.
	hybridCgroup2 = "/sys/fs/cgroup/unified"
	// outputKept is how much of a command's output a result carries.
	outputKept = 64 << 10
)

// RunnerConfig says how a runner starts.
type RunnerConfig struct {
	// HideCgroup2 runs the runner in its own mount namespace where a hybrid
	// host's cgroup2 mount is hidden, as dsec's keeper does for itself, so
	// that crun sees a plain cgroup v1 host. It needs root.
	HideCgroup2 bool
	// Stderr receives the runner's own complaints (default os.Stderr).
	Stderr io.Writer
}

// Runner is a helper process that runs commands for the benchmark, times
// them where they start, and is the child subreaper of everything they
// leave behind (container inits that `crun create` orphans, containerd's
// shims), which it reaps, so that nothing ends as a zombie of a host init
// that does not reap. Its methods may be called concurrently.
type Runner struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the reader has seen the runner's output end

	mu sync.Mutex
	// guarded by mu
	in      io.WriteCloser
	pending map[uint64]chan runnerResponse
	next    uint64
	closed  bool
}

// RunResult is one command's run.
type RunResult struct {
	// Elapsed is from just before the fork to the runner seeing it end.
	Elapsed time.Duration
	// Pid was the command's process.
	Pid int
	// Output is the start of its combined stdout and stderr.
	Output string
}

type runnerRequest struct {
	ID     uint64   `json:"id"`
	Argv   []string `json:"argv,omitempty"`
	Grace  int64    `json:"grace_ns,omitempty"`
	Cancel bool     `json:"cancel,omitempty"`
}

type runnerResponse struct {
	ID      uint64 `json:"id"`
	Elapsed int64  `json:"elapsed_ns"`
	Pid     int    `json:"pid"`
	OK      bool   `json:"ok"`
	Status  string `json:"status"`
	Output  string `json:"output"`
}

// StartRunner starts a runner; Close stops it.
func StartRunner(cfg RunnerConfig) (*Runner, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("start runner: %w", err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), runnerEnv+"=1")
	if cfg.HideCgroup2 {
		cmd.Env = append(cmd.Env, runnerHideEnv+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	}
	cmd.Stderr = cfg.Stderr
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("start runner: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start runner: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start runner: %w", err)
	}
	r := &Runner{cmd: cmd, in: in, done: make(chan struct{}), pending: map[uint64]chan runnerResponse{}}
	go r.read(out)
	return r, nil
}

// Pid is the runner's process.
func (r *Runner) Pid() int { return r.cmd.Process.Pid }

func (r *Runner) read(out io.Reader) {
	defer close(r.done)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 0, 1<<16), 4*outputKept)
	for sc.Scan() {
		var resp runnerResponse
		if err := json.Unmarshal(sc.Bytes(), &resp); err != nil {
			continue
		}
		r.mu.Lock()
		ch := r.pending[resp.ID]
		delete(r.pending, resp.ID)
		r.mu.Unlock()
		if ch != nil {
			ch <- resp
		}
	}
}

func (r *Runner) send(req runnerRequest) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("runner closed")
	}
	_, err = r.in.Write(append(b, '\n'))
	return err
}

// Run runs argv (argv[0] looked up in PATH) and waits for it to end. A
// command that does not exit 0 is an error that carries its output. When
// ctx ends first the command is killed.
func (r *Runner) Run(ctx context.Context, argv ...string) (RunResult, error) {
	return r.run(ctx, 0, argv)
}

// RunDaemon is Run for a long-running program: when ctx ends it gets
// SIGTERM, and SIGKILL only after grace.
func (r *Runner) RunDaemon(ctx context.Context, grace time.Duration, argv ...string) (RunResult, error) {
	return r.run(ctx, grace, argv)
}

func (r *Runner) run(ctx context.Context, grace time.Duration, argv []string) (RunResult, error) {
	if len(argv) == 0 {
		return RunResult{}, errors.New("run: no command")
	}
	ch := make(chan runnerResponse, 1)
	r.mu.Lock()
	r.next++
	id := r.next
	r.pending[id] = ch
	r.mu.Unlock()
	forget := func() {
		r.mu.Lock()
		delete(r.pending, id)
		r.mu.Unlock()
	}
	if err := r.send(runnerRequest{ID: id, Argv: argv, Grace: int64(grace)}); err != nil {
		forget()
		return RunResult{}, fmt.Errorf("run %s: %w", argv[0], err)
	}
	cancelled := ctx.Done()
	for {
		select {
		case resp := <-ch:
			res := RunResult{Elapsed: time.Duration(resp.Elapsed), Pid: resp.Pid, Output: resp.Output}
			if !resp.OK {
				return res, fmt.Errorf("%s: %s: %s", strings.Join(argv, " "), resp.Status, strings.TrimSpace(resp.Output))
			}
			return res, nil
		case <-cancelled:
			cancelled = nil
			if err := r.send(runnerRequest{ID: id, Cancel: true}); err != nil {
				forget()
				return RunResult{}, fmt.Errorf("run %s: %w", argv[0], ctx.Err())
			}
		case <-r.done:
			forget()
			return RunResult{}, fmt.Errorf("run %s: the runner ended", argv[0])
		}
	}
}

// Close stops the runner: commands still running are cancelled (daemons
// get SIGTERM and their grace), and after timeout the runner is killed.
// Processes the commands left behind (detached containers) are not its
// business: stop them first.
func (r *Runner) Close(timeout time.Duration) error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		r.in.Close()
	}
	r.mu.Unlock()
	exited := make(chan error, 1)
	go func() {
		<-r.done
		exited <- r.cmd.Wait()
	}()
	select {
	case err := <-exited:
		return err
	case <-time.After(timeout):
		_ = r.cmd.Process.Kill()
		<-exited
		return fmt.Errorf("runner did not stop within %s: killed", timeout)
	}
}

// RunnerMain makes this process a runner when StartRunner started it, and
// then exits; otherwise it returns at once. Call it first in main (and in
// TestMain of tests that start runners).
func RunnerMain() {
	if os.Getenv(runnerEnv) == "" {
		return
	}
	os.Exit(serveRunner(os.Stdin, os.Stdout))
}

// helperState is the runner process's side.
type helperState struct {
	rp  *reaper
	env []string
	wg  sync.WaitGroup // the requests running

	outMu sync.Mutex // serialises the responses written to out
	out   *json.Encoder

	mu sync.Mutex
	// guarded by mu
	pids map[uint64]*helperProc // running requests
}

// helperProc is one request's command.
type helperProc struct {
	grace time.Duration
	// guarded by helperState.mu
	pid       int // 0 until started
	cancelled bool
}

func serveRunner(in io.Reader, out io.Writer) int {
	if os.Getenv(runnerHideEnv) != "" {
		if err := unix.Unmount(hybridCgroup2, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			fmt.Fprintln(os.Stderr, "runner: hide cgroup2:", err)
			return 1
		}
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "runner: become subreaper:", err)
		return 1
	}
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, runnerEnv+"=") && !strings.HasPrefix(e, runnerHideEnv+"=") {
			env = append(env, e)
		}
	}
	h := &helperState{out: json.NewEncoder(out), rp: newReaper(), env: env, pids: map[uint64]*helperProc{}}
	go h.rp.loop()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		var req runnerRequest
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			fmt.Fprintln(os.Stderr, "runner: bad request:", err)
			continue
		}
		if req.Cancel {
			h.cancel(req.ID)
			continue
		}
		// Registered before it starts, so that a cancel that overtakes the
		// start is not lost.
		p := &helperProc{grace: time.Duration(req.Grace)}
		h.mu.Lock()
		h.pids[req.ID] = p
		h.mu.Unlock()
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.respond(h.runOne(req, p))
			h.mu.Lock()
			delete(h.pids, req.ID)
			h.mu.Unlock()
		}()
	}
	// No more requests: Close was called, or the benchmark died. Whatever
	// still runs is stopped as if its request had been cancelled.
	h.mu.Lock()
	ids := make([]uint64, 0, len(h.pids))
	for id := range h.pids {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		h.cancel(id)
	}
	h.wg.Wait()
	return 0
}

func (h *helperState) respond(resp runnerResponse) {
	h.outMu.Lock()
	defer h.outMu.Unlock()
	_ = h.out.Encode(resp)
}

func (h *helperState) cancel(id uint64) {
	h.mu.Lock()
	p := h.pids[id]
	var pid int
	if p != nil {
		p.cancelled = true
		pid = p.pid
	}
	h.mu.Unlock()
	if pid != 0 {
		h.stop(id, p, pid)
	}
}

// stop kills a cancelled command: at once, or with SIGTERM first and
// SIGKILL after its grace.
func (h *helperState) stop(id uint64, p *helperProc, pid int) {
	if p.grace <= 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	time.AfterFunc(p.grace, func() {
		h.mu.Lock()
		still := h.pids[id] == p
		h.mu.Unlock()
		if still {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

func (h *helperState) runOne(req runnerRequest, p *helperProc) runnerResponse {
	resp := runnerResponse{ID: req.ID}
	if len(req.Argv) == 0 {
		resp.Status = "no command"
		return resp
	}
	path, err := exec.LookPath(req.Argv[0])
	if err != nil {
		resp.Status = err.Error()
		return resp
	}
	outf, err := os.CreateTemp("", "dsec-bench-run-*.out")
	if err != nil {
		resp.Status = err.Error()
		return resp
	}
	_ = os.Remove(outf.Name())
	defer outf.Close()
	// Stdin is a pipe at its end, never the host's /dev/null: OCI runtimes
	// chown their stdio to the container's root, and the host's device
	// node would stay owned by a container uid.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		resp.Status = err.Error()
		return resp
	}
	stdinW.Close()
	defer stdinR.Close()
	files := []uintptr{stdinR.Fd(), outf.Fd(), outf.Fd()}
	t0 := time.Now()
	pid, ch, err := h.rp.start(path, req.Argv, h.env, files)
	if err != nil {
		resp.Status = fmt.Sprintf("start: %v", err)
		return resp
	}
	h.mu.Lock()
	p.pid = pid
	cancelled := p.cancelled
	h.mu.Unlock()
	if cancelled {
		h.stop(req.ID, p, pid)
	}
	ws := <-ch
	resp.Elapsed = time.Since(t0).Nanoseconds()
	resp.Pid = pid
	buf := make([]byte, outputKept)
	n, _ := outf.ReadAt(buf, 0)
	resp.Output = strings.ToValidUTF8(string(buf[:n]), "?")
	resp.OK = ws.Exited() && ws.ExitStatus() == 0
	switch {
	case ws.Exited():
		resp.Status = fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		resp.Status = fmt.Sprintf("killed by %s", ws.Signal())
	default:
		resp.Status = fmt.Sprintf("ended with status %#x", int(ws))
	}
	return resp
}

// reaper waits for every child of the runner: those it started, whose
// status it hands to their starter, and the orphans it inherits as their
// subreaper, which it only reaps.
type reaper struct {
	kick chan struct{} // a child was started

	mu sync.Mutex
	// guarded by mu
	waiting map[int]chan syscall.WaitStatus
}

func newReaper() *reaper {
	return &reaper{kick: make(chan struct{}, 1), waiting: map[int]chan syscall.WaitStatus{}}
}

// start forks and execs path; mu is held across the fork so that the loop
// cannot reap the child before it is registered.
func (r *reaper) start(path string, argv, env []string, files []uintptr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{Env: env, Files: files})
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiting[pid] = ch
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return pid, ch, nil
}

// loop reaps children until the process exits.
func (r *reaper) loop() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.ECHILD):
			<-r.kick
			continue
		case err != nil:
			time.Sleep(10 * time.Millisecond)
			continue
		}
		r.mu.Lock()
		ch := r.waiting[pid]
		delete(r.waiting, pid)
		r.mu.Unlock()
		if ch != nil {
			ch <- ws
		}
	}
}
