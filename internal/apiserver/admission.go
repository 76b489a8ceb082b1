package apiserver

// Admission of creates by project: the maximum TTL, who may run which
// image, and per-project limits on live sandboxes and their memory.
//
// Where the count lives: each edge is the authority for its node and
// reports, with its status, what every project's live sandboxes hold there
// (nodev1.StatusResponse.projects); the watcher polls those reports every
// 2 s. A project's usage is the sum of the last reports plus what this
// apiserver admitted that no report covers yet: creates in flight, and
// creates that succeeded after the last poll of their node started. So one
// apiserver (dsec up) never lets a project exceed its limits, however many
// creates race. With several apiservers each counts only its own creates in
// flight: a project may go over by what the others admitted since their
// nodes' last report (at most one poll interval of creates). A refused
// create polls the nodes again first (at most twice a second), so a project
// that just deleted sandboxes is not refused on a stale report. A retry of
// a create with its idempotency key counts again until its node's next
// report (the edge returns the sandbox it made, but the ledger cannot tell).

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/watcher"
)

// create admits a create request for the caller's project, then places it.
func (s *Server) create(ctx context.Context, msg *sandboxv1.CreateRequest) (*sandboxv1.CreateResponse, error) {
	proj, err := s.checkCreate(ctx, msg)
	if err != nil {
		return nil, err
	}
	mem := msg.GetResources().GetMemoryBytes()
	if mem <= 0 {
		mem = s.cfg.DefaultMemory
	}
	done, err := s.reserve(ctx, proj, mem)
	if err != nil {
		return nil, err
	}
	resp, err := s.place(ctx, msg)
	done(resp.GetSandbox().GetNode(), err == nil)
	return resp, err
}

// checkCreate checks what does not depend on load: the TTLs against the
// project's maximum (filling them in when the defaults exceed it) and that
// the caller may run the image. It returns the project.
func (s *Server) checkCreate(ctx context.Context, msg *sandboxv1.CreateRequest) (cluster.Project, error) {
	if err := checkSandboxCreate(ctx, msg); err != nil {
		return cluster.Project{}, err
	}
	k := keyFrom(ctx)
	proj, err := s.cfg.Cluster.GetProject(ctx, k.Project)
	if err != nil {
		return cluster.Project{}, err
	}
	maxTTL := proj.Limits.MaxTTL
	if err := checkTTL("ttl", msg.GetTtl().AsDuration(), proj); err != nil {
		return cluster.Project{}, err
	}
	if err := checkTTL("idle ttl", msg.GetIdleTtl().AsDuration(), proj); err != nil {
		return cluster.Project{}, err
	}
	if err := checkTTL("paused ttl", msg.GetPausedTtl().AsDuration(), proj); err != nil {
		return cluster.Project{}, err
	}
	if msg.Ttl == nil && s.defaultTTL() > maxTTL {
		msg.Ttl = durationOf(maxTTL)
	}
	if msg.IdleTtl == nil && s.defaultIdleTTL() > maxTTL {
		msg.IdleTtl = durationOf(maxTTL)
	}
	if msg.PausedTtl == nil && s.defaultPausedTTL() > maxTTL {
		msg.PausedTtl = durationOf(maxTTL)
	}
	if name := msg.GetImage(); name != "" {
		ref, err := cluster.ParseRef(name)
		if err != nil {
			return cluster.Project{}, err
		}
		img, err := s.cfg.Cluster.GetImageCached(ctx, ref)
		if err != nil {
			return cluster.Project{}, err
		}
		if !img.RunnableBy(k.Principal()) {
			return cluster.Project{}, hiddenImage(ref)
		}
	}
	return proj, nil
}

// checkTTL refuses a TTL above the project's maximum; what is the field
// for the message. Zero is "unset".
func checkTTL(what string, d time.Duration, p cluster.Project) error {
	switch {
	case d < 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%s %s is negative: give a positive duration", what, d)
	case d > p.Limits.MaxTTL:
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"%s %s is above the maximum TTL of project %s, %s: ask for less (an administrator sets it with `dsec project limits %s --max-ttl`)",
			what, formatDuration(d), p.Name, formatDuration(p.Limits.MaxTTL), p.Name)
	}
	return nil
}

