// Package edge is the node agent: the authority for its node. It admits
// sandboxes (refusing what does not fit), keeps their records in a
// node-local bbolt file, drives the isolation backends, enforces TTLs, and
// serves the sandbox API for the control plane. On start it reconciles its
// records with what the backends find running: live sandboxes are kept,
// half-made or half-deleted ones are removed, and anything that belongs to
// no record is cleaned up.
package edge

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/metrics"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/internal/project"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// ImageResolver turns an image name into local layers.
type ImageResolver interface {
	// Resolve returns the image's layers (with local paths a backend can
	// use) and its config; NotFound when the image is unknown.
	Resolve(ctx context.Context, ref string) (Image, error)
}

// Image is a resolved image.
type Image struct {
	Name    string // NAME:TAG
	Layers  []sandbox.Layer
	Env     []string
	Workdir string
	User    string
}

// Defaults are the limits and lifetimes of a sandbox whose request leaves
// them out.
type Defaults = sandbox.Defaults

// Config configures an edge.
type Config struct {
	// Node names this node; it is the prefix of every sandbox ID made here.
	Node     string
	StateDir string
	// Backends by name; DefaultBackend is used when a request names none.
	Backends       map[string]sandbox.Backend
	DefaultBackend string
	Images         ImageResolver
	// Defaults for create; zero fields take sandbox.ContractDefaults.
	Defaults Defaults
	// MemoryBytes is the node's memory (default: MemTotal).
	MemoryBytes int64
	// MemoryOvercommit is how many times the node's memory the sandboxes'
	// memory limits may add up to (default 4).
	MemoryOvercommit float64
	// MemoryReserve refuses creates while MemAvailable is below it
	// (default 512 MiB).
	MemoryReserve int64
	// DiskOvercommit is how many times the space left on the state dir's
	// file system (its free space above DiskReserve) the sandboxes'
	// writable disks and exec output quotas may add up to (default
	// DefaultDiskOvercommit, 32); one sandbox's must fit the space left
	// itself (admission.go).
	DiskOvercommit float64
	// DiskReserve is the free space kept for the host on the state dir's
	// file system (default ceiling.DiskReserve: 5%, at least 2 GiB).
	DiskReserve ceiling.Reserve
	// OutputQuota is the exec output a sandbox may keep, admitted with its
	// disk (default DefaultOutputQuota, the keeper's 256 MiB).
	OutputQuota int64
	// PidsCeiling is the most tasks all sandboxes together may run (the
	// keeper's host ceiling); a sandbox asking for more pids can never
	// get them and is refused (default: the host's task limit,
	// kernel.pid_max or kernel.threads-max; unchecked where unknown).
	PidsCeiling int64
	// CPUs is the node's CPU count (default: runtime.NumCPU()).
	CPUs    int
	Version string
	Logger  *slog.Logger
	// Metrics, when set, receives latencies and the node's sandboxes:
	// aggregates by project, backend and state.
	Metrics *metrics.Metrics
	// MetricsPerSandbox also exports series per sandbox ID (CPU, memory and
	// their limits). Off by default: /metrics needs no key on loopback, and
	// sandbox IDs are not for every local user to list.
	MetricsPerSandbox bool
	// MaxRequestBytes bounds request bodies and stream messages of the
	// edge's API (internal/reqlimit; 0: reqlimit.DefaultMaxBytes).
	MaxRequestBytes int64
	// StateSync says how node state changes reach the disk: 0 (the
	// default) writes each change to the page cache before its call
	// returns and flushes every 100 ms, and rebuilds a file last written
	// before this boot (a power loss may have damaged it, and ended every
	// sandbox it describes); positive flushes every StateSync; negative is
	// an fsync'd group commit, each change on disk when its call returns.
	// See openStore and docs/architecture.md (Node state).
	StateSync time.Duration
	// ReconcileEvery is how often the reconcile tick drives half-done
	// sandboxes (creating, deleting) to their end while the edge runs
	// (default 5 s).
	ReconcileEvery time.Duration
	// Network is the node's catalogue of network services, against which
	// sandboxes' policies are checked (default: netpolicy.Builtin(); the
	// operator's --network-config file otherwise, whose allow_open =
	// false refuses mode open).
	Network *netpolicy.Catalogue
}

