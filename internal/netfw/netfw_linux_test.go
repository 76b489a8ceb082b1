package netfw

import (
	"errors"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/netns"
	"github.com/dsecproject/dsec/internal/testenv"
)

func hostTables(t *testing.T) int {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	ts, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	return len(ts)
}

// TestInstallReplaceRemove: the table goes into the router namespace only,
// a second Install replaces it (one table, not two), Remove deletes it and
// a second Remove is no error.
func TestInstallReplaceRemove(t *testing.T) {
	testenv.RequireRoot(t)
	before := hostTables(t)
	r, err := netns.Open(t.TempDir(), netns.DefaultPool)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Destroy()
	cfg := Config{ProxyPort: 15001, DNSPort: 15053}
	for i := range 2 {
		if err := Install(r.NSFd(), cfg); err != nil {
			t.Fatalf("Install #%d: %v", i+1, err)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(r.NSFd()))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 || ts[0].Name != TableName {
		t.Fatalf("router tables after two Installs = %d %v, want one %q", len(ts), ts, TableName)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	if len(chains) != 3 {
		t.Errorf("chains = %d, want 3 (prerouting, input, forward)", len(chains))
	}
	if got := hostTables(t); got != before {
		t.Errorf("host tables = %d after Install, want %d: the host's firewall was changed", got, before)
	}
	if err := Remove(r.NSFd()); err != nil {
		t.Fatal(err)
	}
	if ok, err := Installed(r.NSFd()); err != nil || ok {
		t.Errorf("Installed after Remove = %v, %v; want false", ok, err)
	}
	if err := Remove(r.NSFd()); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if err := Install(r.NSFd(), Config{DNSPort: 53}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Install without a proxy port = %v, want InvalidArgument", err)
	}
}

// TestUDPRelay: with a UDP port the table has the udp chain, and Route
// makes the mark's rule and local route in the router namespace only,
// once however often it runs.
func TestUDPRelay(t *testing.T) {
	testenv.RequireRoot(t)
	hostRules, err := netlink.RuleList(netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	r, err := netns.Open(t.TempDir(), netns.DefaultPool)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Destroy()
	if err := Install(r.NSFd(), Config{ProxyPort: 15001, DNSPort: 15053, UDPPort: 15054}); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(r.NSFd()))
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	if len(chains) != 4 {
		t.Errorf("chains = %d, want 4 (prerouting, input, forward, udp)", len(chains))
	}
	for range 2 {
		if err := Route(r.NSFd()); err != nil {
			t.Fatal(err)
		}
	}
	h, err := netlink.NewHandleAt(vnetns.NsHandle(r.NSFd()))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	rules, err := h.RuleList(netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, rl := range rules {
		if rl.Mark == UDPMark && rl.Table == UDPTable {
			n++
		}
	}
	if n != 1 {
		t.Errorf("router rules for the mark = %d, want 1", n)
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: UDPTable}, netlink.RT_FILTER_TABLE)
	if err != nil || len(routes) != 1 {
		t.Errorf("routes in table %d = %v, %v; want one local route", UDPTable, routes, err)
	}
	after, err := netlink.RuleList(netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(hostRules) {
		t.Errorf("host rules %d → %d: Route changed the host's namespace", len(hostRules), len(after))
	}
}
