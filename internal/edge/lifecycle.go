package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazyregexp"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// CreateParams is a validated create request.
type CreateParams struct {
	Image string
	// Layers, instead of Image, are layer digests (lowest first), run
	// with LayerConfig.
	Layers      []string     `json:",omitempty"`
	LayerConfig *ImageConfig `json:",omitempty"`
	Labels      map[string]string
	Resources   sandbox.Resources
	Env         map[string]string
	Workdir     string
	User        string
	TTL         time.Duration
	IdleTTL     time.Duration
	// PausedTTL bounds the time the sandbox may stay paused (default
	// Defaults.PausedTTL, 24 h); IdleAction is what its idle TTL does
	// when it runs out: IdleDelete (the default) or IdlePause.
	PausedTTL  time.Duration `json:",omitempty"`
	IdleAction string        `json:",omitempty"`
	Backend    string
	// Network is the network policy's JSON document (NetworkSpecOf);
	// empty is none.
	Network json.RawMessage `json:",omitempty"`
	// networkErr is why the request's policy could not be read.
	networkErr error
	// resolved, when set, is the image already resolved (a grading
	// sandbox takes the graded sandbox's layers).
	resolved *Image
	// grader makes a grading sandbox (Record.Grader).
	grader bool
	// id, when set, is the new sandbox's ID, and rollout the rollout it
	// is a member of (rollout.go chooses both).
	id, rollout string
}