// Edge is a running node agent.
type Edge struct {
	cfg   Config
	log   *slog.Logger
	store *store

	wg     sync.WaitGroup
	stop   chan struct{}
	events bus
	idem   idemLocks
	// netLocks serialise the network updates of one sandbox.
	netLocks idemLocks
	// changes serialise each sandbox's pause, resume and delete (and the
	// reconcile tick's settling of them); gates order its pause and
	// resume with the starts of the operations that need it running
	// (gate.go). A pause or resume takes both, in that order; a delete
	// only changes, so it never waits for a file transfer.
	changes gates
	gates   gates
	// pauseSlots bounds the pauses and resumes the backends run at once
	// (pause.go).
	pauseSlots chan struct{}
	// diskSpace measures the state dir's file system (a fake in tests).
	diskSpace func() (ceiling.Space, error)

	mu sync.Mutex
	// guarded by mu
	committed     int64                // memory limits of the sandboxes with records (state.go)
	diskCommitted int64                // their disks and output quotas
	activity      map[string]time.Time // last API use per sandbox
	streams       map[string]int       // open exec streams per sandbox
	ops           map[string]op        // operations in flight (reconcile.go)

	tunnels portTunnels // open port connections per sandbox (ports.go)
	ro      rollouts    // the rollouts' members and operations (rollout.go)
}

// New opens the node state, reconciles it with the backends and starts the
// TTL reaper.
func New(ctx context.Context, cfg Config) (*Edge, error) {
	if !sandbox.ValidNodeName(cfg.Node) {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "node name %q: use 1-40 of [a-z0-9-], starting and ending with a letter or digit", cfg.Node)
	}
	if len(cfg.Backends) == 0 {
		return nil, fmt.Errorf("edge: no backends")
	}
	if cfg.DefaultBackend == "" {
		for name := range cfg.Backends {
			cfg.DefaultBackend = name
		}
	}
	d := &cfg.Defaults
	if d.MemoryBytes == 0 {
		d.MemoryBytes = sandbox.ContractDefaults.MemoryBytes
	}
	if d.CPUs == 0 {
		d.CPUs = sandbox.ContractDefaults.CPUs
	}
	if d.Pids == 0 {
		d.Pids = sandbox.ContractDefaults.Pids
	}
	if d.DiskBytes == 0 {
		d.DiskBytes = sandbox.ContractDefaults.DiskBytes
	}
	if d.TTL == 0 {
		d.TTL = sandbox.ContractDefaults.TTL
	}
	if d.IdleTTL == 0 {
		d.IdleTTL = sandbox.ContractDefaults.IdleTTL
	}
	if d.PausedTTL == 0 {
		d.PausedTTL = sandbox.ContractDefaults.PausedTTL
	}
	if cfg.MemoryBytes == 0 {
		cfg.MemoryBytes = memTotal()
	}
	if cfg.MemoryOvercommit == 0 {
		cfg.MemoryOvercommit = 4
	}
	if cfg.MemoryReserve == 0 {
		cfg.MemoryReserve = 512 << 20
	}
	if cfg.DiskOvercommit == 0 {
		cfg.DiskOvercommit = DefaultDiskOvercommit
	}
	if cfg.DiskOvercommit < 1 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "disk overcommit %v is below 1", cfg.DiskOvercommit)
	}
	if cfg.OutputQuota == 0 {
		cfg.OutputQuota = DefaultOutputQuota
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = runtime.NumCPU()
	}
	if cfg.PidsCeiling == 0 {
		if h, err := ceiling.ReadHost(); err == nil {
			cfg.PidsCeiling = h.Tasks
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	if cfg.ReconcileEvery <= 0 {
		cfg.ReconcileEvery = defaultReconcileEvery
	}
	st, err := openStore(filepath.Join(cfg.StateDir, "edge.db"), cfg.StateSync)
	if err != nil {
		return nil, err
	}
	if st.repaired != "" {
		cfg.Logger.Warn(st.repaired)
	}
	e := &Edge{
		cfg: cfg, log: cfg.Logger, store: st, stop: make(chan struct{}),
		activity: map[string]time.Time{}, streams: map[string]int{}, ops: map[string]op{},
		pauseSlots: make(chan struct{}, maxPausesAtOnce),
		diskSpace:  func() (ceiling.Space, error) { return ceiling.DiskSpace(cfg.StateDir) },
	}
	if err := e.loadRollouts(); err != nil {
		st.close()
		return nil, err
	}
	if err := e.recover(ctx); err != nil {
		st.close()
		return nil, err
	}
	e.tickRollouts(ctx)
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Registry.Register(collector{e}); err != nil {
			st.close()
			return nil, err
		}
	}
	e.wg.Add(1)
	go e.reapLoop()
	for name, be := range cfg.Backends {
		if src, ok := be.(sandbox.EventSource); ok {
			e.wg.Add(1)
			go e.eventLoop(name, src)
		}
	}
	return e, nil
}

