package edge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// An operation in flight on a sandbox. The reconcile tick leaves sandboxes
// with one alone; a delete of a sandbox being created waits for its
// create.
type op string

const (
	opCreate op = "create"
	opDelete op = "delete"
)

// defaultReconcileEvery is Config.ReconcileEvery's default.
const defaultReconcileEvery = 5 * time.Second

// busy marks an operation in flight on sandbox id (whose record does not
// exist yet or is the caller's) and returns the func that ends it.
func (e *Edge) busy(id string, o op) func() {
	e.mu.Lock()
	e.ops[id] = o
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		delete(e.ops, id)
		e.mu.Unlock()
	}
}

// claim marks an operation in flight on sandbox id unless one is: a
// sandbox being created is FailedPrecondition (retry once it runs), one
// being deleted NotFound.
func (e *Edge) claim(id string, o op) (func(), error) {
	e.mu.Lock()
	cur, ok := e.ops[id]
	e.mu.Unlock()
	switch {
	case ok && cur == opCreate:
		return nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is still being created: retry once it runs", id), time.Second)
	case ok:
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", id)
	}
	return e.busy(id, o), nil
}

// claimed reports whether an operation is in flight on sandbox id.
func (e *Edge) claimed(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.ops[id]
	return ok
}

// recover is the reconcile at start: it counts what every record holds
// (each holds its admission until it is deleted) and then runs the tick
// once, before the edge serves.
func (e *Edge) recover(ctx context.Context) error {
	recs, err := e.store.list()
	if err != nil {
		return err
	}
	now := time.Now()
	for _, r := range recs {
		e.hold(r)
		e.mu.Lock()
		e.activity[r.ID] = now
		e.mu.Unlock()
	}
	// A grading sandbox lives only as long as its GradeFrom call, which
	// ended with the edge that made it.
	for _, r := range recs {
		if r.Grader && r.State != StateDeleting {
			e.log.Info("deleting the sandbox of a grade the restart ended", "sandbox", r.ID)
			if err := e.deleteOne(ctx, r.ID, EventDeleted, "its grade ended when the node restarted"); err != nil {
				e.log.Warn("delete grading sandbox", "sandbox", r.ID, "err", err)
			}
		}
	}
	err = e.reconcileOnce(ctx)
	e.repushNetworks(ctx)
	return err
}

// reconcileOnce makes the records and the backends agree, and drives every
// half-done state to its end: a creating record no create is making is an
// interrupted create (the edge restarted during it) and is deleted; a
// deleting record no delete is finishing is deleted again; a running
// record whose sandbox ended or is gone becomes exited or failed; a
// pausing or resuming record no pause or resume is moving on, and a
// paused one whose sandbox is not paused, are settled (settle); a sandbox
// without a record is removed. Sandboxes with an operation in flight are
// left to it.
func (e *Edge) reconcileOnce(ctx context.Context) error {
	var firstErr error
	for name, be := range e.cfg.Backends {
		// List before reading the records: a record is written before its
		// sandbox is made and removed after it is gone, so a sandbox
		// listed here without a record read after is an orphan.
		live, err := be.List(ctx)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("list %s sandboxes: %w", name, err)
			}
			continue
		}
		recs, err := e.store.list()
		if err != nil {
			return err
		}
		byID := map[string]*Record{}
		for _, r := range recs {
			byID[r.ID] = r
		}
		liveByID := map[string]sandbox.Status{}
		for _, s := range live {
			liveByID[s.ID] = s
			if r := byID[s.ID]; (r == nil || r.Backend != name) && !e.claimed(s.ID) {
				e.log.Info("removing sandbox without a record", "sandbox", s.ID, "backend", name)
				if err := be.Delete(ctx, s.ID); err != nil {
					e.log.Warn("remove orphaned sandbox", "sandbox", s.ID, "err", err)
				}
			}
		}
		for _, r := range recs {
			if r.Backend != name || e.claimed(r.ID) {
				continue
			}
			s, alive := liveByID[r.ID]
			switch r.State {
			case StateCreating:
				e.log.Info("finishing an interrupted create", "sandbox", r.ID)
				if _, err := e.transition(r.ID, StateCreating, StateDeleting, "interrupted: the node restarted while it was created", nil); err != nil {
					if !errors.Is(err, errTransition) {
						e.log.Warn("record interrupted create", "sandbox", r.ID, "err", err)
					}
					continue // or its create has just ended
				}
				e.retryDelete(ctx, be, r.ID)
			case StateDeleting:
				e.retryDelete(ctx, be, r.ID)
			case StateRunning:
				switch {
				case !alive:
					// Ask again: its create may have ended after the list.
					e.refresh(ctx, r)
				case s.State == sandbox.StateExited:
					e.ended(r, StateExited, s.Reason)
				}
			case StatePausing, StateResuming:
				e.settle(ctx, be, r.ID)
			case StatePaused:
				if !alive || s.State == sandbox.StateExited || !s.Paused {
					e.settle(ctx, be, r.ID)
				}
			}
		}
	}
	return firstErr
}

