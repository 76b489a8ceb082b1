package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazyregexp"
)

// execProc is one running or finished command.
type execProc struct {
	pid  int           // the command's host pid, also its process group
	tty  *os.File      // the pty master of a TTY exec; owned by its pump
	done chan struct{} // closed once rec is final and on disk
	// stdinTurn orders the writes to stdin (or the TTY): a writer puts a
	// token in to take its turn and takes it out when done. The writer of
	// the initial bytes holds the turn from the start, so a WriteStdin that
	// arrives while they are being written waits for them.
	stdinTurn chan struct{}

	mu sync.Mutex
	// guarded by mu
	stdin *os.File // nil once closed or for a TTY exec
	rec   ExitRecord
}

var execIDRe = lazyregexp.New(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

// sealer is a driver that runs sealed execs (seal_linux.go).
type sealer interface {
	// execSealed starts spec sealed; end, called once the command has
	// ended, kills what it left and thaws the sandbox.
	execSealed(ctx context.Context, b *box, spec ExecSpec, stdio [3]*os.File) (pid int, end func(), err error)
	// sealBusy fails while a sealed exec runs in the sandbox.
	sealBusy(id string) error
}

// drainGrace is how long output is awaited after a command exits; its
// background children may hold the pipes open much longer, and their later
// output is still appended.
const drainGrace = 200 * time.Millisecond

// stdinWriteTimeout bounds a WriteStdin to a command that does not read.
const stdinWriteTimeout = 30 * time.Second

// sealBusy refuses an operation on a sandbox while a sealed exec runs in it
// (FailedPrecondition naming it); nil for a sandbox it does not know.
func (k *Keeper) sealBusy(id string) error {
	b, err := k.lookup(id)
	if err != nil {
		return nil
	}
	if s, ok := k.driverOf(b).(sealer); ok {
		return s.sealBusy(id)
	}
	return nil
}

func (k *Keeper) startExec(ctx context.Context, req ExecRequest) error {
	spec := req.Spec
	if spec.Seal != 0 && spec.Session != "" {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: a sealed command runs on its own, not in session %.80q: drop one of the two", spec.Session)
	}
	if spec.Session != "" {
		// A session's shell is one of the sandbox's processes: frozen
		// while a sealed exec runs, so its command would only hang.
		if err := k.sealBusy(req.Sandbox); err != nil {
			return err
		}
		return k.startSessionExec(ctx, req)
	}
	tm := newPhases("exec")
	defer func() { k.log.Debug("exec start phases", "exec", spec.ID, "ms", tm.String()) }()
	if !execIDRe.MatchString(spec.ID) {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec id %q: use 1-64 of [a-zA-Z0-9_.-]", spec.ID)
	}
	if len(spec.Argv) == 0 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec: empty command")
	}
	b, err := k.lookup(req.Sandbox)
	if err != nil {
		return err
	}
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	info, deleting := b.info, b.deleting
	_, dup := b.execs[spec.ID]
	b.mu.Unlock()
	switch {
	case deleting:
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", req.Sandbox)
	case info.State != StateRunning:
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s (%s): create a new one", req.Sandbox, info.State, info.Reason)
	case info.Paused:
		return pausedError(req.Sandbox)
	case dup:
		return errdefs.Newf(errdefs.ErrAlreadyExists, "exec %s exists in sandbox %s", spec.ID, req.Sandbox)
	}
	drv := k.driverOf(b)
	s, canSeal := drv.(sealer)
	switch {
	case canSeal:
		if err := s.sealBusy(req.Sandbox); err != nil {
			return err
		}
	case spec.Seal != 0:
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s runs on a driver that cannot run sealed execs: run it in a container sandbox", req.Sandbox)
	}
	dir := k.l.ExecDir(req.Sandbox, spec.ID)
	if _, err := os.Stat(dir); err == nil {
		return errdefs.Newf(errdefs.ErrAlreadyExists, "exec %s exists in sandbox %s", spec.ID, req.Sandbox)
	}
	releaseStep, err := k.claimStep(req.Sandbox, spec.StepKey, spec.ID)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		releaseStep()
		if errors.Is(err, os.ErrExist) {
			return errdefs.Newf(errdefs.ErrAlreadyExists, "exec %s exists in sandbox %s", spec.ID, req.Sandbox)
		}
		return fmt.Errorf("exec dir: %w", err)
	}
	limit := spec.OutputLimit
	if limit <= 0 {
		limit = k.cfg.OutputLimit
	}
	started := time.Now()
	if err := writeJSON(filepath.Join(dir, "spec.json"), journalEntry{ID: spec.ID, Argv: spec.Argv, TTY: spec.TTY, Started: started.UTC(), Sealed: spec.Seal != 0, StepKey: spec.StepKey}); err != nil {
		os.RemoveAll(dir)
		releaseStep()
		return fmt.Errorf("exec journal: %w", err)
	}
	p := &execProc{done: make(chan struct{}), stdinTurn: make(chan struct{}, 1)}
	if len(spec.Stdin) > 0 {
		p.stdinTurn <- struct{}{} // given back once the initial bytes are written
	}
	b.mu.Lock()
	b.execs[spec.ID] = p
	b.mu.Unlock()
	fail := func(err error) error {
		b.mu.Lock()
		delete(b.execs, spec.ID)
		b.mu.Unlock()
		os.RemoveAll(dir)
		releaseStep()
		return err
	}

	// owned are closed on return: our copies of what the child inherits.
	var owned []*os.File
	defer func() {
		for _, f := range owned {
			f.Close()
		}
	}()
	// kept are handed to goroutines on success, closed on failure.
	var kept []*os.File
	closeKept := func() {
		for _, f := range kept {
			f.Close()
		}
	}
	var outs [2]*os.File
	for i, s := range []Stream{Stdout, Stderr} {
		f, err := os.OpenFile(k.l.OutputPath(req.Sandbox, spec.ID, s), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			closeKept()
			return fail(fmt.Errorf("exec output: %w", err))
		}
		outs[i] = f
		kept = append(kept, f)
	}
	var stdio [3]*os.File
	var readers [2]*os.File // what the pumps read: pipes, or the pty master
	if spec.TTY {
		master, slave, err := drv.Terminal(b, spec)
		if err != nil {
			closeKept()
			return fail(err)
		}
		owned = append(owned, slave)
		kept = append(kept, master)
		stdio = [3]*os.File{slave, slave, slave}
		readers[0], p.tty = master, master
	} else {
		for i := range 2 {
			r, w, err := os.Pipe()
			if err != nil {
				closeKept()
				return fail(fmt.Errorf("exec pipe: %w", err))
			}
			owned = append(owned, w)
			kept = append(kept, r)
			stdio[i+1], readers[i] = w, r
		}
		if len(spec.Stdin) > 0 || spec.StdinOpen {
			r, w, err := os.Pipe()
			if err != nil {
				closeKept()
				return fail(err)
			}
			owned = append(owned, r)
			kept = append(kept, w)
			stdio[0], p.stdin = r, w
		} else {
			// No stdin: a pipe at its end, never the host's /dev/null,
			// an inode of the host the command could hold or, were it
			// ever chowned, chmod.
			r, w, err := os.Pipe()
			if err != nil {
				closeKept()
				return fail(err)
			}
			w.Close()
			owned = append(owned, r)
			stdio[0] = r
		}
	}

	tm.mark("setup")
	oomBefore, _ := drv.OOMKills(b)
	tm.mark("oom")
	spawned := time.Now()
	var child int
	var sealEnd func()
	if spec.Seal != 0 {
		child, sealEnd, err = s.execSealed(ctx, b, spec, stdio)
	} else {
		child, err = drv.Exec(ctx, b, spec, stdio)
	}
	tm.mark("spawn")
	if err != nil {
		closeKept()
		return fail(err)
	}
	p.pid = child
	exitCh := k.reaper.watch(child, spawned)

	var pumps sync.WaitGroup
	var truncated [2]atomic.Bool
	var written [2]atomic.Int64
	for i := range readers {
		if readers[i] == nil {
			outs[i].Close()
			continue
		}
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			defer readers[i].Close()
			defer outs[i].Close()
			n, trunc := pump(outs[i], readers[i], limit, b.takeOutput)
			written[i].Store(n)
			truncated[i].Store(trunc)
		}()
	}
	if len(spec.Stdin) > 0 {
		w := p.stdin
		if spec.TTY {
			w = p.tty
		}
		closeAfter := !spec.StdinOpen && !spec.TTY
		// Not waited for: a command that reads slowly must not hold up its
		// start. The write ends when the bytes are read or when the
		// command's end closes stdin (awaitExec) or the TTY (its pump).
		go func() {
			defer func() { <-p.stdinTurn }()
			_, _ = w.Write(spec.Stdin)
			if closeAfter {
				p.closeStdin()
			}
		}()
	}
	go k.awaitExec(req.Sandbox, spec, p, b, child, exitCh, sealEnd, oomBefore, started, &pumps, &truncated, &written)
	return nil
}

