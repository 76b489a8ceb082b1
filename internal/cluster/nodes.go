package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazyregexp"
)

// Node is a machine running an edge, as the control plane sees it.
type Node struct {
	// Name identifies the node in the cluster: lowercase DNS name
	// (letters, digits, '-', labels joined by '.'), at most 253 characters.
	Name string
	// Addr is the URL of its edge API: http://, https://, or unix:///path
	// for the edge of `dsec up` on the same machine.
	Addr string
	// Backends lists the sandbox backends it runs ("container", "microvm", …).
	Backends []string
	// CPUs and MemoryBytes are its capacity.
	CPUs        float64
	MemoryBytes int64
	// Labels are free key=value attributes for placement.
	Labels map[string]string
	// Version is the dsec version its edge runs.
	Version string
	// StartedAt is when its edge started; RegisterNode sets it when zero.
	StartedAt time.Time
}

// nodeRecord is a Node as stored.
type nodeRecord struct {
	Version     int               `json:"version"`
	Name        string            `json:"name"`
	Addr        string            `json:"addr"`
	Backends    []string          `json:"backends,omitempty"`
	CPUs        float64           `json:"cpus"`
	MemoryBytes int64             `json:"memory_bytes"`
	Labels      map[string]string `json:"labels,omitempty"`
	DsecVersion string            `json:"dsec_version,omitempty"`
	StartedAt   time.Time         `json:"started_at"`
}

func nodeToRecord(n Node) nodeRecord {
	return nodeRecord{
		Version: schemaVersion, Name: n.Name, Addr: n.Addr, Backends: n.Backends,
		CPUs: n.CPUs, MemoryBytes: n.MemoryBytes, Labels: n.Labels,
		DsecVersion: n.Version, StartedAt: n.StartedAt.UTC(),
	}
}

func (r nodeRecord) node() Node {
	return Node{
		Name: r.Name, Addr: r.Addr, Backends: r.Backends, CPUs: r.CPUs,
		MemoryBytes: r.MemoryBytes, Labels: r.Labels, Version: r.DsecVersion,
		StartedAt: r.StartedAt,
	}
}

var nodeNameRE = lazyregexp.New(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

func validateNodeName(name string) error {
	if len(name) > 253 || !nodeNameRE.MatchString(name) {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"invalid node name %q: use a lowercase DNS name (letters, digits and '-', labels joined by '.')", name)
	}
	return nil
}

func validateNode(n Node) error {
	if err := validateNodeName(n.Name); err != nil {
		return err
	}
	u, err := url.Parse(n.Addr)
	tcp := err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
	unix := err == nil && u.Scheme == "unix" && u.Host == "" && strings.HasPrefix(u.Path, "/")
	if !tcp && !unix {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"node %s: edge address %q is not an http://, https:// or unix:///path URL", n.Name, n.Addr)
	}
	for _, b := range n.Backends {
		if b == "" {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "node %s: empty backend name", n.Name)
		}
	}
	if n.CPUs < 0 || math.IsNaN(n.CPUs) || math.IsInf(n.CPUs, 0) || n.MemoryBytes < 0 {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"node %s: capacity must be non-negative (cpus %v, memory %d bytes)", n.Name, n.CPUs, n.MemoryBytes)
	}
	for k := range n.Labels {
		if k == "" {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "node %s: label with an empty key", n.Name)
		}
	}
	return nil
}

// Registration keeps a node listed while it is open: it owns the etcd lease
// the node's key is attached to and a goroutine that renews it. If the lease
// is lost anyway (etcd unreachable for longer than the TTL), the goroutine
// registers the node again as soon as etcd answers.
type Registration struct {
	s    *Store
	node Node

	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
	// lease is written by RegisterNode before run starts and then only by
	// run; Close reads it after done is closed.
	lease clientv3.LeaseID

	closeOnce sync.Once
	closeErr  error
}

// RegisterNode lists n under a lease of the Store's NodeTTL and keeps the
// lease alive until the Registration is closed. ctx bounds only the initial
// registration. Registering a name again from the same Addr (an edge that
// restarted) replaces the old entry; a name registered from another Addr is
// AlreadyExists until that entry expires.
func (s *Store) RegisterNode(ctx context.Context, n Node) (*Registration, error) {
	if err := validateNode(n); err != nil {
		return nil, err
	}
	if n.StartedAt.IsZero() {
		n.StartedAt = s.now()
	}
	n = n.clone()
	lease, err := s.putNode(ctx, n)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	ka, err := s.c.KeepAlive(runCtx, lease)
	if err != nil {
		cancel()
		s.revoke(lease)
		return nil, storeErr("register node "+n.Name, err)
	}
	r := &Registration{s: s, node: n, cancel: cancel, done: make(chan struct{}), lease: lease}
	go r.run(runCtx, ka)
	return r, nil
}

// ttlSeconds is the lease TTL etcd is asked for.
func (s *Store) ttlSeconds() int64 {
	return max(1, int64(math.Ceil(s.nodeTTL.Seconds())))
}