// checkTimeout checks a SetTimeout request against the caller's project.
func (s *Server) checkTimeout(ctx context.Context, msg *sandboxv1.SetTimeoutRequest) error {
	proj, err := s.cfg.Cluster.GetProject(ctx, keyFrom(ctx).Project)
	if err != nil {
		return err
	}
	if err := checkTTL("ttl", msg.GetTtl().AsDuration(), proj); err != nil {
		return err
	}
	if err := checkTTL("paused ttl", msg.GetPausedTtl().AsDuration(), proj); err != nil {
		return err
	}
	return checkTTL("idle ttl", msg.GetIdleTtl().AsDuration(), proj)
}

// The edges' default TTLs (dsec up runs them with the contract's).
func (s *Server) defaultTTL() time.Duration     { return sandbox.ContractDefaults.TTL }
func (s *Server) defaultIdleTTL() time.Duration { return sandbox.ContractDefaults.IdleTTL }
func (s *Server) defaultPausedTTL() time.Duration {
	return sandbox.ContractDefaults.PausedTTL
}

// hiddenImage is what a caller that may not run an image is told: the
// same as for an image that does not exist.
func hiddenImage(ref cluster.Ref) error {
	return errdefs.Newf(errdefs.ErrNotFound,
		"image %s not found: build it with `dsec image build` or list images with `dsec image ls`", ref)
}

func durationOf(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

// formatDuration writes whole days as "7d", anything else as Go does.
func formatDuration(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= day && d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	return d.String()
}

// formatBytes writes n in powers of 1024 with a unit ("200 GiB").
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	v := float64(n) / float64(div)
	if n%div == 0 {
		return fmt.Sprintf("%d %ciB", n/div, "KMGTPE"[exp])
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[exp])
}

// reserve admits a sandbox of mem bytes against proj's limits and counts
// it until done is called with the node it landed on (and whether it did).
func (s *Server) reserve(ctx context.Context, proj cluster.Project, mem int64) (done func(node string, ok bool), _ error) {
	lim := proj.Limits
	if lim.Sandboxes <= 0 && lim.MemoryBytes <= 0 {
		return func(string, bool) {}, nil
	}
	nodes := s.cfg.Watcher.Nodes()
	done, err := s.usage.reserve(proj, mem, nodes, time.Now())
	if err == nil || !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		return done, err
	}
	// The reports may predate deletes: read them again, then decide.
	if s.usage.refresh(ctx, s.cfg.Watcher, reportedAt(nodes)) {
		return s.usage.reserve(proj, mem, s.cfg.Watcher.Nodes(), time.Now())
	}
	return nil, err
}

// recentMax is how long a create counts on its own when its node's report
// never covers it (the node went away).
const recentMax = time.Minute

// refreshEvery bounds how often refused creates poll the nodes.
const refreshEvery = 100 * time.Millisecond

// projectLedger counts, per project, what this apiserver admitted that the
// nodes' reports do not cover yet. Its zero value works.
type projectLedger struct {
	mu sync.Mutex
	// guarded by mu
	inflight map[string]projectUse
	recent   []recentCreate
	polled   time.Time // when a refused create last polled the nodes
	changed  time.Time // when a create or delete through this apiserver last ended

	poll sync.Mutex // held while a refused create polls the nodes
}

type projectUse struct{ sandboxes, memory int64 }

type recentCreate struct {
	project, node string
	at            time.Time // when the create returned
	mem           int64
}

// usedLocked returns what proj's sandboxes hold by the reports in nodes
// plus what this apiserver admitted since; guarded by mu. It forgets the
// creates the reports cover.
func (l *projectLedger) usedLocked(proj string, nodes []watcher.NodeState, now time.Time) projectUse {
	seen := make(map[string]time.Time, len(nodes))
	var u projectUse
	for _, n := range nodes {
		if n.Status == nil {
			continue
		}
		if len(n.Status.GetProjects()) == 0 && n.Status.GetSandboxes() > 0 {
			// An edge older than per-project reports: its report covers
			// none of the creates this apiserver counts.
			continue
		}
		seen[n.Node.Name] = n.Seen
		if r := n.Status.GetProjects()[proj]; r != nil {
			u.sandboxes += r.GetSandboxes()
			u.memory += r.GetMemoryBytes()
		}
	}
	keep := l.recent[:0]
	for _, c := range l.recent {
		if polled, ok := seen[c.node]; (ok && polled.After(c.at)) || now.Sub(c.at) > recentMax {
			continue // the node's report counts it, or it is gone
		}
		keep = append(keep, c)
		if c.project == proj {
			u.sandboxes++
			u.memory += c.mem
		}
	}
	clear(l.recent[len(keep):])
	l.recent = keep
	in := l.inflight[proj]
	u.sandboxes += in.sandboxes
	u.memory += in.memory
	return u
}