// Close stops the edge's goroutines and closes its state; sandboxes keep
// running.
func (e *Edge) Close() error {
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.Registry.Unregister(collector{e})
	}
	close(e.stop)
	e.wg.Wait()
	return e.store.close()
}

// Node returns the node's name.
func (e *Edge) Node() string { return e.cfg.Node }

// reapLoop deletes sandboxes whose hard or idle TTL has passed, and runs
// the reconcile tick.
func (e *Edge) reapLoop() {
	defer e.wg.Done()
	t := time.NewTicker(min(time.Second, e.cfg.ReconcileEvery))
	defer t.Stop()
	lastIdemSweep, lastReconcile := time.Now(), time.Now()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		if now.Sub(lastReconcile) >= e.cfg.ReconcileEvery {
			lastReconcile = now
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := e.reconcileOnce(ctx); err != nil {
				e.log.Warn("reconcile", "err", err)
			}
			e.tickRollouts(ctx)
			cancel()
		}
		e.reap(now)
		if now.Sub(lastIdemSweep) > time.Minute {
			lastIdemSweep = now
			if err := e.store.expireIdem(now); err != nil {
				e.log.Warn("expire idempotency keys", "err", err)
			}
		}
	}
}

// reap deletes the sandboxes whose hard or idle TTL has passed at now
// (or, with idle action pause, pauses those whose idle TTL has), and
// those paused for longer than their paused TTL.
func (e *Edge) reap(now time.Time) {
	recs, err := e.store.list()
	if err != nil {
		e.log.Warn("list sandboxes for TTLs", "err", err)
		return
	}
	for _, r := range recs {
		info := states[r.State]
		reason := ""
		switch {
		case info.pausedTTL && now.After(pausedExpiry(r, e.cfg.Defaults.PausedTTL)):
			reason = reasonPausedTTL
		case !info.reapable:
		case !r.ExpiresAt.IsZero() && now.After(r.ExpiresAt):
			reason = "hard TTL expired"
		case r.IdleTTL > 0 && e.idleFor(r.ID, now) > r.IdleTTL:
			reason = reasonIdleTTL
		}
		if reason == "" {
			continue
		}
		if reason == reasonIdleTTL && e.runningExecs(r) > 0 {
			e.touch(r.ID) // a command still runs: not idle
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if reason == reasonIdleTTL && r.IdleAction == IdlePause && allowed(r.State, StatePausing) {
			e.log.Info("pausing idle sandbox", "sandbox", r.ID)
			if _, err := e.pauseOne(ctx, r.ID); err != nil && !errdefs.Is(err, errdefs.ErrNotFound) {
				// It stays running; try again after another idle TTL
				// (its hard TTL still bounds it).
				e.log.Warn("pause idle sandbox", "sandbox", r.ID, "err", err)
				e.touch(r.ID)
			}
			cancel()
			continue
		}
		e.log.Info("reaping sandbox", "sandbox", r.ID, "reason", reason)
		if err := e.deleteOne(ctx, r.ID, EventTTLExpired, reason); err != nil && !errdefs.Is(err, errdefs.ErrNotFound) {
			e.log.Warn("reap sandbox", "sandbox", r.ID, "err", err)
		}
		cancel()
	}
}

// The reasons of the TTLs' ends.
const (
	reasonIdleTTL   = "idle TTL expired"
	reasonPausedTTL = "paused TTL expired"
)

// runningExecs asks the backend how many commands run in a sandbox, or,
// for a rollout's member, in any member of its rollout (a rollout is idle
// as a whole).
func (e *Edge) runningExecs(r *Record) int {
	if sibs := e.ro.siblings(r.ID); len(sibs) > 0 {
		n := 0
		for _, id := range sibs {
			if m, err := e.store.get(id); err == nil {
				n += e.runningExecsOne(m)
			}
		}
		return n
	}
	return e.runningExecsOne(r)
}

func (e *Edge) runningExecsOne(r *Record) int {
	be, err := e.backend(r.Backend)
	if err != nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := be.Status(ctx, r.ID)
	if err != nil {
		return 0
	}
	return st.RunningExecs
}

// touch records use of a sandbox (it is not idle).
func (e *Edge) touch(id string) {
	e.mu.Lock()
	e.activity[id] = time.Now()
	e.mu.Unlock()
}

// streamOpen marks an exec stream open on a sandbox; the returned func
// closes it.
func (e *Edge) streamOpen(id string) func() {
	e.mu.Lock()
	e.streams[id]++
	e.activity[id] = time.Now()
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		e.streams[id]--
		if e.streams[id] <= 0 {
			delete(e.streams, id)
		}
		e.activity[id] = time.Now()
		e.mu.Unlock()
	}
}

