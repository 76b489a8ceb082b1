package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// leakCount is how many networked sandboxes TestNetworkLeak makes:
// DSEC_NET_LEAK_N, or 200 (CI; `make bench-net-leak` runs 1,000).
func leakCount(t *testing.T) int {
	t.Helper()
	s := os.Getenv("DSEC_NET_LEAK_N")
	if s == "" {
		return 200
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("DSEC_NET_LEAK_N=%q: want a positive count", s)
	}
	return n
}

// deleters is how many deletes TestNetworkLeak runs at once.
const deleters = 32

// netFootprint is what the node holds for the sandboxes' network, as a
// list of lines to compare before and after.
type netFootprint struct {
	hostLinks   []string           // links of the host's namespace
	routerLinks []string           // links of the router namespace but lo
	routerAddrs []string           // addresses in the router namespace
	nft         []string           // chains with their rule counts, sets with their element counts
	nsMounts    []string           // nsfs mounts of the keeper and of this process under the state dir
	keeperFds   []string           // the keeper's descriptors by kind, but its API's connections and pipes
	apiConns    int                // the keeper's unix sockets: its API's connections (the edge keeps some open)
	pipes       int                // the keeper's pipes: Go keeps a pool of them for splice, freed by the GC
	node        keeper.NodeNetwork // the keeper's proxy and resolver state
}

// keeperFds lists the keeper's descriptors by what they are (sockets by
// kind, files by path), but its unix sockets (the API's listener and
// connections, which the edge keeps open as it likes) and its pipes (the
// proxy's splices take them from Go's pool, which the GC empties), which
// it counts.
func keeperFds(t *testing.T, pid int) (fds []string, unix, pipes int) {
	t.Helper()
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	unixInodes := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "net", "unix")); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if f := strings.Fields(line); len(f) >= 7 {
				unixInodes[f[6]] = true
			}
		}
	}
	ents, err := os.ReadDir(filepath.Join(dir, "fd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, "fd", e.Name()))
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(target, "socket:["); ok && unixInodes[strings.TrimSuffix(ino, "]")] {
			unix++
			continue
		}
		if strings.HasPrefix(target, "pipe:[") {
			pipes++
			continue
		}
		if strings.HasPrefix(target, "socket:[") {
			target = "socket (not unix)"
		}
		fds = append(fds, target)
	}
	slices.Sort(fds)
	return fds, unix, pipes
}

func footprintOf(t *testing.T, p *platform, kc *keeper.Client, keeperPid int) netFootprint {
	t.Helper()
	var f netFootprint
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		f.hostLinks = append(f.hostLinks, l.Attrs().Name)
	}
	slices.Sort(f.hostLinks)
	f.routerLinks = routerLinks(t, p, keeperPid)
	slices.Sort(f.routerLinks)
	path := filepath.Join("/proc", strconv.Itoa(keeperPid), "root", keeper.Layout{StateDir: p.StateDir}.NetworkDir(), "router")
	if ns, err := vnetns.GetFromPath(path); err == nil {
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			t.Fatal(err)
		}
		as, err := h.AddrList(nil, netlink.FAMILY_ALL)
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			f.routerAddrs = append(f.routerAddrs, a.IPNet.String())
		}
		slices.Sort(f.routerAddrs)
		c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
		if err != nil {
			t.Fatal(err)
		}
		chains, err := c.ListChains()
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range chains {
			rs, err := c.GetRules(ch.Table, ch)
			if err != nil {
				t.Fatal(err)
			}
			f.nft = append(f.nft, fmt.Sprintf("chain %s/%s: %d rules", ch.Table.Name, ch.Name, len(rs)))
		}
		for _, tb := range []*nftables.Table{{Name: "dsec", Family: nftables.TableFamilyINet}} {
			sets, err := c.GetSets(tb)
			if err != nil {
				continue
			}
			for _, s := range sets {
				es, err := c.GetSetElements(s)
				if err != nil {
					t.Fatal(err)
				}
				f.nft = append(f.nft, fmt.Sprintf("set %s/%s: %d elements", tb.Name, s.Name, len(es)))
			}
		}
		slices.Sort(f.nft)
		ns.Close()
	}
	for _, pid := range []string{"self", strconv.Itoa(keeperPid)} {
		mi, err := os.ReadFile("/proc/" + pid + "/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(mi), "\n") {
			fs := strings.Fields(line)
			if i := slices.Index(fs, "-"); i > 0 && i+1 < len(fs) && fs[i+1] == "nsfs" && strings.HasPrefix(fs[4], p.StateDir+"/") {
				f.nsMounts = append(f.nsMounts, pid+" "+strings.TrimPrefix(fs[4], p.StateDir))
			}
		}
	}
	f.keeperFds, f.apiConns, f.pipes = keeperFds(t, keeperPid)
	if f.node, err = kc.NodeNetwork(ctxT(t)); err != nil {
		t.Fatalf("NodeNetwork: %v", err)
	}
	return f
}

