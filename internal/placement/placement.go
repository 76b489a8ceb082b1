// Package placement chooses the node for a new sandbox: it filters the
// nodes that can run the request (backend, memory headroom), then picks the
// least loaded of k random candidates (the power of k choices), counting its
// own recent placements so that a burst does not pile onto the node that
// looked emptiest at the last poll. A recent placement counts only until a
// report of the node taken after it (which already holds the sandbox), so
// that a burst is not counted twice and a node with room does not look
// full; a recent placement deleted before such a report stops counting at
// once (Gone). It returns a full order so that the caller can try the next
// node when an edge refuses.
package placement

import (
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Node is what placement knows of one node.
type Node struct {
	Name     string
	Backends []string
	// MemoryAdmissible is what the node admits in all; MemoryCommitted is
	// what its sandboxes hold.
	MemoryAdmissible int64
	MemoryCommitted  int64
	Sandboxes        int64
	Healthy          bool
	// MemoryBytes is the node's memory for sandboxes, PidsMax and
	// DiskMaxBytes the most pids and writable disk it can ever give one
	// sandbox: no sandbox can have more (0: unknown).
	MemoryBytes, PidsMax, DiskMaxBytes int64
	// ReportedAt is when the load above was asked for: the report holds
	// every sandbox placed before it. Zero if unknown (then a placement
	// counts for the whole RecentWindow).
	ReportedAt time.Time
}

// Request is what a new sandbox needs. Pids and DiskBytes are 0 when the
// request leaves them to the node's defaults.
type Request struct {
	Backend     string
	MemoryBytes int64
	Pids        int64
	DiskBytes   int64
}

// Config configures a Placer; the zero value works.
type Config struct {
	// K is how many random candidates are compared (default 2).
	K int
	// RecentWindow is the longest a placement counts against its node when
	// no report taken after it arrives (default 5 s).
	RecentWindow time.Duration
}

// Placer orders nodes for requests. It is safe for concurrent use.
type Placer struct {
	k      int
	window time.Duration

	mu sync.Mutex
	// guarded by mu
	recent map[string][]placed
}

type placed struct {
	at  time.Time
	id  string
	mem int64
}

// New returns a Placer.
func New(cfg Config) *Placer {
	if cfg.K <= 0 {
		cfg.K = 2
	}
	if cfg.RecentWindow <= 0 {
		cfg.RecentWindow = 5 * time.Second
	}
	return &Placer{k: cfg.K, window: cfg.RecentWindow, recent: map[string][]placed{}}
}

// Order returns the names of the nodes that can take req, best first.
func (p *Placer) Order(nodes []Node, req Request) []string {
	now := time.Now()
	p.mu.Lock()
	type cand struct {
		name string
		load float64
	}
	var cands []cand
	for _, n := range nodes {
		if !n.Healthy || !slices.Contains(n.Backends, req.Backend) {
			continue
		}
		if !everFits(n, req) {
			continue // more than the node ever gives one sandbox
		}
		extra := p.recentMem(n.Name, n.ReportedAt, now)
		free := n.MemoryAdmissible - n.MemoryCommitted - extra
		if free < req.MemoryBytes {
			continue
		}
		load := 1.0
		if n.MemoryAdmissible > 0 {
			load = float64(n.MemoryCommitted+extra) / float64(n.MemoryAdmissible)
		}
		cands = append(cands, cand{n.Name, load})
	}
	p.mu.Unlock()
	order := make([]string, 0, len(cands))
	for len(cands) > 0 {
		best := -1
		for range min(p.k, len(cands)) {
			i := rand.IntN(len(cands))
			if best < 0 || cands[i].load < cands[best].load {
				best = i
			}
		}
		order = append(order, cands[best].name)
		cands = slices.Delete(cands, best, best+1)
	}
	return order
}

// Free is the memory node can still take as the placer sees it: what the
// node admits less what its report holds and the placements since.
func (p *Placer) Free(n Node) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return n.MemoryAdmissible - n.MemoryCommitted - p.recentMem(n.Name, n.ReportedAt, time.Now())
}

// Placed records that sandbox id, of mem bytes, went to node.
func (p *Placer) Placed(node, id string, mem int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.recent[node] = append(p.recent[node], placed{at: time.Now(), id: id, mem: mem})
}

// Gone records that sandboxes were deleted: a recent placement of one no
// longer counts (a sandbox created and deleted between two reports of its
// node, as a run_code call's is, is in neither). A sandbox the last report
// holds still counts until the next one.
func (p *Placer) Gone(node string, ids ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs := p.recent[node]
	if len(rs) == 0 {
		return
	}
	gone := make(map[string]bool, len(ids))
	for _, id := range ids {
		gone[id] = true
	}
	rs = slices.DeleteFunc(rs, func(r placed) bool { return gone[r.id] })
	if len(rs) == 0 {
		delete(p.recent, node)
		return
	}
	p.recent[node] = rs
}

// recentMem sums the memory of the placements on node that its report
// taken at reported does not hold yet (made after it) and that are within
// the window; guarded by mu. Placements are in time order.
func (p *Placer) recentMem(node string, reported, now time.Time) int64 {
	rs := p.recent[node]
	i := 0
	for i < len(rs) && (now.Sub(rs[i].at) > p.window || !rs[i].at.After(reported)) {
		i++
	}
	rs = rs[i:]
	if len(rs) == 0 {
		delete(p.recent, node)
		return 0
	}
	p.recent[node] = rs
	var sum int64
	for _, r := range rs {
		sum += r.mem
	}
	return sum
}

// Pinned returns the one node a keyed request goes to: the healthy node
// with the backend that ranks first for key by rendezvous hashing, so that
// every control-plane replica picks the same node for the same key while
// the node set is unchanged.
func Pinned(nodes []Node, backend, key string) []string {
	best, bestScore := "", uint64(0)
	for _, n := range nodes {
		if !n.Healthy || !slices.Contains(n.Backends, backend) {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(key))
		h.Write([]byte{0})
		h.Write([]byte(n.Name))
		if score := h.Sum64(); best == "" || score > bestScore {
			best, bestScore = n.Name, score
		}
	}
	if best == "" {
		return nil
	}
	return []string{best}
}
