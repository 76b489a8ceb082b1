package e2e

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// routerLinks lists the links in the keeper's router namespace (mounted in
// the keeper's own mount namespace), or nil when it has none.
func routerLinks(t *testing.T, p *platform, keeperPid int) []string {
	t.Helper()
	path := filepath.Join("/proc", strconv.Itoa(keeperPid), "root", keeper.Layout{StateDir: p.StateDir}.NetworkDir(), "router")
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		return nil
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ls, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		if l.Attrs().Name != "lo" {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// TestNetworkRealSandbox: the keeper's network endpoints on a real
// sandbox (crun, its own user and network namespaces): the sandbox gets
// eth0, the metadata address is refused fast and logged, a kill -9 of
// dsec up and the keeper restores the policy and its enforcement, and
// deleting the sandbox leaves no link in the router.
func TestNetworkRealSandbox(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	kc := keeper.NewClient(p.StateDir)
	defer kc.Close()
	start := time.Now()
	info, err := kc.SetNetwork(ctx, sb.ID, keeper.NetworkRequest{Policy: json.RawMessage(`{"mode":"open"}`)})
	if err != nil {
		t.Fatalf("SetNetwork: %v", err)
	}
	t.Logf("first SetNetwork (opens the router): %v", time.Since(start))
	start = time.Now()
	if _, err := kc.SetNetwork(ctx, sb.ID, keeper.NetworkRequest{Policy: json.RawMessage(`{"mode":"open"}`)}); err != nil {
		t.Fatal(err)
	}
	t.Logf("an update: %v", time.Since(start))
	sb2, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if _, err := kc.SetNetwork(ctx, sb2.ID, keeper.NetworkRequest{Policy: json.RawMessage(`{"mode":"open"}`)}); err != nil {
		t.Fatal(err)
	}
	t.Logf("a second sandbox's link: %v", time.Since(start))
	if err := sb2.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	probe := func(want string) {
		t.Helper()
		start := time.Now()
		// busybox nc: the proxy takes the connection and resets it
		// at once (its wget crashes on this image, so it is not used).
		r, err := sb.Shell(ctx, "ip -4 addr show eth0; printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 169.254.169.254 80; echo done")
		if err != nil {
			t.Fatal(err)
		}
		out := string(r.Stdout)
		if !strings.Contains(out, want+"/31") {
			t.Errorf("eth0 in the sandbox: %q, want %s/31", out, want)
		}
		if !strings.HasSuffix(out, "done\n") || strings.Contains(out, "HTTP/") {
			t.Errorf("nc to the metadata address: %q %q, want refused", out, r.Stderr)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("the refused connection took %v, want well under nc's 5 s timeout", d)
		}
	}
	probe(info.Address)
	got, err := kc.Network(ctx, sb.ID)
	if err != nil || got.Denied < 1 || len(got.Denials) < 1 || got.Denials[len(got.Denials)-1].Dest != "169.254.169.254:80/tcp" {
		t.Fatalf("Network = %+v, %v; want the metadata address denied", got, err)
	}

	// kill -9 of dsec up and of the keeper: the next keeper restores it.
	v, err := kc.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Kill9(t)
	if err := syscall.Kill(v.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100 && syscall.Kill(v.Pid, 0) == nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	p.Start(t)
	c = p.Client(t, p.AdminKey(t))
	sb = c.Sandbox(sb.ID)
	after, err := kc.Network(ctx, sb.ID)
	if err != nil || !strings.Contains(string(after.Policy), "open") || after.Address == "" {
		t.Fatalf("Network after a restart = %+v, %v; want the policy back, with an address", after, err)
	}
	probe(after.Address)
	if got, _ := kc.Network(ctx, sb.ID); got.Denied < 1 {
		t.Errorf("after a restart the denial was not recorded: %+v", got)
	}
	// A settings change replaces the keeper, which hands the router over
	// in its vault: the link and its address stay.
	ifindex := func() string {
		t.Helper()
		r, err := sb.Shell(ctx, "cat /sys/class/net/eth0/ifindex")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(r.Stdout))
	}
	link := ifindex()
	p.Stop(t)
	p.Extra = append(p.Extra, "--chunk-cache-size", "1G")
	p.Start(t)
	v2, err := kc.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v2.Pid == v.Pid || v2.Settings == nil || v2.Settings.ChunkCacheSize != 1<<30 {
		t.Fatalf("the keeper was not replaced: %+v", v2)
	}
	handed, err := kc.Network(ctx, sb.ID)
	if err != nil || handed.Address != after.Address {
		t.Errorf("Network after a handoff = %+v, %v; want the same address %s", handed, err, after.Address)
	}
	probe(after.Address)
	if got := ifindex(); got != link || link == "" {
		t.Errorf("the sandbox's eth0 is link %q after the handoff, was %q: the router was not handed over", got, link)
	}
	if l := routerLinks(t, p, v2.Pid); len(l) != 1 {
		t.Errorf("router links = %v, want the sandbox's only", l)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if l := routerLinks(t, p, v2.Pid); len(l) != 0 {
		t.Errorf("router links after deleting the sandbox = %v, want none", l)
	}
}