// awaitExec waits for a command's end (killing its group at the timeout),
// then records the exit once its output is drained.
func (k *Keeper) awaitExec(id string, spec ExecSpec, p *execProc, b *box, child int,
	exitCh <-chan syscall.WaitStatus, sealEnd func(), oomBefore int64, started time.Time,
	pumps *sync.WaitGroup, truncated *[2]atomic.Bool, written *[2]atomic.Int64) {
	var ws syscall.WaitStatus
	timedOut := false
	var timer <-chan time.Time
	if spec.Timeout > 0 {
		// Time the sandbox spends paused does not count.
		c, stop := b.activeTimer(spec.Timeout)
		defer stop()
		timer = c
	}
	select {
	case ws = <-exitCh:
	case <-timer:
		timedOut = true
		_ = syscall.Kill(-child, syscall.SIGKILL)
		_ = syscall.Kill(child, syscall.SIGKILL)
		ws = <-exitCh
	}
	ended := time.Now()
	if sealEnd != nil {
		// What the command left dies with its cgroup, then the sandbox
		// thaws; its output pipes close with them.
		sealEnd()
	}
	defer func() {
		k.log.Debug("exec end phases", "exec", spec.ID, "run_ms", ended.Sub(started).Seconds()*1000, "after_exit_ms", time.Since(ended).Seconds()*1000)
	}()
	p.closeStdin()
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainGrace):
	}
	rec := ExitRecord{ExitStatus: ExitStatus{Started: started, Ended: ended, TimedOut: timedOut, Sealed: sealEnd != nil}}
	switch {
	case ws.Exited():
		rec.Code = ws.ExitStatus()
	case ws.Signaled():
		rec.Signal = int(ws.Signal())
	}
	if timedOut {
		// The timeout killed the group, even when the command ended on
		// its own as the timer fired: one coherent status, no exit code.
		rec.Code, rec.Signal = 0, int(syscall.SIGKILL)
	}
	if rec.Signal == int(syscall.SIGKILL) && !timedOut {
		if after, err := k.driverOf(b).Stats(b); err == nil && int64(after.OOMKills) > oomBefore {
			rec.OOMKilled = true
			// Report it now: the sandbox may be gone before the OOM
			// watcher's next look.
			if prev := b.oomSeen.Swap(int64(after.OOMKills)); int64(after.OOMKills) > prev {
				k.events.add(id, EventOOM, fmt.Sprintf("exec %s killed for memory (limit %d MiB)", spec.ID, after.MemoryLimit>>20))
			}
		}
	}
	rec.StdoutTruncated, rec.StderrTruncated = truncated[0].Load(), truncated[1].Load()
	rec.StdoutBytes, rec.StderrBytes = written[0].Load(), written[1].Load()
	if err := k.l.writeExit(id, spec.ID, rec); err != nil {
		k.log.Warn("write exit record", "sandbox", id, "exec", spec.ID, "err", err)
	}
	p.mu.Lock()
	p.rec = rec
	p.mu.Unlock()
	close(p.done)
}

