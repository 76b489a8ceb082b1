package keeper

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Pause and resume (protocol 6; docs/pause.md).
//
// A pause records the sandbox paused (the driver's record: for containers
// a mark of its cgroup, in the kernel), then has the driver
// stop its processes (the container driver freezes its cgroup), and
// replies: that is the pause's latency. The memory then moves out of RAM
// in the background (memMove), a few sandboxes at a time, until it is out
// or a resume or delete stops it. A resume stops that move, has the
// driver start reading back what was resident at the pause, lets the
// processes run, records the sandbox running and replies; the reads go on
// in the background.
//
// Crash safety: a pause is recorded before the freeze and a resume after
// the thaw, so a keeper that dies between the two leaves a record that
// says paused: its successor freezes the sandbox again (it never thaws a
// sandbox recorded paused) and moves its memory out again; the caller,
// whose call failed, retries it, which is a no-op or does the rest.
//
// Time paused does not count against an exec's timeout (activeTimer).

// pauser is a driver that pauses sandboxes (container_pause_linux.go).
// Every method but memory and moveOut/moveBack is called with the
// sandbox's op lock held.
type pauser interface {
	// pauseBusy fails while b cannot be paused now (a sealed exec or a
	// pack runs in it).
	pauseBusy(b *box) error
	// freeze stops every process of b and returns once all are stopped;
	// it forgets what an earlier pause recorded of b's memory.
	freeze(ctx context.Context, b *box) error
	// thaw lets them run again.
	thaw(ctx context.Context, b *box) error
	// moveOut moves b's memory out of RAM until it is out or ctx ends,
	// and returns a warning when memory stayed in RAM for want of swap.
	moveOut(ctx context.Context, b *box) (warning string, err error)
	// moveBack reads back what was resident when b was paused.
	moveBack(ctx context.Context, b *box) error
	// allowSwap lets b's memory go to swap, or keeps it from swapping.
	allowSwap(b *box, allow bool) error
	// memory reports where b's memory is (Resident, Swapped, Locked).
	memory(b *box) (PauseInfo, error)
	// setPaused records b paused, or running, where a restarted keeper
	// finds it; recordedPaused reads that record of the sandbox of info.
	setPaused(b *box, paused bool) error
	recordedPaused(info SandboxInfo) bool
}

// memMove is one background move of a sandbox's memory.
type memMove struct {
	out    bool // out of RAM (after a pause), else back (after a resume)
	cancel context.CancelFunc
	done   chan struct{} // closed once it has ended
}

// moveSlots bounds the moves out of RAM that run at once: each writes to
// the same swap device, and one at a time finishes the first-paused first.
const moveSlots = 2

// freezeTimeout bounds a pause's freeze: a process stuck in the kernel (a
// read of a lazy layer that hangs) keeps a group from freezing.
const freezeTimeout = 10 * time.Second

// pauserOf returns b's driver as a pauser, or the refusal of one that
// cannot pause.
func (k *Keeper) pauserOf(b *box) (pauser, error) {
	d := k.driverOf(b)
	p, ok := d.(pauser)
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s runs on the %s driver, which cannot pause sandboxes", b.snapshot().ID, d.Name())
	}
	return p, nil
}

// pause pauses sandbox id (POST /v1/sandbox/pause); with wait it returns
// once the memory has moved out. Without, the move out begins when the
// caller calls start (non-nil), once it has sent the reply: on a node
// with few cores the move's first reads would otherwise delay it.
func (k *Keeper) pause(ctx context.Context, id string, wait bool) (info PauseInfo, start func(), err error) {
	if err := validID(id); err != nil {
		return PauseInfo{}, nil, err
	}
	b, err := k.lookup(id)
	if err != nil {
		return PauseInfo{}, nil, err
	}
	p, err := k.pauserOf(b)
	if err != nil {
		return PauseInfo{}, nil, err
	}
	b.op.Lock()
	did := !b.snapshot().Paused
	t0 := time.Now()
	start, err = k.pauseLocked(b, p)
	stopped := time.Since(t0)
	b.op.Unlock()
	if err != nil {
		return PauseInfo{}, nil, err
	}
	if wait {
		start()
		if err := k.waitMove(ctx, b); err != nil {
			return PauseInfo{}, nil, err
		}
		start = nil
	}
	info, err = k.pauseInfo(b, p)
	if err != nil && start != nil {
		start()
		start = nil
	}
	if did {
		info.Stopped = stopped
	}
	return info, start, err
}