// settledFootprint is footprintOf once the keeper's descriptors stay the
// same for three reads 100 ms apart (up to 5 s): the keeper holds a pidfd
// for a moment after a command it ran has ended (Go's os.Process), and a
// footprint taken in that moment would expect it back after the deletes.
func settledFootprint(t *testing.T, p *platform, kc *keeper.Client, keeperPid int) netFootprint {
	t.Helper()
	f := footprintOf(t, p, kc, keeperPid)
	for same, deadline := 0, time.Now().Add(5*time.Second); same < 2 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		g := footprintOf(t, p, kc, keeperPid)
		if slices.Equal(g.keeperFds, f.keeperFds) {
			same++
		} else {
			same = 0
		}
		f = g
	}
	return f
}

// TestNetworkLeak is the cleanup check: many sandboxes with
// network (64 MiB each, so that admission holds them) made in one batch
// and deleted leave no link (in the router's namespace or the host's), no
// address, no firewall rule or set element, no namespace mount, no keeper
// descriptor (a proxy or resolver socket), no proxy or resolver state.
// It logs how long the creates and the deletes took.
func TestNetworkLeak(t *testing.T) {
	n := leakCount(t)
	// A host of the test's own, which an operator entry lets sandboxes
	// reach: some of them hold a connection through the proxy while they
	// are deleted.
	hostAddr := hostIPv4(t)
	echo := holdServer(t, hostAddr)
	conf := filepath.Join(t.TempDir(), "network.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("version = 1\n[services.leakhost]\ncidrs = [%q]\nports = [%d]\n", hostAddr+"/32", echo.port)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newPlatform(t, func(p *platform) {
		p.Extra = append(p.Extra, "--network-config", conf)
		// n × 64 MiB must fit what admission counts (the node may
		// count 77% to 100% of MemTotal).
		over := float64(n+64) * (64 << 20) / (0.7 * float64(memTotal(t)))
		p.Extra = append(p.Extra, "--warm-pool", "0", "--memory-overcommit", strconv.FormatFloat(max(over, 1), 'g', -1, 64))
	})
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	kc := keeper.NewClient(p.StateDir)
	defer kc.Close()
	v, err := kc.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	opts := dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Disk: 16 << 20, Network: dsec.NetworkFlag("allow=pypi,github,deny=npm"), Labels: map[string]string{"leak": "net"}}

	// One sandbox first opens the node's router, proxy and resolver,
	// which stay: the footprint is compared with theirs.
	first, err := c.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	// A lookup gives the resolver records and the firewall's meters an
	// element, so that the figures after are not trivially zero.
	if _, err := first.Shell(ctx, "nslookup pypi.org >/dev/null 2>&1; nslookup registry.npmjs.org >/dev/null 2>&1; true"); err != nil {
		t.Fatal(err)
	}
	before := settledFootprint(t, p, kc, v.Pid)
	if before.node.Links != 1 || before.node.ProxySandboxes != 1 {
		t.Fatalf("NodeNetwork with one networked sandbox = %+v, want one link and one sandbox in the proxy", before.node)
	}

	start := time.Now()
	res, err := c.BatchCreate(ctx, opts, n)
	if err != nil {
		t.Fatalf("BatchCreate(%d) = %v", n, err)
	}
	created := time.Since(start)
	var ids []string
	for _, r := range res {
		if r.Err != nil {
			t.Errorf("item %d: %v", r.Index, r.Err)
			continue
		}
		ids = append(ids, r.Sandbox.ID)
	}
	// A few more hold a connection through the proxy to the test's host.
	holdOpts := opts
	holdOpts.Network = dsec.NetworkFlag("allow=leakhost")
	const holders = 4
	hres, err := c.BatchCreate(ctx, holdOpts, holders)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range hres {
		if r.Err != nil {
			t.Fatalf("item %d: %v", r.Index, r.Err)
		}
		ids = append(ids, r.Sandbox.ID)
		if _, err := r.Sandbox.Shell(ctx, fmt.Sprintf("(sleep 1000 2>/dev/null | nc %s %d >/dev/null 2>&1 &); echo ok", hostAddr, echo.port)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the held connections", func() bool { return echo.open() == holders })
	during := footprintOf(t, p, kc, v.Pid)
	if during.node.ConnsActive != holders {
		t.Errorf("NodeNetwork with %d connections held = %+v, want them active", holders, during.node)
	}
	if during.node.Links != len(ids)+1 || during.node.ProxySandboxes != len(ids)+1 || len(during.routerLinks) != len(ids)+1 {
		t.Errorf("with %d networked sandboxes: %d router links, NodeNetwork %+v; want a link and proxy state each", len(ids)+1, len(during.routerLinks), during.node)
	}

	start = time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, deleters)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := c.Delete(ctx, id); err != nil {
				t.Errorf("Delete(%s) = %v", id, err)
			}
		}()
	}
	wg.Wait()
	deleted := time.Since(start)
	t.Logf("%d sandboxes with network: created in %v (%.0f/s), deleted in %v (%.0f/s)",
		len(ids), created, float64(len(ids))/created.Seconds(), deleted, float64(len(ids))/deleted.Seconds())

	// Sockets of the deleted sandboxes' connections close as their
	// goroutines end: wait a moment for the figures to settle.
	var after netFootprint
	for i := 0; i < 50; i++ {
		after = footprintOf(t, p, kc, v.Pid)
		if slices.Equal(after.keeperFds, before.keeperFds) && after.node.Links == before.node.Links &&
			after.node.ProxySandboxes == before.node.ProxySandboxes && after.node.ConnsActive == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	check := func(what string, got, want any) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s after deleting %d networked sandboxes:\n got %v\nwant %v (as with one)", what, len(ids), got, want)
		}
	}
	// The held connections ended: their upstream ends were closed.
	waitFor(t, "the held connections to end", func() bool { return echo.open() == 0 })
	check("host links", after.hostLinks, before.hostLinks)
	check("router links", after.routerLinks, before.routerLinks)
	check("router addresses", after.routerAddrs, before.routerAddrs)
	check("nftables", after.nft, before.nft)
	check("namespace mounts", after.nsMounts, before.nsMounts)
	check("keeper's proxy and resolver state", []int{after.node.Links, after.node.ProxySandboxes, after.node.ResolverSandboxes, int(after.node.ConnsActive)},
		[]int{before.node.Links, before.node.ProxySandboxes, before.node.ResolverSandboxes, int(before.node.ConnsActive)})
	if after.node.ConnsOut != before.node.ConnsOut+holders {
		t.Errorf("NodeNetwork after the deletes = %+v: the deleted sandboxes' %d connections are not in its totals", after.node, holders)
	}
	// /metrics shows the node's totals, the deleted sandboxes' included.
	resp, err := http.Get(p.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf("dsec_net_connections_total{backend=\"container\"} %d\n", after.node.ConnsOut); !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %q", want)
	}
	check("keeper's descriptors", after.keeperFds, before.keeperFds)
	// Go's splice keeps a pipe pair per direction of a connection in a
	// pool until the GC: at most four descriptors per held connection.
	if after.pipes > before.pipes+4*holders {
		t.Errorf("the keeper has %d pipes after deleting %d networked sandboxes, %d before", after.pipes, len(ids), before.pipes)
	}
	// The edge's idle connections to the keeper: about one per
	// concurrent delete and a few of its own (streams, other calls); a
	// socket per sandbox would be hundreds.
	if after.apiConns > before.apiConns+deleters+16 {
		t.Errorf("the keeper has %d unix sockets after deleting %d networked sandboxes (%d at once), %d before", after.apiConns, len(ids), deleters, before.apiConns)
	}

	if err := first.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	last := footprintOf(t, p, kc, v.Pid)
	if len(last.routerLinks) != 0 || last.node.Links != 0 || last.node.ProxySandboxes != 0 || last.node.ResolverSandboxes != 0 {
		t.Errorf("after deleting every sandbox: router links %v, NodeNetwork %+v; want none", last.routerLinks, last.node)
	}
}