func (p *execProc) closeStdin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
}

// pump copies r to f until EOF, keeping at most limit bytes and what the
// sandbox's output budget allows (take returns how many of n bytes may be
// kept); past that the rest is read and dropped so the writer never
// blocks. A pty master ends with EIO when the last slave closes.
func pump(f *os.File, r io.Reader, limit int64, take func(n int64) int64) (written int64, truncated bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			keep := min(int64(n), max(limit-written, 0))
			if keep > 0 {
				keep = take(keep)
			}
			if keep < int64(n) {
				truncated = true
			}
			if keep > 0 {
				m, werr := f.Write(buf[:keep])
				written += int64(m)
				if werr != nil {
					truncated = true
				}
			}
		}
		if err != nil {
			return written, truncated
		}
	}
}

// execProcOf finds a running or finished exec of this keeper.
func (k *Keeper) execProcOf(id, execID string) (*execProc, error) {
	b, err := k.lookup(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	p := b.execs[execID]
	b.mu.Unlock()
	if p == nil {
		if _, err := os.Stat(k.l.ExecDir(id, execID)); err == nil {
			return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "exec %s in sandbox %s is not running", execID, id)
		}
		return nil, errdefs.Newf(errdefs.ErrNotFound, "exec %s not found in sandbox %s (list them with `dsec exec --list`)", execID, id)
	}
	return p, nil
}