// pauseLocked pauses b, whose op lock is held, and returns what starts
// the move of its memory out (the caller calls it once). A paused sandbox
// is left as it is (start does nothing).
func (k *Keeper) pauseLocked(b *box, p pauser) (start func(), err error) {
	nothing := func() {}
	b.mu.Lock()
	info, deleting := b.info, b.deleting
	b.mu.Unlock()
	switch {
	case deleting:
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", info.ID)
	case info.State != StateRunning:
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s (%s): only a running sandbox can be paused", info.ID, info.State, info.Reason)
	case info.Paused:
		return nothing, nil
	}
	if err := p.pauseBusy(b); err != nil {
		return nil, err
	}
	tm := newPhases("pause")
	defer func() { k.log.Debug("pause phases", "sandbox", info.ID, "ms", tm.String()) }()
	k.stopMove(b) // the read-back of the last resume
	if err := k.recordPaused(b, p, true); err != nil {
		return nil, err
	}
	tm.mark("record")
	// The pause completes even if the caller goes away: a retry finds it
	// paused.
	fctx, cancel := context.WithTimeout(context.Background(), freezeTimeout)
	defer cancel()
	if err := p.freeze(fctx, b); err != nil {
		if terr := p.thaw(context.Background(), b); terr != nil {
			k.log.Warn("thaw a sandbox whose pause failed", "sandbox", info.ID, "err", terr)
		}
		if rerr := k.recordPaused(b, p, false); rerr != nil {
			k.log.Warn("record a failed pause", "sandbox", info.ID, "err", rerr)
		}
		if errdefs.Is(err, errdefs.ErrDeadlineExceeded) || fctx.Err() != nil {
			return nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrUnavailable,
				"sandbox %s did not stop within %v (a process of it is stuck in the kernel): it runs on; try again", info.ID, freezeTimeout), time.Second)
		}
		return nil, fmt.Errorf("pause sandbox %s: %w", info.ID, err)
	}
	tm.mark("freeze")
	b.mu.Lock()
	b.pausedSince = time.Now()
	b.moveWarning = ""
	b.mu.Unlock()
	return k.prepareMove(b, p, true), nil
}

// resume resumes sandbox id (POST /v1/sandbox/resume); with wait it
// returns once the read-back of its memory has been issued.
func (k *Keeper) resume(ctx context.Context, id string, wait bool) (PauseInfo, error) {
	if err := validID(id); err != nil {
		return PauseInfo{}, err
	}
	b, err := k.lookup(id)
	if err != nil {
		return PauseInfo{}, err
	}
	p, err := k.pauserOf(b)
	if err != nil {
		return PauseInfo{}, err
	}
	b.op.Lock()
	err = k.resumeLocked(b, p)
	b.op.Unlock()
	if err != nil {
		return PauseInfo{}, err
	}
	if wait {
		if err := k.waitMove(ctx, b); err != nil {
			return PauseInfo{}, err
		}
	}
	return k.pauseInfo(b, p)
}

// resumeLocked resumes b, whose op lock is held. A running sandbox is left
// as it is.
func (k *Keeper) resumeLocked(b *box, p pauser) error {
	b.mu.Lock()
	info, deleting := b.info, b.deleting
	b.mu.Unlock()
	switch {
	case deleting:
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", info.ID)
	case !info.Paused:
		return nil
	}
	tm := newPhases("resume")
	defer func() { k.log.Debug("resume phases", "sandbox", info.ID, "ms", tm.String()) }()
	k.stopMove(b) // the move out, if it has not ended
	tm.mark("stop")
	if err := p.allowSwap(b, false); err != nil {
		k.log.Warn("keep a resumed sandbox from swapping", "sandbox", info.ID, "err", err)
	}
	// The reads start before the thaw, and go on beside the sandbox.
	k.prepareMove(b, p, false)()
	tm.mark("readback")
	tctx, cancel := context.WithTimeout(context.Background(), freezeTimeout)
	defer cancel()
	if err := p.thaw(tctx, b); err != nil {
		k.stopMove(b)
		if aerr := p.allowSwap(b, true); aerr != nil {
			k.log.Warn("let a paused sandbox swap again", "sandbox", info.ID, "err", aerr)
		}
		return fmt.Errorf("resume sandbox %s: %w", info.ID, err)
	}
	tm.mark("thaw")
	b.mu.Lock()
	if !b.pausedSince.IsZero() {
		b.pausedTotal += time.Since(b.pausedSince)
	}
	b.pausedSince = time.Time{}
	b.moveWarning = ""
	b.mu.Unlock()
	if err := k.recordPaused(b, p, false); err != nil {
		// It runs; a restarted keeper would freeze it again (the record
		// says paused) until the next resume: said, not hidden.
		return fmt.Errorf("resume sandbox %s: it runs, but recording that failed: %w", info.ID, err)
	}
	tm.mark("record")
	return nil
}

// pauseState reports sandbox id's pause state (GET /v1/sandbox/pause).
func (k *Keeper) pauseState(id string) (PauseInfo, error) {
	if err := validID(id); err != nil {
		return PauseInfo{}, err
	}
	b, err := k.lookup(id)
	if err != nil {
		return PauseInfo{}, err
	}
	p, err := k.pauserOf(b)
	if err != nil {
		return PauseInfo{}, err
	}
	return k.pauseInfo(b, p)
}

