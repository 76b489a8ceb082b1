// Package watcher polls the edges for health and load. It keeps no durable
// state: its view is rebuilt from the node registry (etcd) and the edges'
// own reports, so any number of control-plane replicas can run one.
package watcher

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/dsecproject/dsec/api/dsec/node/v1"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/edgeclient"
	"github.com/dsecproject/dsec/internal/placement"
)

// NodeLister lists registered nodes.
type NodeLister interface {
	ListNodes(ctx context.Context) ([]cluster.Node, error)
}

// Config configures a Watcher.
type Config struct {
	Nodes NodeLister
	Pool  *edgeclient.Pool
	// Interval between polls (default 2 s).
	Interval time.Duration
	Logger   *slog.Logger
}

// NodeState is the latest view of one node.
type NodeState struct {
	Node    cluster.Node
	Status  *nodev1.StatusResponse
	Healthy bool
	Err     string
	Seen    time.Time
}

// Watcher polls edges in the background.
type Watcher struct {
	cfg  Config
	stop chan struct{}
	wg   sync.WaitGroup

	mu sync.Mutex
	// guarded by mu
	nodes   map[string]NodeState
	applied time.Time // when the poll that made nodes started
}

// New starts a watcher; it polls once before returning.
func New(ctx context.Context, cfg Config) *Watcher {
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &Watcher{cfg: cfg, stop: make(chan struct{}), nodes: map[string]NodeState{}}
	w.Poll(ctx)
	w.wg.Add(1)
	go w.loop()
	return w
}

// Close stops polling.
func (w *Watcher) Close() {
	close(w.stop)
	w.wg.Wait()
}

func (w *Watcher) loop() {
	defer w.wg.Done()
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), w.cfg.Interval)
		w.Poll(ctx)
		cancel()
	}
}

// Poll refreshes the view of every registered node now. Polls may overlap
// (the loop's and a refused create's): the view is the one of the poll
// that started last, never an older one that ended later.
func (w *Watcher) Poll(ctx context.Context) {
	start := time.Now()
	nodes, err := w.cfg.Nodes.ListNodes(ctx)
	if err != nil {
		w.cfg.Logger.Warn("list nodes", "err", err)
		return
	}
	var mu sync.Mutex
	next := map[string]NodeState{}
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := NodeState{Node: n, Seen: time.Now()}
			conn, err := w.cfg.Pool.Get(n.Name, n.Addr)
			if err == nil {
				var resp *connect.Response[nodev1.StatusResponse]
				resp, err = conn.Node.Status(ctx, connect.NewRequest(&nodev1.StatusRequest{}))
				if err == nil {
					st.Status, st.Healthy = resp.Msg, true
				}
			}
			if err != nil {
				st.Err = err.Error()
			}
			mu.Lock()
			next[n.Name] = st
			mu.Unlock()
		}()
	}
	wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if start.Before(w.applied) {
		return
	}
	w.nodes, w.applied = next, start
}

// Nodes returns the latest view, sorted by name.
func (w *Watcher) Nodes() []NodeState {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]NodeState, 0, len(w.nodes))
	for _, n := range w.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node.Name < out[j].Node.Name })
	return out
}

// Node returns one node's latest view.
func (w *Watcher) Node(name string) (NodeState, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, ok := w.nodes[name]
	return n, ok
}

// Placement converts the view for the placer.
func (w *Watcher) Placement() []placement.Node {
	states := w.Nodes()
	out := make([]placement.Node, 0, len(states))
	for _, s := range states {
		pn := placement.Node{Name: s.Node.Name, Backends: s.Node.Backends, Healthy: s.Healthy}
		if s.Status != nil {
			// Seen is taken before the status request: the report holds
			// every sandbox whose create returned before it.
			pn.ReportedAt = s.Seen
			pn.Backends = s.Status.Backends
			pn.MemoryAdmissible = s.Status.MemoryAdmissibleBytes
			pn.MemoryCommitted = s.Status.MemoryCommittedBytes
			pn.MemoryBytes = s.Status.MemoryBytes
			pn.PidsMax, pn.DiskMaxBytes = s.Status.PidsMax, s.Status.DiskMaxBytes
			pn.Sandboxes = s.Status.Sandboxes
		}
		out = append(out, pn)
	}
	return out
}