// reserve counts a create of mem bytes for p unless it would exceed p's
// limits (ResourceExhausted naming the project and the limit, or
// InvalidArgument when mem alone is above it).
func (l *projectLedger) reserve(p cluster.Project, mem int64, nodes []watcher.NodeState, now time.Time) (func(node string, ok bool), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.usedLocked(p.Name, nodes, now)
	lim := p.Limits
	switch {
	case lim.MemoryBytes > 0 && mem > lim.MemoryBytes:
		// Above the limit on its own: no delete makes room for it.
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument,
			"project %s: a sandbox of %s is above its memory limit of %s for all its sandboxes together: ask for less memory (--memory), or ask an administrator to raise it (`dsec project limits %s --memory SIZE`)",
			p.Name, formatBytes(mem), formatBytes(lim.MemoryBytes), p.Name)
	case lim.Sandboxes > 0 && u.sandboxes+1 > lim.Sandboxes:
		return nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrResourceExhausted,
			"project %s has %d live sandboxes, its limit is %d: delete some (`dsec ps`, `dsec rm`) or ask an administrator to raise it (`dsec project limits %s --sandboxes N`)",
			p.Name, u.sandboxes, lim.Sandboxes, p.Name), 5*time.Second)
	case lim.MemoryBytes > 0 && u.memory+mem > lim.MemoryBytes:
		return nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrResourceExhausted,
			"project %s: a sandbox of %s on top of the %s its sandboxes hold is above its memory limit of %s: delete some, ask for less memory, or ask an administrator to raise it (`dsec project limits %s --memory SIZE`)",
			p.Name, formatBytes(mem), formatBytes(u.memory), formatBytes(lim.MemoryBytes), p.Name), 5*time.Second)
	}
	if l.inflight == nil {
		l.inflight = make(map[string]projectUse)
	}
	in := l.inflight[p.Name]
	in.sandboxes++
	in.memory += mem
	l.inflight[p.Name] = in
	var once sync.Once
	return func(node string, ok bool) {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			in := l.inflight[p.Name]
			in.sandboxes--
			in.memory -= mem
			if in == (projectUse{}) {
				delete(l.inflight, p.Name)
			} else {
				l.inflight[p.Name] = in
			}
			if ok {
				now := time.Now()
				l.recent = append(l.recent, recentCreate{project: p.Name, node: node, at: now, mem: mem})
				l.changed = now
			}
		})
	}, nil
}

// touched records that a create or delete went through this apiserver:
// reports older than it may miss sandboxes or count ones that are gone.
func (l *projectLedger) touched() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changed = time.Now()
}

// poller polls the nodes now (the watcher).
type poller interface {
	Poll(ctx context.Context)
}

// refresh polls the nodes again when their reports (taken at reported,
// the oldest of the last polls) may predate a create or delete through
// this apiserver, and reports whether the view is now newer than reported
// (this call or another polled since); a poll in progress is waited for
// instead, and polls are at least refreshEvery apart (a refused create
// waits that long at most). A refused create
// calls it: a report that counts a deleted sandbox, or a finished create
// twice (once reported, once recent), would refuse it wrongly.
func (l *projectLedger) refresh(ctx context.Context, p poller, reported time.Time) bool {
	start := time.Now()
	l.poll.Lock()
	defer l.poll.Unlock()
	l.mu.Lock()
	polled, changed := l.polled, l.changed
	l.mu.Unlock()
	switch {
	case polled.After(start) || polled.After(reported):
		return true // polled by another create since the caller's view was taken
	case reported.After(changed) || polled.After(changed):
		return false // the reports are newer than anything this apiserver did
	}
	if wait := refreshEvery - time.Since(polled); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return false
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	polled = time.Now()
	p.Poll(ctx)
	l.mu.Lock()
	l.polled = polled
	l.mu.Unlock()
	return true
}

// reportedAt is when the oldest of the nodes' last reports was taken.
func reportedAt(nodes []watcher.NodeState) time.Time {
	var t time.Time
	for _, n := range nodes {
		if n.Status != nil && (t.IsZero() || n.Seen.Before(t)) {
			t = n.Seen
		}
	}
	return t
}

// used is what proj's sandboxes hold: the nodes' reports plus what this
// apiserver admitted since.
func (l *projectLedger) used(proj string, nodes []watcher.NodeState, now time.Time) projectUse {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.usedLocked(proj, nodes, now)
}