func (p *execProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// writeStdin writes to an exec's stdin (a TTY's master) and optionally
// closes it (a TTY gets an end-of-file character instead). It writes after
// the exec's initial stdin and after the writes that came before it.
func (k *Keeper) writeStdin(ctx context.Context, id, execID string, data []byte, close bool) error {
	p, err := k.execProcOf(id, execID)
	if err != nil {
		return err
	}
	if !p.running() {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "exec %s has ended; its stdin is closed", execID)
	}
	deadline := time.Now().Add(stdinWriteTimeout)
	wait, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	select {
	case p.stdinTurn <- struct{}{}:
		defer func() { <-p.stdinTurn }()
	case <-p.done:
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "exec %s has ended; its stdin is closed", execID)
	case <-wait.Done():
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errdefs.Newf(errdefs.ErrDeadlineExceeded, "the command did not read its stdin for %v", stdinWriteTimeout)
	}
	if p.tty != nil {
		if close {
			data = append(data, 0x04) // ^D: end of file at the terminal
		}
		return writeWithDeadline(p.tty, data, deadline)
	}
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	if w == nil {
		if len(data) == 0 && close {
			return nil
		}
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "the stdin of exec %s is closed (start it with stdin_open to write to it later)", execID)
	}
	if err := writeWithDeadline(w, data, deadline); err != nil {
		return err
	}
	if close {
		p.closeStdin()
	}
	return nil
}

func writeWithDeadline(w *os.File, data []byte, deadline time.Time) error {
	if len(data) == 0 {
		return nil
	}
	_ = w.SetWriteDeadline(deadline)
	defer w.SetWriteDeadline(time.Time{})
	_, err := w.Write(data)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errdefs.Newf(errdefs.ErrDeadlineExceeded, "the command did not read its stdin for %v", stdinWriteTimeout)
	case errors.Is(err, syscall.EPIPE), errors.Is(err, os.ErrClosed):
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "the command closed its stdin")
	}
	return err
}

// signal sends sig to an exec's process group.
func (k *Keeper) signal(id, execID string, sig int) error {
	if sig <= 0 || sig > 64 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "signal %d: want 1-64", sig)
	}
	p, err := k.execProcOf(id, execID)
	if err != nil {
		return err
	}
	if !p.running() {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "exec %s has ended", execID)
	}
	if err := syscall.Kill(-p.pid, syscall.Signal(sig)); err != nil {
		if err := syscall.Kill(p.pid, syscall.Signal(sig)); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal exec %s: %w", execID, err)
		}
	}
	return nil
}

// resize sets a TTY exec's window size.
func (k *Keeper) resize(id, execID string, rows, cols uint16) error {
	p, err := k.execProcOf(id, execID)
	if err != nil {
		return err
	}
	if p.tty == nil {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "exec %s has no terminal", execID)
	}
	if !p.running() {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "exec %s has ended", execID)
	}
	return setWinsize(p.tty, rows, cols)
}

// listExecs reads a sandbox's command journal.
func (k *Keeper) listExecs(id string) ([]ExecInfo, error) {
	b, err := k.lookup(id)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(filepath.Join(k.l.SandboxDir(id), "execs"))
	if err != nil {
		return nil, err
	}
	out := make([]ExecInfo, 0, len(ents))
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join(k.l.ExecDir(id, e.Name()), "spec.json"))
		if err != nil {
			continue
		}
		var j journalEntry
		if json.Unmarshal(raw, &j) != nil {
			continue
		}
		info := ExecInfo{ID: j.ID, Argv: j.Argv, TTY: j.TTY, Started: j.Started, Session: j.Session, Sealed: j.Sealed, StepKey: j.StepKey}
		b.mu.Lock()
		p := b.execs[j.ID]
		b.mu.Unlock()
		rec, ok, _ := k.l.ReadExit(id, j.ID)
		switch {
		case ok:
			st := rec.ExitStatus
			info.Exit = &st
		case p != nil && p.running():
			info.Running = true
		default:
			info.Exit = &ExitStatus{Lost: true, Started: j.Started, SessionLost: j.Session != ""}
		}
		for i, s := range []Stream{Stdout, Stderr} {
			if st, err := os.Stat(k.l.OutputPath(id, j.ID, s)); err == nil {
				if i == 0 {
					info.StdoutBytes = st.Size()
				} else {
					info.StderrBytes = st.Size()
				}
			}
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out, nil
}

