package netdns

import (
	"container/list"
	"net/netip"
	"sync"
	"time"
)

// cacheKey is a question: the canonical name and the type.
type cacheKey struct {
	name  string
	qtype uint16
}

// A result is the resolution of one question: an rcode (NOERROR, NXDOMAIN
// or SERVFAIL), the final addresses (none for an empty answer) and when it
// expires.
type result struct {
	rcode   int
	addrs   []netip.Addr
	expires time.Time
}

// cache is a bounded LRU of results.
type cache struct {
	max int

	mu sync.Mutex
	// guarded by mu
	entries map[cacheKey]*list.Element // of *cacheEntry
	lru     *list.List                 // front: most recently used
}

type cacheEntry struct {
	key cacheKey
	res result
}

func newCache(max int) *cache {
	return &cache{max: max, entries: make(map[cacheKey]*list.Element), lru: list.New()}
}

// get returns the unexpired result of k.
func (c *cache) get(k cacheKey, now time.Time) (result, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if !ok {
		return result{}, false
	}
	ce := e.Value.(*cacheEntry)
	if !now.Before(ce.res.expires) {
		c.lru.Remove(e)
		delete(c.entries, k)
		return result{}, false
	}
	c.lru.MoveToFront(e)
	return ce.res, true
}

// put stores res under k, evicting the least recently used entry when full.
func (c *cache) put(k cacheKey, res result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[k]; ok {
		e.Value.(*cacheEntry).res = res
		c.lru.MoveToFront(e)
		return
	}
	for c.lru.Len() >= c.max {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.entries, old.Value.(*cacheEntry).key)
	}
	c.entries[k] = c.lru.PushFront(&cacheEntry{key: k, res: res})
}

// len returns the number of entries, expired ones included.
func (c *cache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
