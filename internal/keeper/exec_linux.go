package keeper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"time"

	"github.com/dsecproject/dsec/internal/edge/sandbox"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/nsexec"
)

// execProc is one running or finished command.
type execProc struct {
	done chan struct{} // closed once rec is final and on disk
	rec  ExitRecord
}

var execIDRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

// drainGrace is how long output is awaited after a command exits; its
// background children may hold the pipes open much longer, and their later
// output is still appended.
const drainGrace = 200 * time.Millisecond

func (k *Keeper) startExec(ctx context.Context, req ExecRequest) error {
	spec := req.Spec
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
	case info.State != sandbox.StateRunning:
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s (%s): create a new one", req.Sandbox, info.State, info.Reason)
	case dup:
		return errdefs.Newf(errdefs.ErrAlreadyExists, "exec %s exists in sandbox %s", spec.ID, req.Sandbox)
	}
	dir := k.l.ExecDir(req.Sandbox, spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return errdefs.Newf(errdefs.ErrAlreadyExists, "exec %s exists in sandbox %s", spec.ID, req.Sandbox)
		}
		return fmt.Errorf("exec dir: %w", err)
	}
	limit := spec.OutputLimit
	if limit <= 0 {
		limit = k.cfg.OutputLimit
	}
	p := &execProc{done: make(chan struct{})}
	b.mu.Lock()
	b.execs[spec.ID] = p
	b.mu.Unlock()
	fail := func(err error) error {
		b.mu.Lock()
		delete(b.execs, spec.ID)
		b.mu.Unlock()
		os.RemoveAll(dir)
		return err
	}

	var files []*os.File // everything to close on return
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	outs := make([]*os.File, 2)
	readers := make([]*os.File, 2)
	childEnds := make([]*os.File, 3)
	for i, s := range []sandbox.Stream{sandbox.Stdout, sandbox.Stderr} {
		f, err := os.OpenFile(k.l.OutputPath(req.Sandbox, spec.ID, s), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return fail(fmt.Errorf("exec output: %w", err))
		}
		r, w, err := os.Pipe()
		if err != nil {
			f.Close()
			return fail(fmt.Errorf("exec pipe: %w", err))
		}
		outs[i], readers[i], childEnds[i+1] = f, r, w
		files = append(files, w)
	}
	var stdinW *os.File
	if len(spec.Stdin) > 0 {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		childEnds[0], stdinW = r, w
		files = append(files, r)
	} else {
		devnull, err := os.Open(os.DevNull)
		if err != nil {
			return fail(err)
		}
		childEnds[0] = devnull
		files = append(files, devnull)
	}
	closeOwn := func() {
		for _, f := range append(outs, readers...) {
			if f != nil {
				f.Close()
			}
		}
		if stdinW != nil {
			stdinW.Close()
		}
	}

	procs, err := k.procsFiles(req.Sandbox)
	if err != nil {
		closeOwn()
		return fail(err)
	}
	before, _ := k.cg.Stats(req.Sandbox)
	cfg := nsexec.ExecConfig{
		Pid:         info.Pid,
		CgroupProcs: procs,
		UID:         spec.UID,
		GID:         spec.GID,
		Groups:      spec.Groups,
		Cwd:         spec.Cwd,
		Argv:        spec.Argv,
		Env:         spec.Env,
		KeepCaps:    nsexec.DefaultCaps,
		Setsid:      true,
	}
	if cfg.Cwd == "" {
		cfg.Cwd = "/"
	}
	started := time.Now()
	helper, child, err := nsexec.Spawn(k.cfg.Self, cfg, [3]*os.File{childEnds[0], childEnds[1], childEnds[2]})
	if helper > 0 {
		k.reaper.watch(helper) // its exit is reaped and dropped
	}
	if err != nil {
		closeOwn()
		return fail(err)
	}
	exitCh := k.reaper.watch(child)

	var pumps sync.WaitGroup
	var truncated [2]bool
	var written [2]int64
	for i := range outs {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			defer readers[i].Close()
			defer outs[i].Close()
			written[i], truncated[i] = pump(outs[i], readers[i], limit)
		}()
	}
	if stdinW != nil {
		go func() {
			defer stdinW.Close()
			_, _ = stdinW.Write(spec.Stdin)
		}()
	}
	go func() {
		var ws syscall.WaitStatus
		timedOut := false
		var timer <-chan time.Time
		if spec.Timeout > 0 {
			t := time.NewTimer(spec.Timeout)
			defer t.Stop()
			timer = t.C
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
		drained := make(chan struct{})
		go func() { pumps.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(drainGrace):
		}
		rec := ExitRecord{ExitStatus: sandbox.ExitStatus{Started: started, Ended: ended, TimedOut: timedOut}}
		switch {
		case ws.Exited():
			rec.Code = ws.ExitStatus()
		case ws.Signaled():
			rec.Signal = int(ws.Signal())
		}
		if rec.Signal == int(syscall.SIGKILL) && !timedOut {
			if after, err := k.cg.Stats(req.Sandbox); err == nil && after.OOMKills > before.OOMKills {
				rec.OOMKilled = true
			}
		}
		select {
		case <-drained:
			rec.StdoutTruncated, rec.StderrTruncated = truncated[0], truncated[1]
			rec.StdoutBytes, rec.StderrBytes = written[0], written[1]
		default:
			// Output still flows from background processes; sizes are
			// whatever the files hold when read.
		}
		if err := k.l.writeExit(req.Sandbox, spec.ID, rec); err != nil {
			k.log.Warn("write exit record", "sandbox", req.Sandbox, "exec", spec.ID, "err", err)
		}
		p.rec = rec
		close(p.done)
	}()
	return nil
}

// pump copies r to f until EOF, keeping at most limit bytes; past the
// limit the rest is read and dropped so the writer never blocks.
func pump(f *os.File, r io.Reader, limit int64) (written int64, truncated bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			keep := int64(n)
			if written+keep > limit {
				keep = max(limit-written, 0)
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

// waitExec waits up to timeout for an exec's end; ok is false on timeout.
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
				// Started by an earlier keeper; its end was never seen.
				return ExitRecord{}, false, errdefs.Newf(errdefs.ErrFailedPrecondition, "exec %s in sandbox %s was started by an earlier keeper and its end is unknown", execID, id)
			}
			return rec, false, errdefs.Newf(errdefs.ErrNotFound, "exec %s not found in sandbox %s", execID, id)
		}
		return rec, true, nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.rec, true, nil
	case <-t.C:
		return ExitRecord{}, false, nil
	case <-ctx.Done():
		return ExitRecord{}, false, ctx.Err()
	}
}

// procsFiles lists the cgroup.procs files an exec joins: the groups the
// cgroup manager made, and those the runtime added for the same path in the
// other v1 hierarchies (devices, blkio, name=systemd), so that a command
// sits in exactly the init's groups.
func (k *Keeper) procsFiles(id string) ([]string, error) {
	files, err := k.cg.ProcsFiles(id)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, f := range files {
		if real, err := filepath.EvalSymlinks(f); err == nil {
			seen[real] = true
		}
		seen[f] = true
	}
	more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", k.cfg.CgroupParent, id, "cgroup.procs"))
	for _, f := range more {
		real, err := filepath.EvalSymlinks(f)
		if err != nil || seen[real] || seen[f] {
			continue
		}
		seen[real] = true
		files = append(files, f)
	}
	return files, nil
}