// pauseInfo is b's pause state and where its memory is now.
func (k *Keeper) pauseInfo(b *box, p pauser) (PauseInfo, error) {
	info, err := p.memory(b)
	if err != nil {
		return PauseInfo{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	info.Paused, info.Moving, info.Warning = b.info.Paused, b.mover != nil, b.moveWarning
	return info, nil
}

// recordPaused records b paused or running where a restarted keeper
// finds it (the driver's setPaused), and in b.
func (k *Keeper) recordPaused(b *box, p pauser, paused bool) error {
	if err := p.setPaused(b, paused); err != nil {
		return fmt.Errorf("record sandbox %s paused=%v: %w", b.snapshot().ID, paused, err)
	}
	b.mu.Lock()
	b.info.Paused = paused
	b.mu.Unlock()
	return nil
}

// prepareMove makes b's move of its memory, out of RAM (in one of
// moveSlots) or back, and returns what starts it in the background; the
// caller calls it once. The keeper waits for it at teardown.
func (k *Keeper) prepareMove(b *box, p pauser, out bool) (start func()) {
	ctx, cancel := context.WithCancel(context.Background())
	mv := &memMove{out: out, cancel: cancel, done: make(chan struct{})}
	b.mu.Lock()
	b.mover = mv
	id := b.info.ID
	b.mu.Unlock()
	k.moves.Add(1)
	return func() { go k.move(ctx, b, p, mv, id) }
}

// move is the background move mv of b's memory.
func (k *Keeper) move(ctx context.Context, b *box, p pauser, mv *memMove, id string) {
	defer k.moves.Done()
	defer close(mv.done)
	defer mv.cancel()
	t0 := time.Now()
	var warning string
	var err error
	if mv.out {
		select {
		case k.slots() <- struct{}{}:
			warning, err = p.moveOut(ctx, b)
			<-k.slots()
		case <-ctx.Done():
			err = ctx.Err()
		}
	} else {
		// At the lowest CPU priority: the read-back is what the sandbox
		// will need, its first commands are what it needs now. The
		// thread ends with this goroutine (it stays locked to it).
		runtime.LockOSThread()
		if perr := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19); perr != nil {
			k.log.Debug("lower the read-back's priority", "err", perr)
		}
		err = p.moveBack(ctx, b)
	}
	b.mu.Lock()
	if b.mover == mv {
		b.mover = nil
	}
	if mv.out && err == nil {
		b.moveWarning = warning
	}
	b.mu.Unlock()
	switch {
	case ctx.Err() != nil:
		k.log.Debug("memory move stopped", "sandbox", id, "out", mv.out, "ms", time.Since(t0).Milliseconds())
	case err != nil:
		k.log.Warn("move a sandbox's memory", "sandbox", id, "out", mv.out, "err", err)
	case warning != "":
		k.log.Warn("a paused sandbox's memory stays in RAM", "sandbox", id, "why", warning)
	default:
		k.log.Debug("memory moved", "sandbox", id, "out", mv.out, "ms", time.Since(t0).Milliseconds())
	}
}

// slots is the semaphore of moves out of RAM.
func (k *Keeper) slots() chan struct{} {
	k.moveSlotsOnce.Do(func() { k.moveSlots = make(chan struct{}, moveSlots) })
	return k.moveSlots
}

// stopMove stops b's move, if one runs, and waits for it to end.
func (k *Keeper) stopMove(b *box) {
	b.mu.Lock()
	mv := b.mover
	b.mu.Unlock()
	if mv == nil {
		return
	}
	mv.cancel()
	<-mv.done
}

// waitMove waits for b's move, if one runs, to end, or for ctx.
func (k *Keeper) waitMove(ctx context.Context, b *box) error {
	b.mu.Lock()
	mv := b.mover
	b.mu.Unlock()
	if mv == nil {
		return nil
	}
	select {
	case <-mv.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stopMoves stops every move (at teardown).
func (k *Keeper) stopMoves() {
	for _, b := range k.allBoxes() {
		b.mu.Lock()
		if b.mover != nil {
			b.mover.cancel()
		}
		b.mu.Unlock()
	}
	k.moves.Wait()
}

// pausedFor is how long b has been paused in all, until now.
func (b *box) pausedFor(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.pausedTotal
	if !b.pausedSince.IsZero() {
		d += now.Sub(b.pausedSince)
	}
	return d
}

// isPaused reports whether b is paused now.
func (b *box) isPaused() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.pausedSince.IsZero()
}

// activeTimer delivers once b has run, not paused, for d from now: an
// exec's timeout. stop releases it; the caller calls it once.
func (b *box) activeTimer(d time.Duration) (c <-chan time.Time, stop func()) {
	out := make(chan time.Time, 1)
	quit := make(chan struct{})
	start := time.Now()
	paused0 := b.pausedFor(start)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTimer(d)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				active := now.Sub(start) - (b.pausedFor(now) - paused0)
				if active >= d {
					out <- now
					return
				}
				wait := d - active
				if b.isPaused() {
					// The time left does not shrink while it is paused.
					wait = max(wait, 100*time.Millisecond)
				}
				t.Reset(wait)
			}
		}
	}()
	return out, func() {
		close(quit)
		wg.Wait()
	}
}

// pausedError refuses an operation that needs a sandbox's processes to
// run while it is paused.
func pausedError(id string) error {
	return errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is paused: resume it first", id)
}
