package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// stamps is a TCP server on the host that records, for each connection,
// the first line it sent (a sandbox's marker) and when it arrived.
type stamps struct {
	port int
	mu   sync.Mutex
	// guarded by mu
	seen []stamp
}

type stamp struct {
	marker string
	at     time.Time
}

func stampServer(t *testing.T, addr string) *stamps {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s := &stamps{port: ln.Addr().(*net.TCPAddr).Port}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				s.mu.Lock()
				s.seen = append(s.seen, stamp{strings.TrimSpace(line), time.Now()})
				s.mu.Unlock()
			}()
		}
	}()
	return s
}

// first returns when marker's first connection after t arrived.
func (s *stamps) first(marker string, after time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.seen {
		if st.marker == marker && st.at.After(after) {
			return st.at, true
		}
	}
	return time.Time{}, false
}

// TestNetworkFlipTiming is issue 14's "updates flip access both ways
// within 100 ms, by ID and by label", measured end to end: each sandbox
// runs a loop that connects to a host every 10 ms and sends its ID; the
// test changes the policy through the API and times, from the moment it
// made the call, the first connection that arrives (allowed) or the last
// (denied). Access granted is in effect by the time UpdateNetwork
// returns, access revoked likewise: nothing arrives from a sandbox once
// its revocation has returned. Each flip is timed three times and the
// median is held to 100 ms, so one stall of a loaded machine does not
// decide; every figure is logged.
func TestNetworkFlipTiming(t *testing.T) {
	hostAddr := hostIPv4(t)
	srv := stampServer(t, hostAddr)
	conf := filepath.Join(t.TempDir(), "network.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("version = 1\n[services.flip]\ncidrs = [%q]\nports = [%d]\n", hostAddr+"/32", srv.port)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newPlatform(t, func(p *platform) { p.Extra = append(p.Extra, "--network-config", conf) })
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	const base, flip = "allow=pypi", "allow=pypi,flip"
	labels := map[string]string{"flip-test": "yes"}
	var sbs []*dsec.Sandbox
	for range 2 {
		sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Labels: labels, Network: dsec.NetworkFlag(base)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Delete(ctx) })
		loop := fmt.Sprintf("while true; do echo %s | nc -w 1 %s %d >/dev/null 2>&1; usleep 10000; done", sb.ID, hostAddr, srv.port)
		if _, err := sb.ExecDetached(ctx, dsec.ExecRequest{Argv: []string{"sh", "-c", loop}}); err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	time.Sleep(200 * time.Millisecond)
	for _, sb := range sbs {
		if at, ok := srv.first(sb.ID, time.Time{}); ok {
			t.Fatalf("sandbox %s reached the host at %v under %q, which does not allow it", sb.ID, at, base)
		}
	}

	// update changes the policy of the sandboxes in set, by ID when there
	// is one, else by label.
	update := func(set []*dsec.Sandbox, policy string) {
		t.Helper()
		if len(set) == 1 {
			if _, err := set[0].UpdateNetwork(ctx, dsec.NetworkFlag(policy), false); err != nil {
				t.Fatal(err)
			}
			return
		}
		res, err := c.UpdateNetwork(ctx, labels, dsec.NetworkFlag(policy), false)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != len(set) {
			t.Fatalf("UpdateNetwork by label changed %d sandboxes, want %d: %+v", len(res), len(set), res)
		}
		for _, r := range res {
			if r.Err != nil {
				t.Fatalf("UpdateNetwork by label: %s: %v", r.ID, r.Err)
			}
		}
	}
	for _, by := range []struct {
		name string
		set  []*dsec.Sandbox
	}{{"by ID", sbs[:1]}, {"by label", sbs}} {
		t.Run(by.name, func(t *testing.T) {
			var granted, revoked []time.Duration
			for round := range 3 {
				// Grant: the first connection of each sandbox after the
				// call was made.
				t0 := time.Now()
				update(by.set, flip)
				returned := time.Since(t0)
				worst := time.Duration(0)
				for _, sb := range by.set {
					var at time.Time
					waitFor(t, "a connection from "+sb.ID+" once allowed", func() bool {
						var ok bool
						at, ok = srv.first(sb.ID, t0)
						return ok
					})
					worst = max(worst, at.Sub(t0))
				}
				granted = append(granted, worst)
				t.Logf("round %d: grant returned in %v; first connection of every sandbox %v after the call", round, returned.Round(time.Microsecond), worst.Round(time.Microsecond))

				// Revoke: nothing may arrive once the call returned (a
				// few ms of slack for a marker written before the cut
				// and read by the server's goroutine after it).
				t0 = time.Now()
				update(by.set, base)
				done := time.Now()
				revoked = append(revoked, done.Sub(t0))
				time.Sleep(300 * time.Millisecond)
				for _, sb := range by.set {
					if at, ok := srv.first(sb.ID, done.Add(20*time.Millisecond)); ok {
						t.Errorf("round %d: sandbox %s reached the host %v after its access was revoked", round, sb.ID, at.Sub(done))
					}
				}
				t.Logf("round %d: revoke returned in %v", round, (done.Sub(t0)).Round(time.Microsecond))
			}
			for _, f := range []struct {
				what string
				d    []time.Duration
			}{{"granting", granted}, {"revoking", revoked}} {
				slices.Sort(f.d)
				if med := f.d[len(f.d)/2]; med > 100*time.Millisecond {
					t.Errorf("%s access %s took %v at the median of %v, want within 100 ms", f.what, by.name, med, f.d)
				}
			}
		})
	}
	// The denied attempts were seen and logged.
	info, err := sbs[1].Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Denied == 0 {
		t.Errorf("sandbox %s's network info records no denied connection: %+v", sbs[1].ID, info)
	}
}