// hostIPv4 returns an IPv4 address of the host's that is not loopback.
func hostIPv4(t *testing.T) string {
	t.Helper()
	as, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if !a.IP.IsLoopback() {
			return a.IP.String()
		}
	}
	t.Skip("the host has no IPv4 address but loopback")
	return ""
}

// holder accepts connections and holds them until the peer closes.
type holder struct {
	port int
	mu   sync.Mutex
	// guarded by mu
	n int
}

func (h *holder) open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

func holdServer(t *testing.T, addr string) *holder {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	h := &holder{port: ln.Addr().(*net.TCPAddr).Port}
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
			h.mu.Lock()
			h.n++
			h.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				_, _ = io.Copy(io.Discard, c)
				h.mu.Lock()
				h.n--
				h.mu.Unlock()
			}()
		}
	}()
	return h
}

// waitFor waits up to 5 s for ok.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestNetworkKeeperKillConnections: a connection a sandbox holds through
// the proxy when the keeper is killed (kill -9) ends cleanly on both
// sides, without hanging: the far end sees the end of stream and the
// sandbox's nc exits; after the restart the sandbox connects again.
func TestNetworkKeeperKillConnections(t *testing.T) {
	hostAddr := hostIPv4(t)
	echo := holdServer(t, hostAddr)
	conf := filepath.Join(t.TempDir(), "network.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("version = 1\n[services.leakhost]\ncidrs = [%q]\nports = [%d]\n", hostAddr+"/32", echo.port)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newPlatform(t, func(p *platform) { p.Extra = append(p.Extra, "--network-config", conf) })
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Network: dsec.NetworkFlag("allow=leakhost")})
	if err != nil {
		t.Fatal(err)
	}
	// nc's stdin is a FIFO a sleep holds open: nc ends only when the
	// connection does, and then writes /tmp/ended.
	hold := fmt.Sprintf("rm -f /tmp/f /tmp/ended; mkfifo /tmp/f; (sleep 1000 >/tmp/f &); (nc %s %d </tmp/f >/dev/null 2>&1; echo $? >/tmp/ended) >/dev/null 2>&1 & echo ok", hostAddr, echo.port)
	if _, err := sb.Shell(ctx, hold); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the held connection", func() bool { return echo.open() == 1 })

	kc := keeper.NewClient(p.StateDir)
	defer kc.Close()
	v, err := kc.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Kill9(t)
	if err := syscall.Kill(v.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitFor(t, "the far end to see the connection end", func() bool { return echo.open() == 0 })
	p.Start(t)
	c = p.Client(t, p.AdminKey(t))
	sb = c.Sandbox(sb.ID)
	r, err := sb.Shell(ctx, "for i in $(seq 50); do test -e /tmp/ended && break; sleep 0.1; done; cat /tmp/ended")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(r.Stdout)) == "" {
		t.Errorf("the sandbox's nc still holds its connection %v after the keeper was killed: it hangs", time.Since(killed).Round(time.Millisecond))
	}
	t.Logf("the sandbox's connection ended; %v after the kill", time.Since(killed).Round(time.Millisecond))
	// Enforced again: a new connection reaches the host.
	if _, err := sb.Shell(ctx, hold); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a connection after the restart", func() bool { return echo.open() == 1 })
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the connection to end with its sandbox", func() bool { return echo.open() == 0 })
}