// idleFor is how long sandbox id has been idle at now; a rollout's member
// is as idle as the least idle member of its rollout.
func (e *Edge) idleFor(id string, now time.Time) time.Duration {
	ids := e.ro.siblings(id)
	if ids == nil {
		ids = []string{id}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	idle := time.Duration(-1)
	for _, id := range ids {
		d := e.idleForLocked(id, now)
		if idle < 0 || d < idle {
			idle = d
		}
	}
	return idle
}

// idleForLocked is idleFor of one sandbox; guarded by mu.
func (e *Edge) idleForLocked(id string, now time.Time) time.Duration {
	if e.streams[id] > 0 {
		return 0
	}
	last, ok := e.activity[id]
	if !ok {
		e.activity[id] = now
		return 0
	}
	return now.Sub(last)
}

// newID makes a sandbox ID on this node.
func (e *Edge) newID() string { return sandbox.NewID(e.cfg.Node) }

// NodeOfID returns the node that owns a sandbox ID (sandbox.NodeOfID).
func NodeOfID(id string) (string, bool) { return sandbox.NodeOfID(id) }

// Caller is who makes a request, as the control plane authenticated it.
type Caller = caller.Caller

// sees reports whether c may see and act on r: a key sees its own
// project's sandboxes, an admin key every project's but the platform's own
// (internal/project), which only their service's key reaches; a rollout
// member's own key sees its rollout's members only.
func sees(c Caller, r *Record) bool {
	if c.Rollout != "" && r.Rollout != c.Rollout {
		return false
	}
	return r.Project == c.Project || c.Admin && !project.Reserved(r.Project)
}

// matches reports whether labels has every k=v of sel.
func matches(labels, sel map[string]string) bool {
	for k, v := range sel {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// visible returns the records caller may see that match sel, oldest first.
func (e *Edge) visible(caller Caller, sel map[string]string) ([]*Record, error) {
	recs, err := e.store.list()
	if err != nil {
		return nil, err
	}
	out := recs[:0]
	for _, r := range recs {
		if sees(caller, r) && matches(r.Labels, sel) && states[r.State].visible {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// lookup returns a record the caller may see; others are NotFound.
func (e *Edge) lookup(caller Caller, id string) (*Record, error) {
	r, err := e.store.get(id)
	if err != nil {
		return nil, err
	}
	if !sees(caller, r) || !states[r.State].visible {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s not found: it was deleted or never existed (list sandboxes with `dsec ps`)", id)
	}
	return r, nil
}

func (e *Edge) backend(name string) (sandbox.Backend, error) {
	b, ok := e.cfg.Backends[name]
	if !ok {
		names := make([]string, 0, len(e.cfg.Backends))
		for n := range maps.Keys(e.cfg.Backends) {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "backend %.80q is not available on node %s (available: %s)", name, e.cfg.Node, strings.Join(names, ", "))
	}
	return b, nil
}

func memTotal() int64     { return meminfo("MemTotal:") }
func memAvailable() int64 { return meminfo("MemAvailable:") }

func meminfo(key string) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kb)
			return kb << 10
		}
	}
	return 0
}

// BackendInfo describes one backend of the node.
type BackendInfo struct {
	Name         string
	Tier         sandbox.Tier
	Capabilities []sandbox.Capability
	// Default: a create that names no backend gets this one.
	Default bool
}

// Backends describes the node's backends, by name.
func (e *Edge) Backends() []BackendInfo {
	var out []BackendInfo
	for _, name := range slices.Sorted(maps.Keys(e.cfg.Backends)) {
		be := e.cfg.Backends[name]
		out = append(out, BackendInfo{
			Name: name, Tier: be.Describe().Tier, Capabilities: sandbox.Capabilities(be),
			Default: name == e.cfg.DefaultBackend,
		})
	}
	return out
}
