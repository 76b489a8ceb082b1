package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// State is a sandbox's life-cycle state as the edge records it. Backends
// report only running and exited (and whether a sandbox is paused); the
// edge adds the rest.
type State string

// The states of a record (the strings are stored: never change them).
const (
	StateCreating State = "creating" // admitted and recorded; the backend makes it
	StateRunning  State = "running"
	// StatePausing: a pause is recorded before the backend stops the
	// sandbox, so that a restart finds it and finishes or undoes it
	// (reconcile.go).
	StatePausing State = "pausing"
	// StatePaused: its processes are stopped and its memory given back to
	// the node (pause.go).
	StatePaused State = "paused"
	// StateResuming: re-admitted, and recorded before the backend makes
	// the sandbox run again.
	StateResuming State = "resuming"
	StateExited   State = "exited" // its init ended
	StateFailed   State = "failed" // it cannot go on (lost, or a backend failure)
	StateDeleting State = "deleting"
	// StateDeleted is where a record ends: entering it removes the record.
	// It is never stored.
	StateDeleted State = "deleted"
)

// stateInfo is one row of the state table.
type stateInfo struct {
	// next are the states a record may go to from this one.
	next []State
	// ttl: the hard TTL clock runs in this state. Where it does not (a
	// paused sandbox), the time spent is added to ExpiresAt when the
	// record leaves the state.
	ttl bool
	// visible: the API shows records in this state (Get, List, Watch's
	// initial list); others are NotFound.
	visible bool
	// reapable: an expired hard or idle TTL deletes the sandbox (or, with
	// idle_action pause, an expired idle TTL pauses it).
	reapable bool
	// active: execs, file operations and packs run in this state.
	active bool
	// resumes: an operation that needs the sandbox running (exec, file
	// operations, attach, sessions, ports, network updates, packs and
	// grades) resumes it first, and the caller sees only the latency.
	resumes bool
	// pausedTTL: the sandbox's paused TTL, counted from PausedAt, deletes
	// it in this state.
	pausedTTL bool
	// reclaimed: its memory out of RAM is free for other sandboxes, so
	// admission holds only what stayed resident (Record.Resident); a
	// resume admits the rest again.
	reclaimed bool
	// settling, when set, says that an operation moves the record on at
	// once (a create, a pause, a resume; or the reconcile tick, after a
	// restart), as what a request that needs the sandbox running is told,
	// with a retry hint.
	settling string
}

// states is the one transition table of a sandbox. Every record holds its
// admission (memory, disk and output quota) in every state, from the
// create that admits it until it is deleted: what a sandbox was admitted
// is released only when the backend has removed everything it made
// (StateDeleted), so the node never admits more than it has, even while a
// delete is retried. A paused sandbox holds only the memory that stayed
// resident; its resume admits its limit again first (or is refused, and
// it stays paused).
//
//	from      to        when                                       event
//	(none)    creating  a create is admitted                       -
//	creating  running   the backend made it                        created
//	creating  deleting  the backend failed, or the edge restarted  failed
//	running   pausing   a pause, or an idle TTL with idle_action    -
//	                    pause
//	pausing   paused    the backend stopped it                     paused
//	pausing   running   the backend failed the pause and thawed    -
//	                    it, or a restart found it not paused
//	pausing   failed    neither the pause nor its undoing worked   failed
//	paused    resuming  a resume (or any request that needs it     -
//	                    running), re-admitted
//	resuming  running   the backend made it run again              resumed
//	resuming  failed    the backend failed the resume              failed
//	paused    failed    lost by the backend, or its init ended     failed
//	running   exited    its init ended                             exited
//	running   failed    lost by the backend, or a backend failure  failed
//	running   deleting  a delete, or an expired TTL                -
//	pausing,  deleting  a delete (of a record a restart left       -
//	resuming            mid-change)
//	paused    deleting  a delete, or an expired paused TTL         -
//	exited    deleting  a delete, or an expired TTL                -
//	failed    deleting  a delete, or an expired TTL                -
//	deleting  deleted   the backend removed everything             deleted, ttl_expired or none (EndEvent)
//
// A deleting record whose backend delete failed stays deleting and is
// retried by the reconcile tick until it succeeds. A pausing or resuming
// record that no pause or resume is moving on (the edge restarted during
// it) is finished or undone by the reconcile tick from what the backend
// says (Status.Paused): never left half-frozen (reconcile.go, settle).
var states = map[State]stateInfo{
	StateCreating: {next: []State{StateRunning, StateDeleting}, ttl: true, visible: true, settling: "is still being created: retry once it runs"},
	StateRunning:  {next: []State{StateExited, StateFailed, StateDeleting, StatePausing}, ttl: true, visible: true, reapable: true, active: true},
	StatePausing:  {next: []State{StatePaused, StateRunning, StateFailed, StateDeleting}, ttl: true, visible: true, settling: "is being paused: retry in a moment (the retry resumes it)"},
	StatePaused:   {next: []State{StateResuming, StateFailed, StateDeleting}, visible: true, resumes: true, pausedTTL: true, reclaimed: true},
	StateResuming: {next: []State{StateRunning, StateFailed, StateDeleting}, visible: true, settling: "is being resumed: retry in a moment"},
	StateExited:   {next: []State{StateDeleting}, ttl: true, visible: true, reapable: true},
	StateFailed:   {next: []State{StateDeleting}, ttl: true, visible: true, reapable: true},
	StateDeleting: {next: []State{StateDeleted}},
}

