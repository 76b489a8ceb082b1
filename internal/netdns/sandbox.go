package netdns

import (
	"net/netip"
	"sync"
	"time"
)

// sandboxState is what the resolver keeps of one sandbox.
type sandboxState struct {
	mu sync.Mutex
	// guarded by mu
	tokens   float64   // token bucket
	last     time.Time // when tokens was last refilled
	pending  int       // queries in progress
	tcpConns int       // open TCP connections
	// resolved maps an address to the names that resolved to it, each
	// with the time its record expires; nresolved counts the records.
	resolved  map[netip.Addr]map[string]time.Time
	nresolved int
}

// admit takes a token from the bucket, refilled at rate per second up to
// burst; it reports false when the bucket is empty.
func (s *sandboxState) admit(now time.Time, rate float64, burst int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := now.Sub(s.last); d > 0 {
		s.tokens = min(s.tokens+d.Seconds()*rate, float64(burst))
		s.last = now
	}
	if s.tokens < 1 {
		return false
	}
	s.tokens--
	return true
}

// enter counts a query in progress unless max are.
func (s *sandboxState) enter(max int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending >= max {
		return false
	}
	s.pending++
	return true
}

func (s *sandboxState) leave() {
	s.mu.Lock()
	s.pending--
	s.mu.Unlock()
}

// openTCP counts a TCP connection unless max are open.
func (s *sandboxState) openTCP(max int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tcpConns >= max {
		return false
	}
	s.tcpConns++
	return true
}

func (s *sandboxState) closeTCP() {
	s.mu.Lock()
	s.tcpConns--
	s.mu.Unlock()
}

// record notes that name resolved to addrs until expires, keeping at most
// max records: expired records go first, then those that expire first.
func (s *sandboxState) record(name string, addrs []netip.Addr, expires, now time.Time, max int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range addrs {
		names := s.resolved[a]
		if old, ok := names[name]; ok {
			if expires.After(old) {
				names[name] = expires
			}
			continue
		}
		if s.nresolved >= max {
			s.sweep(now)
		}
		for s.nresolved >= max {
			s.evictFirst()
		}
		if names == nil {
			names = make(map[string]time.Time)
			s.resolved[a] = names
		}
		names[name] = expires
		s.nresolved++
	}
}

// sweep drops the expired records.
func (s *sandboxState) sweep(now time.Time) {
	for a, names := range s.resolved {
		for n, exp := range names {
			if !now.Before(exp) {
				delete(names, n)
				s.nresolved--
			}
		}
		if len(names) == 0 {
			delete(s.resolved, a)
		}
	}
}

// evictFirst drops the record that expires first.
func (s *sandboxState) evictFirst() {
	var (
		ea    netip.Addr
		en    string
		first time.Time
	)
	for a, names := range s.resolved {
		for n, exp := range names {
			if en == "" || exp.Before(first) {
				ea, en, first = a, n, exp
			}
		}
	}
	if en == "" {
		s.nresolved = 0
		return
	}
	delete(s.resolved[ea], en)
	if len(s.resolved[ea]) == 0 {
		delete(s.resolved, ea)
	}
	s.nresolved--
}

// resolvedNames returns the names whose records for a have not expired.
func (s *sandboxState) resolvedNames(a netip.Addr, now time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n, exp := range s.resolved[a] {
		if now.Before(exp) {
			out = append(out, n)
		}
	}
	return out
}
