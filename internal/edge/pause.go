package edge

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// Pause and resume (issue 15). A pause stops a running sandbox's
// processes and has its backend (sandbox.Pauser) give its memory back to
// the node; its state stays. It is recorded in three steps, each a
// transition of the one table (state.go): running → pausing before the
// backend is asked, pausing → paused once it answered (with where the
// memory is), or back to running when the backend failed and made the
// sandbox run again. A resume is admitted first (the memory the sandbox
// takes back into RAM: ResourceExhausted with a retry hint when the node
// cannot hold it, and the sandbox stays paused), then paused → resuming,
// the backend's Resume, resuming → running (or failed, with the reason).
// A restart in the middle of either leaves pausing or resuming, which the
// reconcile tick settles from what the backend says (reconcile.go).
//
// Paused time counts against neither the hard nor the idle TTL: the hard
// TTL clock stops while paused (moveClock) and a resume counts as use.
// The paused TTL (PausedTTL, from PausedAt) deletes a sandbox paused for
// too long (ttl_expired). Any operation that needs the sandbox running
// resumes it first (ready); Get, List, Stats, Watch, ListExecs,
// ListSessions, GetNetwork, SetTimeout and UpdateLabels do not.
//
// Each sandbox's pause, resume and delete run one at a time (Edge.changes);
// its pause and resume are ordered with the starts of the operations that
// need it running (Edge.gates, gate.go).

// Idle actions: what an expired idle TTL does (Record.IdleAction).
const (
	IdleDelete = "delete"
	IdlePause  = "pause"
)

// checkIdleAction refuses an idle action other than IdleDelete and
// IdlePause; empty is unset.
func checkIdleAction(a string) error {
	switch a {
	case "", IdleDelete, IdlePause:
		return nil
	}
	return errdefs.Newf(errdefs.ErrInvalidArgument, "idle action %.40q: use %q or %q", a, IdleDelete, IdlePause)
}

// idleAction is r's idle action, IdleDelete when unset.
func idleAction(r *Record) string {
	if r.IdleAction == "" {
		return IdleDelete
	}
	return r.IdleAction
}

// pausedTTLOf is r's paused TTL, def when unset (a record older than
// format 2).
func pausedTTLOf(r *Record, def time.Duration) time.Duration {
	if r.PausedTTL > 0 {
		return r.PausedTTL
	}
	return def
}

// pausedExpiry is when r's paused TTL ends it, if it is paused.
func pausedExpiry(r *Record, def time.Duration) time.Time {
	return r.PausedAt.Add(pausedTTLOf(r, def))
}

// hardExpiry is when r's hard TTL ends it: ExpiresAt, moved on by the
// time its clock has been stopped (paused) until now.
func hardExpiry(r *Record, now time.Time) time.Time {
	if r.TTLStopped.IsZero() || !states[r.State].visible {
		return r.ExpiresAt
	}
	return r.ExpiresAt.Add(now.Sub(r.TTLStopped))
}

const (
	// maxPausesAtOnce bounds the pauses and resumes the node's backends
	// run at once (Edge.pauseSlots): each moves a sandbox's memory out of
	// or into RAM, and a flood of them (a job of thousands, or a hostile
	// caller) would have the node do little else.
	maxPausesAtOnce = 8
	// readyTries is how often an operation resumes a sandbox that is
	// paused again before it could start, before it gives up.
	readyTries = 3
)

// pauseTimeout bounds a backend's pause or resume. Either goes on when
// its caller goes away, so that the record is never left half-way by a
// client. (A variable for tests.)
var pauseTimeout = 2 * time.Minute

// PauseResult is the outcome of a pause or resume of one sandbox.
type PauseResult struct {
	ID string
	// State is the sandbox's state after it (paused, or running).
	State State
	// Resident and Swapped are where its memory was when the call
	// returned (Record.Resident, Record.Swapped).
	Resident, Swapped int64
	// Took is how long the pause or resume took; zero when the sandbox
	// was already so.
	Took time.Duration
	Err  error
}

func resultOf(r *Record, took time.Duration) PauseResult {
	return PauseResult{ID: r.ID, State: r.State, Resident: r.Resident, Swapped: r.Swapped, Took: took}
}

// Pause pauses sandbox id, or every sandbox caller sees that sel matches
// (a job), and returns one result per sandbox in ID order. By ID, a
// sandbox the caller may not see is NotFound and a failure is the call's
// error; by selector, what fails for one sandbox is in its result.
// Pausing a paused sandbox reports it as it is.
func (e *Edge) Pause(ctx context.Context, caller Caller, id string, sel map[string]string) ([]PauseResult, error) {
	return e.each(ctx, caller, "pause", id, sel, e.pauseOne)
}

