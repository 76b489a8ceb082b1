package cluster

// Caches of what every API call reads (API keys, project limits, images)
// and the watch that keeps them current.
//
// The rule that bounds staleness: an entry read at readAt may be used at
// now only while
//
//	now - max(readAt, confirmed) < RevocationWindow
//
// where confirmed is the latest time at which the watch proved it had
// applied every change made before it (it forgets an entry as soon as its
// etcd key changes). A change made at T is therefore seen by every Store
// by T + RevocationWindow: an entry used later was either read after T, or
// was confirmed after T, when the watch had already forgotten it. Without
// a running watch, confirmed never advances and entries live for
// RevocationWindow, a short TTL; with it, for the cache's TTL.
//
// The watch proves it is current with etcd progress requests, one at a
// time: etcd answers one only once the stream delivered every event up to
// its current revision, so the answer confirms the time the request was
// sent.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// RevocationWindow bounds how long a Store keeps using a cached API key,
// project or image after it changed in etcd (through any Store).
const RevocationWindow = 800 * time.Millisecond

// progressInterval is how often the watch asks etcd to confirm it is
// current; progressTimeout how long it waits for the answer before it
// starts over.
const (
	progressInterval = 200 * time.Millisecond
	progressTimeout  = 5 * time.Second
)

// freshness is what the watch has confirmed.
type freshness struct {
	confirmed atomic.Int64 // UnixNano of the Store clock; 0: nothing confirmed
}

func (f *freshness) confirm(t time.Time) { f.confirmed.Store(t.UnixNano()) }
func (f *freshness) reset()              { f.confirmed.Store(0) }

// fresh reports whether an entry read at readAt may still be used at now.
func (f *freshness) fresh(readAt, now time.Time) bool {
	last := readAt.UnixNano()
	if c := f.confirmed.Load(); c > last {
		last = c
	}
	return now.UnixNano()-last < int64(RevocationWindow)
}

// cache remembers values read from etcd, by name, for at most ttl.
type cache[V any] struct {
	ttl   time.Duration // set once by NewStore
	fresh *freshness    // the Store's; set once by NewStore

	mu      sync.Mutex
	entries map[string]cached[V] // guarded by mu
	gen     uint64               // counts forgets; guarded by mu
}

type cached[V any] struct {
	v      V
	readAt time.Time
}

// maxCached bounds each cache; past it, expired entries go, then any.
const maxCached = 4096

func (c *cache[V]) usable(e cached[V], now time.Time) bool {
	return now.Sub(e.readAt) < c.ttl && c.fresh.fresh(e.readAt, now)
}

func (c *cache[V]) get(name string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[name]
	if !ok || !c.usable(e, now) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// generation returns a value to pass to put for what is read from etcd next.
func (c *cache[V]) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// put caches v, read at readAt, unless something was forgotten since gen
// was taken: what was read may predate that change (a read racing a delete
// must not bring the deleted value back).
func (c *cache[V]) put(name string, v V, readAt time.Time, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return
	}
	if c.entries == nil {
		c.entries = make(map[string]cached[V])
	}
	if len(c.entries) >= maxCached {
		for k, old := range c.entries {
			if !c.usable(old, readAt) {
				delete(c.entries, k)
			}
		}
		for k := range c.entries {
			if len(c.entries) < maxCached {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[name] = cached[V]{v: v, readAt: readAt}
}

func (c *cache[V]) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, name)
	c.gen++
}

func (c *cache[V]) forgetAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.entries)
	c.gen++
}

// forgetKey forgets what the cached etcd key holds.
func (s *Store) forgetKey(key string) {
	switch {
	case strings.HasPrefix(key, s.keysPrefix()):
		s.keys.forget(key[len(s.keysPrefix()):])
	case strings.HasPrefix(key, s.projectsPrefix()):
		s.projects.forget(key[len(s.projectsPrefix()):])
	case strings.HasPrefix(key, s.imagesPrefix()):
		s.images.forget(key[len(s.imagesPrefix()):])
	}
}

func (s *Store) forgetAll() {
	s.keys.forgetAll()
	s.projects.forgetAll()
	s.images.forgetAll()
}

// CacheWatch keeps a Store's caches current (see cache.go): with one
// running, a Store uses cached API keys, projects and images for the
// cache TTL instead of RevocationWindow, and still sees every change
// within RevocationWindow. Close stops it.
type CacheWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// WatchCaches starts a CacheWatch over s. A broken watch (etcd restarted,
// compacted, unreachable) is started again after a second; meanwhile
// entries live for RevocationWindow.
func (s *Store) WatchCaches() *CacheWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &CacheWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			err := s.watchCaches(ctx)
			s.fresh.reset()
			if ctx.Err() != nil {
				return
			}
			s.lg.Warn("cluster state watch stopped; cached API keys and projects are re-read every "+RevocationWindow.String()+" until it is back", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return w
}

// Close stops the watch and waits for it; the Store's entries then live
// for RevocationWindow. Idempotent.
func (w *CacheWatch) Close() {
	w.cancel()
	<-w.done
}

// watchCaches runs one watch until it breaks or ctx is done.
func (s *Store) watchCaches(ctx context.Context) error {
	// A stream of its own (streams are keyed by the context's metadata):
	// progress answers on it are answers to this loop's requests.
	ctx = metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), "dsec-watch", "caches")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The client's own watcher: an in-process client (Embedded) has no
	// connection to make another from. Cancelling ctx ends this watch.
	wc := s.c.Watcher
	ch := wc.Watch(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	select {
	case resp, ok := <-ch:
		if !ok {
			return errors.New("watch closed")
		}
		if err := resp.Err(); err != nil {
			return err
		}
	case <-time.After(progressTimeout):
		return errdefs.Newf(errdefs.ErrUnavailable, "watch not created within %s", progressTimeout)
	case <-ctx.Done():
		return nil
	}
	// What was cached before the watch started may have changed before
	// it did, unseen: read it again.
	s.forgetAll()
	tick := time.NewTicker(progressInterval)
	defer tick.Stop()
	var pending time.Time // when the unanswered progress request was sent
	for {
		select {
		case <-ctx.Done():
			return nil
		case resp, ok := <-ch:
			if !ok {
				return errors.New("watch closed")
			}
			if err := resp.Err(); err != nil {
				return err
			}
			for _, ev := range resp.Events {
				s.forgetKey(string(ev.Kv.Key))
			}
			if resp.IsProgressNotify() && !pending.IsZero() {
				s.fresh.confirm(pending)
				pending = time.Time{}
			}
		case <-tick.C:
			now := s.now()
			if !pending.IsZero() {
				if now.Sub(pending) > progressTimeout {
					return errdefs.Newf(errdefs.ErrUnavailable, "etcd did not confirm the watch within %s", progressTimeout)
				}
				continue
			}
			pending = now
			if err := wc.RequestProgress(ctx); err != nil {
				return err
			}
		}
	}
}