var (
	labelKeyRe   = lazyregexp.New(`^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelValueRe = lazyregexp.New(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
	envKeyRe     = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ValidateLabels checks label keys and values (Kubernetes' syntax).
func ValidateLabels(labels map[string]string) error {
	if len(labels) > 64 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%d labels: at most 64", len(labels))
	}
	for k, v := range labels {
		if !labelKeyRe.MatchString(k) {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "label key %.80q: use [prefix/]name with letters, digits, -, _ and . (at most 63)", k)
		}
		if !labelValueRe.MatchString(v) {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "label %.80q=%.80q: values use letters, digits, -, _ and . (at most 63)", k, v)
		}
	}
	return nil
}

func validateEnv(env map[string]string) error {
	for k, v := range env {
		if !envKeyRe.MatchString(k) {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "environment variable name %.80q: use letters, digits and _, not starting with a digit", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "environment variable %.80q holds a NUL byte", k)
		}
	}
	return nil
}

func (e *Edge) normalize(p *CreateParams) error {
	if p.networkErr != nil {
		return p.networkErr
	}
	switch {
	case p.Image == "" && len(p.Layers) == 0 && p.resolved == nil:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "no image: name one (see `dsec image ls`) or give a list of layers")
	case p.Image != "" && len(p.Layers) > 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "both an image and a list of layers: give one of them")
	case p.LayerConfig != nil && len(p.Layers) == 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "a layer config without a list of layers: the image's config applies to an image")
	}
	if err := ValidateLabels(p.Labels); err != nil {
		return err
	}
	if err := checkRolloutLabels(p.Labels, p.rollout); err != nil {
		return err
	}
	if err := validateEnv(p.Env); err != nil {
		return err
	}
	if p.User != "" {
		if _, err := parseUserSpec(p.User); err != nil {
			return err
		}
	}
	r := &p.Resources
	d := e.cfg.Defaults
	switch {
	case r.MemoryBytes < 0, r.Pids < 0, r.DiskBytes < 0, r.CPUs < 0, math.IsNaN(r.CPUs), math.IsInf(r.CPUs, 0):
		return errdefs.Newf(errdefs.ErrInvalidArgument, "resources must not be negative")
	case r.MemoryBytes > 0 && r.MemoryBytes < 8<<20:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "memory %d bytes is below the minimum of 8 MiB", r.MemoryBytes)
	case p.TTL < 0, p.IdleTTL < 0, p.PausedTTL < 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "TTLs must not be negative")
	}
	if err := checkIdleAction(p.IdleAction); err != nil {
		return err
	}
	if r.MemoryBytes == 0 {
		r.MemoryBytes = d.MemoryBytes
	}
	if r.CPUs == 0 {
		r.CPUs = d.CPUs
	}
	if r.CPUs > float64(e.cfg.CPUs) {
		r.CPUs = float64(e.cfg.CPUs) // caps are clamped to the node
	}
	if r.Pids == 0 {
		r.Pids = d.Pids
	}
	if r.DiskBytes == 0 {
		r.DiskBytes = d.DiskBytes
	}
	if p.TTL == 0 {
		p.TTL = d.TTL
	}
	if p.IdleTTL == 0 {
		p.IdleTTL = d.IdleTTL
	}
	if p.PausedTTL == 0 {
		p.PausedTTL = d.PausedTTL
	}
	if p.IdleAction == IdleDelete {
		p.IdleAction = "" // stored as the default
	}
	if p.Backend == "" {
		p.Backend = e.cfg.DefaultBackend
	}
	if len(p.Network) > 0 {
		spec, err := netpolicy.ParsePolicyJSON(p.Network)
		if err != nil {
			return err
		}
		if p.Network, err = e.compileNetwork(spec); err != nil {
			return err
		}
	}
	return nil
}

// admit reserves memory for a sandbox or refuses it.
func (e *Edge) admit(mem int64) (release func(), err error) {
	return e.reserveMemory(mem, func(avail int64) error {
		return errdefs.Newf(errdefs.ErrResourceExhausted,
			"node %s is short of memory (%d MiB available, reserve %d MiB): retry later or on another node",
			e.cfg.Node, avail>>20, e.cfg.MemoryReserve>>20)
	}, func(committed, limit int64) error {
		return errdefs.Newf(errdefs.ErrResourceExhausted,
			"node %s has no room for %d MiB more (%d of %d MiB admitted): delete sandboxes, ask for less memory, or retry later",
			e.cfg.Node, mem>>20, committed>>20, limit>>20)
	})
}

// admitResume reserves the memory a paused sandbox takes back into RAM
// when it resumes, or refuses it: the sandbox stays paused.
func (e *Edge) admitResume(id string, mem int64) (release func(), err error) {
	return e.reserveMemory(mem, func(avail int64) error {
		return errdefs.Newf(errdefs.ErrResourceExhausted,
			"sandbox %s is paused and node %s is short of memory to resume it (%d MiB available, reserve %d MiB): it stays paused; retry later, or pause or delete other sandboxes",
			id, e.cfg.Node, avail>>20, e.cfg.MemoryReserve>>20)
	}, func(committed, limit int64) error {
		return errdefs.Newf(errdefs.ErrResourceExhausted,
			"sandbox %s is paused and node %s has no room to resume it: it takes %d MiB back (%d of %d MiB admitted); it stays paused: retry later, or pause or delete other sandboxes",
			id, e.cfg.Node, mem>>20, committed>>20, limit>>20)
	})
}

// reserveMemory reserves mem against the node's memory capacity, or
// refuses it (with a retry hint) with short when the host is short of
// memory, full when the memory limits admitted leave no room.
func (e *Edge) reserveMemory(mem int64, short func(avail int64) error, full func(committed, limit int64) error) (release func(), err error) {
	limit := e.memoryCapacity()
	if avail := memAvailable(); avail > 0 && avail < e.cfg.MemoryReserve {
		return nil, errdefs.RetryAfter(short(avail), 5*time.Second)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.committed+mem > limit {
		return nil, errdefs.RetryAfter(full(e.committed, limit), 5*time.Second)
	}
	e.committed += mem
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			e.committed -= mem
			e.mu.Unlock()
		})
	}, nil
}

// Create makes a sandbox and returns its record once it runs. With an
// idempotency key, a retry of the same request returns the same sandbox
// (and the create goes on even if the caller goes away, so that the retry
// finds it); the same key with another request is FailedPrecondition.
func (e *Edge) Create(ctx context.Context, caller Caller, p CreateParams, key string) (*Record, error) {
	if key == "" {
		return e.create(ctx, caller, p)
	}
	if len(key) > 256 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "idempotency key is longer than 256 bytes")
	}
	hash := requestHash(p)
	unlock := e.idem.lock(caller.KeyID + "\x00" + key)
	defer unlock()
	k := idemKey(caller, key)
	ent, err := e.store.getIdem(k)
	if err != nil {
		return nil, err
	}
	if ent != nil {
		return e.replay(ent, hash, key)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	r, err := e.create(cctx, caller, p)
	if err != nil {
		return nil, err
	}
	if err := e.store.putIdem(k, &idemEntry{Hash: hash, SandboxID: r.ID, Created: time.Now().UTC(), Snapshot: *r}); err != nil {
		e.log.Warn("record idempotency key", "sandbox", r.ID, "err", err)
	}
	return r, nil
}

func (e *Edge) create(ctx context.Context, caller Caller, p CreateParams) (*Record, error) {
	start := time.Now()
	if err := e.normalize(&p); err != nil {
		return nil, err
	}
	if err := e.checkFits(p.Resources); err != nil {
		return nil, err
	}
	be, err := e.backend(p.Backend)
	if err != nil {
		return nil, err
	}
	if p.IdleAction == IdlePause {
		// Its idle TTL would have nothing to do.
		if err := sandbox.Check(be, sandbox.CapPause); err != nil {
			return nil, err
		}
	}
	img, err := e.resolve(ctx, p)
	if err != nil {
		return nil, err
	}
	tResolved := time.Now()
	release, err := e.admit(p.Resources.MemoryBytes)
	if err != nil {
		return nil, err
	}
	releaseDisk, err := e.admitDisk(p.Resources.DiskBytes)
	if err != nil {
		release()
		return nil, err
	}
	releaseMem := release
	release = func() { releaseMem(); releaseDisk() }
	now := time.Now().UTC()
	project := caller.Project
	if project == "" {
		project = "default"
	}
	workdir := p.Workdir
	if workdir == "" {
		workdir = img.Workdir
	}
	user := p.User
	if user == "" {
		user = img.User
	}
	id := p.id
	if id == "" {
		id = e.newID()
	}
	r := &Record{
		ID: id, Rollout: p.rollout, Image: img.Name, Layers: img.Layers, Labels: p.Labels,
		Project: project, Backend: p.Backend,
		Resources: p.Resources, ImageEnv: img.Env, Env: p.Env,
		Workdir: workdir, User: user,
		CreatedAt: now, ExpiresAt: now.Add(p.TTL), IdleTTL: p.IdleTTL,
		PausedTTL: p.PausedTTL, IdleAction: p.IdleAction,
		Grader: p.grader, Network: p.Network,
	}
	spec := sandbox.Spec{ID: r.ID, Layers: img.Layers, Resources: p.Resources, Env: sandboxEnv(r)}
	if err := sandbox.CheckSpec(be, spec); err != nil {
		release()
		return nil, err
	}
	var np sandbox.NetworkPolicer
	if needsLink(r.Network) {
		if np, err = policer(be); err != nil {
			release()
			return nil, err
		}
	}
	done := e.busy(r.ID, opCreate)
	defer done()
	if err := e.begin(r); err != nil {
		release()
		return nil, err
	}
	// From here the record holds the admission until it is deleted.
	tInserted := time.Now()
	e.touch(r.ID)
	crashPoint("create:recorded")
	_, err = be.Create(ctx, spec)
	if err == nil && np != nil {
		// Before the create returns: the sandbox's first exec already has
		// its network.
		if _, err = np.SetNetwork(ctx, r.ID, r.Network); err != nil {
			err = fmt.Errorf("set network: %w", err)
		}
	}
	tBackend := time.Now()
	crashPoint("create:made")
	defer func() {
		e.log.Debug("create phases", "sandbox", r.ID, "resolve_ms", ms(tResolved.Sub(start)), "insert_ms", ms(tInserted.Sub(tResolved)),
			"backend_ms", ms(tBackend.Sub(tInserted)), "update_ms", ms(time.Since(tBackend)))
	}()
	if err != nil {
		// The reason is shown to users (events, the record while it is
		// deleted); an internal error's text is only for the log, which
		// gets it when the create's reply is sent, with an id the reply
		// names.
		reason, ok := apierr.Public(err)
		if !ok {
			reason = "internal error: the create's reply names an id under which the node's log has the details"
		}
		if _, terr := e.transition(r.ID, StateCreating, StateDeleting, reason, nil); terr != nil {
			e.log.Warn("record failed create", "sandbox", r.ID, "err", terr)
		} else {
			// Leave nothing behind, even if the caller has gone; what the
			// backend cannot remove now, the reconcile tick retries.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if derr := e.finishDelete(cctx, be, r.ID); derr != nil {
				e.log.Warn("clean up failed create", "sandbox", r.ID, "err", derr)
			}
		}
		return nil, fmt.Errorf("create sandbox from %s: %w", img.Name, err)
	}
	r, err = e.transition(r.ID, StateCreating, StateRunning, "", nil)
	if err != nil {
		return nil, err
	}
	crashPoint("create:running")
	if m := e.cfg.Metrics; m != nil {
		m.CreateSeconds.WithLabelValues(r.Backend).Observe(time.Since(start).Seconds())
	}
	return r, nil
}

// sandboxEnv is a sandbox's environment: the image's, then its own.
func sandboxEnv(r *Record) []string {
	env := map[string]string{}
	var keys []string
	for _, kv := range r.ImageEnv {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if _, seen := env[k]; !seen {
				keys = append(keys, k)
			}
			env[k] = v
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.Env)) {
		if _, seen := env[k]; !seen {
			keys = append(keys, k)
		}
		env[k] = r.Env[k]
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k + "=" + env[k]
	}
	return out
}

// Get returns one sandbox, with its state refreshed from the backend.
func (e *Edge) Get(ctx context.Context, caller Caller, id string) (*Record, error) {
	r, err := e.lookup(caller, id)
	if err != nil {
		return nil, err
	}
	e.touch(id)
	return e.refresh(ctx, r), nil
}

// refresh notices a sandbox whose init has ended or that its backend
// lost.
func (e *Edge) refresh(ctx context.Context, r *Record) *Record {
	if r.State != StateRunning {
		return r
	}
	be, err := e.backend(r.Backend)
	if err != nil {
		return r
	}
	st, err := be.Status(ctx, r.ID)
	switch {
	case errdefs.Is(err, errdefs.ErrNotFound):
		return e.ended(r, StateFailed, reasonLost)
	case err != nil:
		return r
	case st.State == sandbox.StateExited:
		return e.ended(r, StateExited, st.Reason)
	}
	return r
}

// reasonLost is the reason of a running sandbox its backend no longer has.
const reasonLost = "lost: the node keeper no longer has this sandbox"

// ended moves a running record to exited or failed, or a paused one to
// failed (its init cannot end on its own while it is stopped: something
// killed it), and returns it as it is now (as it was, if it had moved on:
// a record being paused or resumed is left to that, and to the reconcile
// tick).
func (e *Edge) ended(r *Record, to State, reason string) *Record {
	from := StateRunning
	if r.State == StatePaused {
		from, to = StatePaused, StateFailed
		switch reason {
		case reasonLost:
		case "":
			reason = "its init ended while it was paused"
		default:
			reason = "its init ended while it was paused: " + reason
		}
	}
	nr, err := e.transition(r.ID, from, to, reason, nil)
	if err != nil {
		if !errors.Is(err, errTransition) && !errdefs.Is(err, errdefs.ErrNotFound) {
			e.log.Warn("record sandbox end", "sandbox", r.ID, "state", to, "err", err)
		}
		if cur, gerr := e.store.get(r.ID); gerr == nil {
			return cur
		}
		return r
	}
	return nr
}

// List returns the sandboxes caller may see that match every label of sel.
func (e *Edge) List(ctx context.Context, caller Caller, sel map[string]string) ([]*Record, error) {
	recs, err := e.visible(caller, sel)
	if err != nil {
		return nil, err
	}
	live := map[string]sandbox.Status{}
	for name, be := range e.cfg.Backends {
		sts, err := be.List(ctx)
		if err != nil {
			e.log.Warn("list backend", "backend", name, "err", err)
			return recs, nil
		}
		for _, s := range sts {
			live[s.ID] = s
		}
	}
	for i, r := range recs {
		if r.State != StateRunning {
			continue
		}
		if s, ok := live[r.ID]; !ok || s.State == sandbox.StateExited {
			recs[i] = e.refresh(ctx, r)
		}
	}
	return recs, nil
}

// Delete deletes one sandbox; a rollout's member is deleted with its
// rollout only (DeleteRollout).
func (e *Edge) Delete(ctx context.Context, caller Caller, id string) error {
	r, err := e.lookup(caller, id)
	if err != nil {
		return err
	}
	if err := memberAlone(r); err != nil {
		return err
	}
	return e.deleteOne(ctx, id, EventDeleted, "")
}

// DeleteSelector deletes every sandbox caller sees that matches sel and
// returns their IDs. A rollout's member that matches is deleted with its
// whole rollout.
func (e *Edge) DeleteSelector(ctx context.Context, caller Caller, sel map[string]string) ([]string, error) {
	if len(sel) == 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "delete by selector needs at least one label")
	}
	if caller.Rollout != "" {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "a rollout member's key cannot delete sandboxes")
	}
	recs, err := e.visible(caller, sel)
	if err != nil {
		return nil, err
	}
	recs, deleted, first := e.deleteRolloutsOf(ctx, recs)
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, 8)
	)
	for _, r := range recs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := e.deleteOne(ctx, r.ID, EventDeleted, "")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				deleted = append(deleted, r.ID)
			case errdefs.Is(err, errdefs.ErrNotFound):
			case first == nil:
				first = err
			}
		}()
	}
	wg.Wait()
	return deleted, first
}

// deleteOne deletes a sandbox and publishes typ (deleted, or ttl_expired)
// once the backend removed everything. A sandbox still being created is
// FailedPrecondition; one already being deleted is NotFound. A pause or
// resume of the sandbox in flight ends first (Edge.changes), and none
// starts while it is deleted; a paused sandbox is deleted as it is,
// without being resumed.
func (e *Edge) deleteOne(ctx context.Context, id, typ, reason string) error {
	unlock, err := e.changes.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	done, err := e.claim(id, opDelete)
	if err != nil {
		return err
	}
	defer done()
	r, err := e.transition(id, "", StateDeleting, reason, func(r *Record) { r.EndEvent = typ })
	if errors.Is(err, errTransition) {
		// Only a deleting record cannot become deleting: finishing its
		// delete is the reconcile tick's.
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", id)
	}
	if err != nil {
		return err
	}
	crashPoint("delete:marked")
	be, err := e.backend(r.Backend)
	if err != nil {
		return err
	}
	// Deletion finishes even when the caller goes away.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := e.finishDelete(dctx, be, id); err != nil {
		return fmt.Errorf("delete sandbox %s (the node retries it): %w", id, err)
	}
	return nil
}

// finishDelete has the backend remove a deleting sandbox and then removes
// its record, releasing its admission. If the backend fails, the record
// stays deleting (and keeps its admission) for the reconcile tick.
func (e *Edge) finishDelete(ctx context.Context, be sandbox.Backend, id string) error {
	if err := be.Delete(ctx, id); err != nil {
		return err
	}
	crashPoint("delete:removed")
	_, err := e.transition(id, StateDeleting, StateDeleted, "", nil)
	return err
}

// NodeStatus is the node's load for placement.
type NodeStatus struct {
	Node             string
	Backends         []string
	Sandboxes        int64
	CPUs             int
	MemoryBytes      int64
	MemoryCommitted  int64
	MemoryAdmissible int64
	MemoryAvailable  int64
	// Projects is what the live sandboxes (all but those being deleted)
	// hold, by project: the control plane admits per-project limits
	// against the sum over nodes.
	Projects map[string]ProjectUse
}

// ProjectUse is what one project's sandboxes hold on a node.
type ProjectUse struct {
	Sandboxes   int64
	MemoryBytes int64
}

// Status reports the node's load.
func (e *Edge) Status() (NodeStatus, error) {
	recs, err := e.store.list()
	if err != nil {
		return NodeStatus{}, err
	}
	st := NodeStatus{
		Node: e.cfg.Node, CPUs: e.cfg.CPUs, MemoryBytes: e.cfg.MemoryBytes,
		MemoryAdmissible: e.memoryCapacity(),
		MemoryAvailable:  memAvailable(),
		Sandboxes:        int64(len(recs)),
	}
	for name := range e.cfg.Backends {
		st.Backends = append(st.Backends, name)
	}
	st.Projects = make(map[string]ProjectUse)
	for _, r := range recs {
		if r.State == StateDeleting {
			continue
		}
		u := st.Projects[r.Project]
		u.Sandboxes++
		u.MemoryBytes += r.Resources.MemoryBytes
		st.Projects[r.Project] = u
	}
	e.mu.Lock()
	st.MemoryCommitted = e.committed
	e.mu.Unlock()
	return st, nil
}

// Timeouts are the lifetimes SetTimeout changes; nil leaves one as it is.
type Timeouts struct {
	// TTL is a new hard TTL, counted from now (for a paused sandbox, from
	// its resume: paused time does not count).
	TTL *time.Duration
	// IdleTTL is a new idle TTL.
	IdleTTL *time.Duration
	// PausedTTL is a new paused TTL, counted from the pause for a paused
	// sandbox.
	PausedTTL *time.Duration
	// IdleAction is a new idle action (IdleDelete or IdlePause); empty
	// keeps it.
	IdleAction string
}

// SetTimeout changes a live sandbox's lifetimes (Timeouts). It does not
// resume a paused sandbox.
func (e *Edge) SetTimeout(ctx context.Context, caller Caller, id string, t Timeouts) (*Record, error) {
	r, err := e.lookup(caller, id)
	if err != nil {
		return nil, err
	}
	for _, d := range []*time.Duration{t.TTL, t.IdleTTL, t.PausedTTL} {
		if d != nil && *d <= 0 {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "TTLs must be positive")
		}
	}
	if err := checkIdleAction(t.IdleAction); err != nil {
		return nil, err
	}
	if t.IdleAction == IdlePause {
		be, err := e.backend(r.Backend)
		if err != nil {
			return nil, err
		}
		if err := sandbox.Check(be, sandbox.CapPause); err != nil {
			return nil, err
		}
	}
	e.touch(id)
	r, err = e.store.update(id, func(r *Record) error {
		if !states[r.State].visible {
			return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", id)
		}
		if t.TTL != nil {
			// While the clock is stopped, ExpiresAt moves on by the
			// stopped time when it runs again (moveClock): count from
			// when it stopped.
			from := time.Now().UTC()
			if !r.TTLStopped.IsZero() {
				from = r.TTLStopped
			}
			r.ExpiresAt = from.Add(*t.TTL)
		}
		if t.IdleTTL != nil {
			r.IdleTTL = *t.IdleTTL
		}
		if t.PausedTTL != nil {
			r.PausedTTL = *t.PausedTTL
		}
		switch t.IdleAction {
		case IdleDelete:
			r.IdleAction = ""
		case IdlePause:
			r.IdleAction = IdlePause
		}
		return nil
	})
	if err == nil {
		e.publish(EventUpdated, r, "timeout")
	}
	return r, err
}

// UpdateLabels sets and removes labels of a sandbox.
func (e *Edge) UpdateLabels(ctx context.Context, caller Caller, id string, set map[string]string, remove []string) (*Record, error) {
	if _, err := e.lookup(caller, id); err != nil {
		return nil, err
	}
	if err := ValidateLabels(set); err != nil {
		return nil, err
	}
	if _, ok := set[RolloutLabel]; ok || slices.Contains(remove, RolloutLabel) {
		return nil, reservedLabel()
	}
	e.touch(id)
	r, err := e.store.update(id, func(r *Record) error {
		if !states[r.State].visible {
			return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", id)
		}
		if r.Labels == nil {
			r.Labels = map[string]string{}
		}
		for _, k := range remove {
			delete(r.Labels, k)
		}
		for k, v := range set {
			r.Labels[k] = v
		}
		return ValidateLabels(r.Labels)
	})
	if err == nil {
		e.publish(EventUpdated, r, "labels")
	}
	return r, err
}

// Stats reports a sandbox's resource use.
func (e *Edge) Stats(ctx context.Context, caller Caller, id string) (*Record, sandbox.Stats, error) {
	r, err := e.lookup(caller, id)
	if err != nil {
		return nil, sandbox.Stats{}, err
	}
	be, err := e.backend(r.Backend)
	if err != nil {
		return nil, sandbox.Stats{}, err
	}
	st, err := be.Stats(ctx, id)
	return r, st, err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