// Resume makes sandbox id, or every sandbox caller sees that sel matches,
// run again, as Pause does. Resuming a running sandbox reports it as it
// is.
func (e *Edge) Resume(ctx context.Context, caller Caller, id string, sel map[string]string) ([]PauseResult, error) {
	return e.each(ctx, caller, "resume", id, sel, e.resumeOne)
}

// each runs one on sandbox id, or on every sandbox caller sees that sel
// matches, 8 at a time.
func (e *Edge) each(ctx context.Context, caller Caller, what, id string, sel map[string]string,
	one func(context.Context, string) (PauseResult, error),
) ([]PauseResult, error) {
	switch {
	case id != "" && len(sel) > 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s takes a sandbox id or a selector, not both", what)
	case id != "":
		if _, err := e.lookup(caller, id); err != nil {
			return nil, err
		}
		res, err := one(ctx, id)
		if err != nil {
			return nil, err
		}
		return []PauseResult{res}, nil
	case len(sel) == 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s needs a sandbox id or a label selector", what)
	}
	recs, err := e.visible(caller, sel)
	if err != nil {
		return nil, err
	}
	out := make([]PauseResult, len(recs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, r := range recs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			res, err := one(ctx, r.ID)
			if err != nil {
				res = PauseResult{ID: r.ID, Err: err}
			}
			out[i] = res
		}()
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// pauser is r's backend's pause capability, or the refusal naming what to
// do.
func (e *Edge) pauser(r *Record) (sandbox.Pauser, error) {
	be, err := e.backend(r.Backend)
	if err != nil {
		return nil, err
	}
	p, ok := be.(sandbox.Pauser)
	if !ok {
		return nil, sandbox.Lacks(r.Backend, sandbox.CapPause)
	}
	return p, nil
}

// slot takes one of the node's pause and resume slots; the returned func
// gives it back.
func (e *Edge) slot(ctx context.Context) (func(), error) {
	select {
	case e.pauseSlots <- struct{}{}:
		return func() { <-e.pauseSlots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// notNow is why a sandbox in r's state cannot be verb ("paused",
// "resumed") now: FailedPrecondition, with a retry hint while an
// operation moves it on.
func notNow(r *Record, verb string) error {
	info := states[r.State]
	switch {
	case !info.visible:
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", r.ID)
	case info.settling != "":
		return errdefs.RetryAfter(errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s %s", r.ID, info.settling), time.Second)
	case r.Reason != "":
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s (%s): only a running sandbox can be %s; create a new one", r.ID, r.State, r.Reason, verb)
	}
	return errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s: only a running sandbox can be %s; create a new one", r.ID, r.State, verb)
}

// publicReason is err as a record's reason, which users see: its public
// message, or for an internal error a pointer to the node's log.
func (e *Edge) publicReason(id, what string, err error) string {
	if msg, ok := apierr.Public(err); ok {
		return msg
	}
	e.log.Error(what, "sandbox", id, "err", err)
	return "internal error: the node's log has the details"
}

// backendContext is the context of a backend's pause or resume: it goes
// on when ctx's caller goes away, for pauseTimeout at most.
func backendContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
}

// pauseOne pauses sandbox id (pause.go's comment says how).
func (e *Edge) pauseOne(ctx context.Context, id string) (PauseResult, error) {
	unlock, err := e.lockChange(ctx, id)
	if err != nil {
		return PauseResult{}, err
	}
	defer unlock()
	r, err := e.store.get(id)
	if err != nil {
		return PauseResult{}, err
	}
	if r.State == StatePaused {
		return resultOf(r, 0), nil
	}
	if !allowed(r.State, StatePausing) {
		return PauseResult{}, notNow(r, "paused")
	}
	p, err := e.pauser(r)
	if err != nil {
		return PauseResult{}, err
	}
	done, err := e.slot(ctx)
	if err != nil {
		return PauseResult{}, err
	}
	defer done()
	start := time.Now()
	if _, err := e.transition(id, StateRunning, StatePausing, "", nil); err != nil {
		return PauseResult{}, err
	}
	crashPoint("pause:marked")
	bctx, cancel := backendContext(ctx)
	defer cancel()
	info, err := p.Pause(bctx, id)
	crashPoint("pause:stopped")
	if err != nil {
		return PauseResult{}, e.undoPause(ctx, p, id, err)
	}
	r, err = e.transition(id, StatePausing, StatePaused, "", func(r *Record) {
		r.PausedAt = time.Now().UTC()
		r.Resident, r.Swapped = info.Resident, info.Swapped
	})
	if err != nil {
		return PauseResult{}, err
	}
	crashPoint("pause:paused")
	took := time.Since(start)
	if m := e.cfg.Metrics; m != nil {
		m.PauseSeconds.WithLabelValues(r.Backend).Observe(took.Seconds())
	}
	return resultOf(r, took), nil
}

// undoPause makes a sandbox whose pause failed run again (its backend may
// have stopped part of it) and records it running; if that fails too, the
// sandbox cannot be trusted to run and is recorded failed. It returns the
// pause's error. The undo has a backend context of its own: a pause that
// failed by running out of its time leaves the undo all of its.
func (e *Edge) undoPause(ctx context.Context, p sandbox.Pauser, id string, cause error) error {
	bctx, cancel := backendContext(ctx)
	defer cancel()
	if _, err := p.Resume(bctx, id); err != nil {
		reason := "its pause failed and it could not be made to run again: " + e.publicReason(id, "undo a failed pause", err)
		if _, terr := e.transition(id, StatePausing, StateFailed, reason, nil); terr != nil {
			e.log.Warn("record a failed pause", "sandbox", id, "err", terr)
		}
		return fmt.Errorf("pause sandbox %s (it is failed now: %s): %w", id, reason, cause)
	}
	if _, err := e.transition(id, StatePausing, StateRunning, "", nil); err != nil {
		e.log.Warn("record an undone pause", "sandbox", id, "err", err)
	}
	return fmt.Errorf("pause sandbox %s (it runs on): %w", id, cause)
}

// resumeOne resumes sandbox id (pause.go's comment says how).
func (e *Edge) resumeOne(ctx context.Context, id string) (PauseResult, error) {
	unlock, err := e.lockChange(ctx, id)
	if err != nil {
		return PauseResult{}, err
	}
	defer unlock()
	r, err := e.store.get(id)
	if err != nil {
		return PauseResult{}, err
	}
	if r.State == StateRunning {
		return resultOf(r, 0), nil
	}
	if !allowed(r.State, StateResuming) {
		return PauseResult{}, notNow(r, "resumed")
	}
	p, err := e.pauser(r)
	if err != nil {
		return PauseResult{}, err
	}
	done, err := e.slot(ctx)
	if err != nil {
		return PauseResult{}, err
	}
	defer done()
	start := time.Now()
	// What it takes back into RAM must fit, as a create's memory must.
	need := r.Resources.MemoryBytes - memHeld(r)
	release, err := e.admitResume(r.ID, need)
	if err != nil {
		return PauseResult{}, err
	}
	if _, err := e.move(id, StatePaused, StateResuming, "", nil, need); err != nil {
		release()
		return PauseResult{}, err
	}
	crashPoint("resume:marked")
	bctx, cancel := backendContext(ctx)
	defer cancel()
	info, err := p.Resume(bctx, id)
	crashPoint("resume:started")
	if err != nil {
		reason := "its resume failed: " + e.publicReason(id, "resume", err)
		if _, terr := e.transition(id, StateResuming, StateFailed, reason, nil); terr != nil {
			e.log.Warn("record a failed resume", "sandbox", id, "err", terr)
		}
		return PauseResult{}, fmt.Errorf("resume sandbox %s (it is failed now): %w", id, err)
	}
	r, err = e.transition(id, StateResuming, StateRunning, "", func(r *Record) {
		r.PausedAt = time.Time{}
		r.Resident, r.Swapped = info.Resident, info.Swapped
	})
	if err != nil {
		return PauseResult{}, err
	}
	crashPoint("resume:running")
	took := time.Since(start)
	if m := e.cfg.Metrics; m != nil {
		m.ResumeSeconds.WithLabelValues(r.Backend).Observe(took.Seconds())
	}
	return resultOf(r, took), nil
}

// lockChange takes sandbox id's change lock, then its gate's exclusive
// side, for a pause or resume; the returned func releases both.
func (e *Edge) lockChange(ctx context.Context, id string) (func(), error) {
	unchange, err := e.changes.lock(ctx, id)
	if err != nil {
		return nil, err
	}
	ungate, err := e.gates.lock(ctx, id)
	if err != nil {
		unchange()
		return nil, err
	}
	return func() { ungate(); unchange() }, nil
}

// tryLockChange is lockChange without waiting: false when anybody holds
// or awaits either.
func (e *Edge) tryLockChange(id string) (func(), bool) {
	unchange, ok := e.changes.tryLock(id)
	if !ok {
		return nil, false
	}
	ungate, ok := e.gates.tryLock(id)
	if !ok {
		unchange()
		return nil, false
	}
	return func() { ungate(); unchange() }, true
}

// ready returns the record of sandbox id, which caller must see, for an
// operation that needs the sandbox running. A paused sandbox is resumed
// first (operations that come together resume it once) and the caller
// sees only the latency; a resume that is refused (the node cannot hold
// the sandbox's memory again: ResourceExhausted with a retry hint) leaves
// it paused and is the operation's error. done ends the operation's
// start: until it is called, no pause stops the sandbox. A record in a
// state that is about to change is a FailedPrecondition with a retry hint;
// one in a state where nothing runs (exited, failed) is returned as it is,
// for the caller to refuse as it does.
func (e *Edge) ready(ctx context.Context, caller Caller, id string) (r *Record, done func(), err error) {
	for try := 1; ; try++ {
		unlock, err := e.gates.rlock(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		r, err := e.lookup(caller, id)
		if err != nil {
			unlock()
			return nil, nil, err
		}
		info := states[r.State]
		switch {
		case info.settling != "":
			unlock()
			return nil, nil, notNow(r, "used")
		case !info.resumes:
			return r, unlock, nil
		}
		unlock()
		if try > readyTries {
			return nil, nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrFailedPrecondition,
				"sandbox %s was paused again each time it was resumed for this request (%d times): retry, or stop pausing it", id, readyTries), time.Second)
		}
		if _, err := e.resumeOne(ctx, id); err != nil {
			return nil, nil, err
		}
	}
}

// readyBackend is ready with the record's backend.
func (e *Edge) readyBackend(ctx context.Context, caller Caller, id string) (sandbox.Backend, *Record, func(), error) {
	r, done, err := e.ready(ctx, caller, id)
	if err != nil {
		return nil, nil, nil, err
	}
	be, err := e.backend(r.Backend)
	if err != nil {
		done()
		return nil, nil, nil, err
	}
	return be, r, done, nil
}

// The API.

func (a *sandboxAPI) Pause(ctx context.Context, req *connect.Request[sandboxv1.PauseRequest]) (*connect.Response[sandboxv1.PauseResponse], error) {
	res, err := a.e.Pause(ctx, callerOf(req.Header()), req.Msg.GetId(), req.Msg.GetSelector())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.PauseResponse{Results: a.e.pauseResultsProto(ctx, "pause", res)}), nil
}

func (a *sandboxAPI) Resume(ctx context.Context, req *connect.Request[sandboxv1.ResumeRequest]) (*connect.Response[sandboxv1.ResumeResponse], error) {
	res, err := a.e.Resume(ctx, callerOf(req.Header()), req.Msg.GetId(), req.Msg.GetSelector())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.ResumeResponse{Results: a.e.pauseResultsProto(ctx, "resume", res)}), nil
}

// pauseResultsProto is res in the API's form. A sandbox that was already
// running has its memory in RAM as its backend measures it now.
func (e *Edge) pauseResultsProto(ctx context.Context, what string, res []PauseResult) []*sandboxv1.PauseResult {
	out := make([]*sandboxv1.PauseResult, len(res))
	for i, r := range res {
		pr := &sandboxv1.PauseResult{Id: r.ID}
		if r.Err != nil {
			pr.Error = e.itemError(what, r.ID, r.Err)
			out[i] = pr
			continue
		}
		if r.State == StateRunning && r.Took == 0 {
			r.Resident, r.Swapped = e.memoryNow(ctx, r.ID)
		}
		pr.State, pr.ResidentBytes, pr.SwappedBytes = stateProto[r.State], r.Resident, r.Swapped
		pr.Took = durationpb.New(r.Took)
		out[i] = pr
	}
	return out
}

// memoryNow is a running sandbox's memory in RAM, as its backend measures
// it (zero when it cannot say), and none swapped (the backend's stats do
// not say).
func (e *Edge) memoryNow(ctx context.Context, id string) (resident, swapped int64) {
	r, err := e.store.get(id)
	if err != nil {
		return 0, 0
	}
	be, err := e.backend(r.Backend)
	if err != nil {
		return 0, 0
	}
	st, err := be.Stats(ctx, id)
	if err != nil {
		return 0, 0
	}
	return st.MemoryBytes, 0
}