// waitExec waits up to timeout for an exec's end; ok is false on timeout.
// An exec whose end no keeper saw is reported lost.
func (k *Keeper) waitExec(ctx context.Context, id, execID string, timeout time.Duration) (ExitRecord, bool, error) {
	b, err := k.lookup(id)
	if err != nil {
		return ExitRecord{}, false, err
	}
	b.mu.Lock()
	p := b.execs[execID]
	b.mu.Unlock()
	if p == nil {
		rec, ok, err := k.l.ReadExit(id, execID)
		if err != nil {
			return rec, false, err
		}
		if !ok {
			if _, serr := os.Stat(k.l.ExecDir(id, execID)); serr == nil {
				// A session's shell ended with the keeper that ran it.
				var j journalEntry
				raw, _ := os.ReadFile(filepath.Join(k.l.ExecDir(id, execID), "spec.json"))
				lostSession := json.Unmarshal(raw, &j) == nil && j.Session != ""
				return ExitRecord{ExitStatus: ExitStatus{Lost: true, SessionLost: lostSession}}, true, nil
			}
			return rec, false, errdefs.Newf(errdefs.ErrNotFound, "exec %s not found in sandbox %s", execID, id)
		}
		return rec, true, nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.rec, true, nil
	case <-t.C:
		return ExitRecord{}, false, nil
	case <-ctx.Done():
		return ExitRecord{}, false, ctx.Err()
	}
}

// openPTY opens a new terminal in the sandbox's own devpts instance (so
// that the command's tty name exists in its view), owned by uid:gid (host
// ids of the exec's user and the sandbox's tty group), with the given size.
func openPTY(initPid int, uid, gid uint32, rows, cols uint16) (master, slave *os.File, err error) {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", initPid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "open the sandbox's root for a terminal: %v", err)
	}
	defer unix.Close(root)
	how := &unix.OpenHow{
		Flags:   unix.O_RDWR | unix.O_NOCTTY | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_SYMLINKS,
	}
	mfd, err := unix.Openat2(root, "dev/pts/ptmx", how)
	if err != nil {
		return nil, nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "the sandbox has no usable /dev/pts/ptmx for a terminal: %v", err)
	}
	master = os.NewFile(uintptr(mfd), "ptmx")
	defer func() {
		if err != nil {
			master.Close()
		}
	}()
	var st unix.Stat_t
	var sfs unix.Statfs_t
	if err := unix.Fstat(mfd, &st); err != nil {
		return nil, nil, err
	}
	if err := unix.Fstatfs(mfd, &sfs); err != nil {
		return nil, nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 5 || unix.Minor(st.Rdev) != 2 || sfs.Type != unix.DEVPTS_SUPER_MAGIC {
		return nil, nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "the sandbox's /dev/pts/ptmx is not a terminal multiplexer")
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		return nil, nil, fmt.Errorf("unlock terminal: %w", err)
	}
	// TIOCGPTPEER takes the peer's open flags as its argument.
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		return nil, nil, fmt.Errorf("open terminal peer: %w", errno)
	}
	sfd := int(r)
	slave = os.NewFile(uintptr(sfd), "pts")
	if err := unix.Fchown(sfd, int(uid), int(gid)); err != nil {
		slave.Close()
		return nil, nil, fmt.Errorf("own terminal: %w", err)
	}
	_ = unix.Fchmod(sfd, 0o620)
	if rows == 0 || cols == 0 {
		rows, cols = 24, 80
	}
	if err := setWinsize(master, rows, cols); err != nil {
		slave.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

func setWinsize(f *os.File, rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "terminal size %dx%d: rows and cols must be positive", rows, cols)
	}
	// Through SyscallConn: Fd() would switch the master to blocking mode.
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	if ierr != nil {
		return fmt.Errorf("resize terminal: %w", ierr)
	}
	return nil
}