// active reports whether execs, file operations and packs run on r.
func (r *Record) active() bool { return states[r.State].active }

// transitionEvent is the event published when a record goes from one
// state to another; the end of a delete publishes the record's EndEvent.
func transitionEvent(from, to State) string {
	switch {
	case from == StateCreating && to == StateRunning:
		return EventCreated
	case from == StateCreating && to == StateDeleting:
		return EventFailed
	case to == StateExited:
		return EventExited
	case to == StateFailed:
		return EventFailed
	case to == StatePaused:
		return EventPaused
	case from == StateResuming && to == StateRunning:
		return EventResumed
	}
	return ""
}

// errTransition is a transition the table does not allow from the state
// the record is in (it has moved on: an exit reported twice, say).
var errTransition = errors.New("transition not allowed")

// transitionError says which transition was refused. It is
// FailedPrecondition, and errors.Is(err, errTransition).
type transitionError struct {
	id       string
	from, to State
}

func (e *transitionError) Error() string {
	return fmt.Sprintf("sandbox %s is %s, so it cannot become %s", e.id, e.from, e.to)
}

func (e *transitionError) Is(target error) bool {
	return target == errTransition || target == errdefs.ErrFailedPrecondition
}

// Allowed reports whether the table allows from → to.
func allowed(from, to State) bool { return slices.Contains(states[from].next, to) }

// moveClock applies the TTL clock of a transition at now.
func moveClock(r *Record, from, to State, now time.Time) {
	runs, ran := states[to].ttl, states[from].ttl
	switch {
	case ran && !runs:
		r.TTLStopped = now
	case !ran && runs && !r.TTLStopped.IsZero():
		r.ExpiresAt = r.ExpiresAt.Add(now.Sub(r.TTLStopped))
		r.TTLStopped = time.Time{}
	}
}

// begin records a new sandbox in state creating, holding need (reserved
// by the caller with e.admit). On failure the caller releases need.
func (e *Edge) begin(r *Record) error {
	r.State = StateCreating
	return e.store.insert(r)
}

// transition moves sandbox id to state to if the table allows it from the
// state the record is in (and that state is from, unless from is empty).
// It is move without memory reserved beforehand.
func (e *Edge) transition(id string, from, to State, reason string, mutate func(*Record)) (*Record, error) {
	return e.move(id, from, to, reason, mutate, 0)
}

// move is the only place a record changes state. In one store transaction
// it checks the table, applies mutate (which may be nil), sets the state
// and reason and moves the TTL clock; to StateDeleted it removes the
// record. Then it accounts: what admission holds for the record changes
// by what its new state holds less what its old one did (memHeld; to
// StateDeleted, everything it held is released), of which reserved bytes
// were already reserved by the caller with admit (a resume admits the
// memory its sandbox takes back before it moves). On failure the caller
// releases what it reserved. Last it publishes the transition's event and
// returns the record as it now is.
func (e *Edge) move(id string, from, to State, reason string, mutate func(*Record), reserved int64) (*Record, error) {
	want := from
	var (
		r             *Record
		before, after int64
		diskBefore    int64
	)
	now := time.Now().UTC()
	err := e.store.updateTx(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketSandboxes)
		v := bk.Get([]byte(id))
		if v == nil {
			return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s not found", id)
		}
		r = new(Record)
		if err := json.Unmarshal(v, r); err != nil {
			return err
		}
		from = r.State
		if want != "" && from != want || !allowed(from, to) {
			return &transitionError{id: id, from: from, to: to}
		}
		before = memHeld(r)
		diskBefore = r.Resources.DiskBytes
		if mutate != nil {
			mutate(r)
		}
		moveClock(r, from, to, now)
		r.State = to
		if reason != "" || to != StateDeleted {
			r.Reason = reason
		}
		if to == StateDeleted {
			after = 0
			return bk.Delete([]byte(id))
		}
		after = memHeld(r)
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		return bk.Put([]byte(id), b)
	})
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.committed += after - before - reserved
	if to == StateDeleted {
		e.diskCommitted -= e.diskNeed(diskBefore)
		delete(e.activity, r.ID)
	}
	e.mu.Unlock()
	if to == StateRunning {
		e.touch(id)
	}
	typ := transitionEvent(from, to)
	if to == StateDeleted {
		typ = r.EndEvent
	}
	if typ != "" {
		e.publish(typ, r, reason)
	}
	return r, nil
}

// memHeld is the memory admission holds for r in its state: its limit,
// or in a state whose memory is reclaimed what stayed resident (at most
// its limit).
func memHeld(r *Record) int64 {
	if states[r.State].reclaimed {
		return min(max(r.Resident, 0), r.Resources.MemoryBytes)
	}
	return r.Resources.MemoryBytes
}

// hold counts what a sandbox of r was admitted (at start, for the records
// found; a create reserves with admit and admitDisk instead).
func (e *Edge) hold(r *Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.committed += memHeld(r)
	e.diskCommitted += e.diskNeed(r.Resources.DiskBytes)
}