// retryDelete finishes the delete of a deleting record unless an
// operation is in flight on it; a failure is logged and retried at the
// next tick.
func (e *Edge) retryDelete(ctx context.Context, be sandbox.Backend, id string) {
	done, err := e.claim(id, opDelete)
	if err != nil {
		return
	}
	defer done()
	if err := e.finishDelete(ctx, be, id); err != nil {
		e.log.Warn("delete sandbox (retried at the next reconcile)", "sandbox", id, "err", err)
	}
}

// settle finishes or undoes what a restart (of the edge, or of the
// backend's processes) interrupted in a pause or resume of sandbox id,
// from what its backend says now, so that no sandbox is left half-frozen
// or recorded as other than it is:
//
//   - pausing, and the backend has it paused: the pause is finished (the
//     backend's Pause again, which reports a paused sandbox as it is, says
//     where its memory is), and it is paused;
//   - pausing, and it is not paused (the backend stopped it in part, or
//     not at all): the pause is undone (the backend's Resume thaws
//     whatever it had stopped) and it is running again; if that fails, it
//     is failed;
//   - resuming: the resume was admitted and recorded, so it is finished
//     (the backend's Resume again) and it is running, or failed with the
//     reason;
//   - paused, and the backend has it running: it is paused again (its
//     admission holds only what was resident);
//   - pausing, paused or resuming, and the backend lost it or its init
//     ended: failed.
//
// It takes the sandbox's change lock and gate, and leaves a sandbox whose
// are taken (a pause, resume or delete is in flight, or an operation
// starts) to that; a backend that cannot say is asked again at the next
// tick.
func (e *Edge) settle(ctx context.Context, be sandbox.Backend, id string) {
	unlock, ok := e.tryLockChange(id)
	if !ok {
		return
	}
	defer unlock()
	if e.claimed(id) {
		return
	}
	r, err := e.store.get(id)
	if err != nil {
		return
	}
	switch r.State {
	case StatePausing, StatePaused, StateResuming:
	default:
		return // moved on since the tick read it
	}
	st, err := be.Status(ctx, id)
	gone := errdefs.Is(err, errdefs.ErrNotFound)
	if err != nil && !gone {
		e.log.Warn("status of a sandbox to settle (asked again at the next reconcile)", "sandbox", id, "state", r.State, "err", err)
		return
	}
	if gone || st.State == sandbox.StateExited {
		reason := reasonLost
		if !gone {
			reason = "its init ended while it was " + string(r.State)
			if st.Reason != "" {
				reason += ": " + st.Reason
			}
		}
		e.log.Info("settling a sandbox that ended", "sandbox", id, "state", r.State, "reason", reason)
		if _, err := e.transition(id, r.State, StateFailed, reason, nil); err != nil {
			e.log.Warn("record a sandbox that ended", "sandbox", id, "err", err)
		}
		return
	}
	p, ok := be.(sandbox.Pauser)
	if !ok {
		// A paused record on a backend that no longer pauses (dsec was
		// changed under it): nothing can move it but a delete.
		e.log.Warn("a paused sandbox's backend cannot pause or resume: delete it", "sandbox", id, "state", r.State, "backend", r.Backend)
		return
	}
	done, err := e.slot(ctx)
	if err != nil {
		return
	}
	defer done()
	bctx, cancel := backendContext(ctx)
	defer cancel()
	switch {
	case r.State == StatePausing && st.Paused, r.State == StatePaused && !st.Paused:
		e.log.Info("finishing a pause", "sandbox", id, "state", r.State)
		info, err := p.Pause(bctx, id)
		if err != nil {
			e.log.Warn("finish a pause (retried at the next reconcile)", "sandbox", id, "err", err)
			return
		}
		if r.State == StatePaused {
			return // its record stays as it was paused
		}
		if _, err := e.transition(id, StatePausing, StatePaused, "", func(r *Record) {
			r.PausedAt = time.Now().UTC()
			r.Resident, r.Swapped = info.Resident, info.Swapped
		}); err != nil {
			e.log.Warn("record a finished pause", "sandbox", id, "err", err)
		}
	case r.State == StatePausing:
		e.log.Info("undoing an interrupted pause", "sandbox", id)
		err := e.undoPause(ctx, p, id, errors.New("interrupted by a restart of the node"))
		e.log.Info("undid an interrupted pause", "sandbox", id, "result", err)
	case r.State == StateResuming:
		e.log.Info("finishing an interrupted resume", "sandbox", id)
		info, err := p.Resume(bctx, id)
		if err != nil {
			reason := "its resume failed: " + e.publicReason(id, "finish a resume", err)
			if _, terr := e.transition(id, StateResuming, StateFailed, reason, nil); terr != nil {
				e.log.Warn("record a failed resume", "sandbox", id, "err", terr)
			}
			return
		}
		if _, err := e.transition(id, StateResuming, StateRunning, "", func(r *Record) {
			r.PausedAt = time.Time{}
			r.Resident, r.Swapped = info.Resident, info.Swapped
		}); err != nil {
			e.log.Warn("record a finished resume", "sandbox", id, "err", err)
		}
	}
}