// putNode grants a lease and writes n under it, unless another edge holds
// the name. On error it leaves no lease behind.
func (s *Store) putNode(ctx context.Context, n Node) (clientv3.LeaseID, error) {
	op := "register node " + n.Name
	key := s.nodeKey(n.Name)
	val := encode(nodeToRecord(n))
	grant, err := s.c.Grant(ctx, s.ttlSeconds())
	if err != nil {
		return 0, storeErr(op, err)
	}
	for range 10 {
		resp, err := s.c.Get(ctx, key)
		if err != nil {
			s.revoke(grant.ID)
			return 0, storeErr(op, err)
		}
		var modRev int64
		if len(resp.Kvs) > 0 {
			kv := resp.Kvs[0]
			modRev = kv.ModRevision
			var old nodeRecord
			if err := decode(key, kv.Value, &old); err == nil && old.Addr != n.Addr {
				s.revoke(grant.ID)
				return 0, errdefs.Newf(errdefs.ErrAlreadyExists,
					"register node %s: the name is registered by the edge at %s; give this node another name, or stop that edge (its entry expires %s after it stops)",
					n.Name, old.Addr, s.nodeTTL)
			}
		}
		txn, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, val, clientv3.WithLease(grant.ID))).
			Commit()
		if err != nil {
			s.revoke(grant.ID)
			return 0, storeErr(op, err)
		}
		if txn.Succeeded {
			return grant.ID, nil
		}
	}
	s.revoke(grant.ID)
	return 0, errdefs.Newf(errdefs.ErrUnavailable, "%s: the entry changes too fast; retry", op)
}

// revoke revokes a lease, best effort, with its own short deadline: it runs
// on cleanup paths whose context may be done.
func (s *Store) revoke(id clientv3.LeaseID) error {
	if err := s.c.Ctx().Err(); err != nil {
		// The client is closed (the process is going away); the lease
		// expires on its own.
		return fmt.Errorf("etcd client closed: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.c.Revoke(ctx, id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

// run drains the keep-alive responses; when the lease is lost while the
// registration is open, it registers the node again, backing off. It gives
// up only when the registration or the etcd client is closed.
func (r *Registration) run(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse) {
	defer close(r.done)
	for {
		for range ka {
		}
		if !r.alive(ctx) {
			return
		}
		r.s.lg.Warn("node registration lost; registering again", "node", r.node.Name)
		backoff := 250 * time.Millisecond
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			if !r.alive(ctx) {
				return
			}
			lease, err := r.s.putNode(ctx, r.node)
			if err == nil {
				r.lease = lease
				if ka, err = r.s.c.KeepAlive(ctx, lease); err == nil {
					r.s.lg.Info("node registered again", "node", r.node.Name)
					break
				}
				r.s.revoke(lease)
			}
			if !r.alive(ctx) {
				return
			}
			r.s.lg.Warn("register node again", "node", r.node.Name, "err", err, "retry_in", backoff)
			backoff = min(2*backoff, r.s.nodeTTL)
		}
	}
}

// alive reports whether run should keep the node registered.
func (r *Registration) alive(ctx context.Context) bool {
	if ctx.Err() != nil {
		return false // closed
	}
	if r.s.c.Ctx().Err() != nil {
		r.s.lg.Warn("etcd client closed; node no longer registered", "node", r.node.Name)
		return false
	}
	return true
}

// Node returns the node as registered.
func (r *Registration) Node() Node { return r.node.clone() }

// clone returns n with its own slice and map.
func (n Node) clone() Node {
	n.Backends = slices.Clone(n.Backends)
	n.Labels = maps.Clone(n.Labels)
	return n
}

// Close stops renewing the lease and revokes it, so the node disappears at
// once. It waits for the renewing goroutine and is safe to call more than
// once.
func (r *Registration) Close() error {
	r.closeOnce.Do(func() {
		r.cancel()
		<-r.done
		if err := r.s.revoke(r.lease); err != nil {
			r.closeErr = storeErr("unregister node "+r.node.Name, err)
		}
	})
	return r.closeErr
}

// GetNode returns the registered node called name, or NotFound.
func (s *Store) GetNode(ctx context.Context, name string) (Node, error) {
	if err := validateNodeName(name); err != nil {
		return Node{}, err
	}
	key := s.nodeKey(name)
	resp, err := s.c.Get(ctx, key)
	if err != nil {
		return Node{}, storeErr("get node "+name, err)
	}
	if len(resp.Kvs) == 0 {
		return Node{}, errdefs.Newf(errdefs.ErrNotFound,
			"node %s not found: it never registered, or its edge stopped (a node disappears %s after its edge stops)", name, s.nodeTTL)
	}
	var rec nodeRecord
	if err := decode(key, resp.Kvs[0].Value, &rec); err != nil {
		return Node{}, fmt.Errorf("get node %s: %w", name, err)
	}
	return rec.node(), nil
}

// ListNodes returns the registered nodes, by name.
func (s *Store) ListNodes(ctx context.Context) ([]Node, error) {
	return list(ctx, s, "list nodes", s.nodesPrefix(), func(key string, val []byte) (Node, error) {
		var rec nodeRecord
		err := decode(key, val, &rec)
		return rec.node(), err
	})
}
