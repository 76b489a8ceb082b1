package keeper

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/netns"
	"github.com/dsecproject/dsec/internal/testenv"
)

// netDriver is the fake driver with an init in a network namespace of its
// own, recorded like a real sandbox's.
type netDriver struct{ *fakeDriver }

func (d netDriver) Start(ctx context.Context, b *box, req CreateRequest) error {
	if err := os.MkdirAll(filepath.Join(d.k.l.SandboxDir(req.ID), "execs"), 0o700); err != nil {
		return err
	}
	pid, ch, err := d.k.reaper.startProcess([]string{"/bin/sleep", "3600"}, nil, devNulls(),
		&syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWNET}, "")
	if err != nil {
		return err
	}
	st, err := ProcStartTime(pid)
	if err != nil {
		return err
	}
	ns, err := namespacesOf(pid)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.info.Pid, b.info.StartTime, b.info.State, b.info.NS = pid, st, StateRunning, ns
	b.initExit = ch
	b.mu.Unlock()
	return nil
}

// The world: a namespace holding the hosts sandboxes reach, at these
// addresses; the keeper's proxy dials into it.
const (
	worldAllowed = "198.51.100.1"
	worldDenied  = "198.51.100.2"
)

// inNetNS runs fn on a thread in the network namespace of path, thrown
// away afterwards.
func inNetNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// newWorld starts a process in a new network namespace with the world's
// addresses and an echo on worldAllowed:port, and returns its namespace
// file and the echo's port.
func newWorld(t *testing.T) (string, int) {
	t.Helper()
	p := startNetNS(t, "/bin/sleep", "3600")
	path := fmt.Sprintf("/proc/%d/ns/net", p.Pid)
	var ln net.Listener
	if err := inNetNS(path, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		for _, ip := range []string{worldAllowed, worldDenied} {
			a, _ := netlink.ParseAddr(ip + "/32")
			if err := netlink.AddrAdd(lo, a); err != nil {
				return err
			}
		}
		ln, err = net.Listen("tcp4", worldAllowed+":0")
		return err
	}); err != nil {
		t.Fatalf("world namespace: %v", err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return path, ln.Addr().(*net.TCPAddr).Port
}

func startNetNS(t *testing.T, argv ...string) *os.Process {
	t.Helper()
	p, err := os.StartProcess(argv[0], argv, &os.ProcAttr{Sys: &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(); p.Wait() })
	return p
}

// newNetKeeper is newFakeKeeper with the network driver, a network config
// naming the world, and the network restored as at a keeper's start.
func newNetKeeper(t *testing.T, dir, conf, world string) (*Keeper, *Client) {
	t.Helper()
	cfg := Config{StateDir: dir, Version: "test", Runtime: "/usr/bin/crun", OutputQuota: 1 << 20, OutputLimit: 1 << 20, NetworkConfig: conf}
	k := &Keeper{cfg: cfg, l: Layout{StateDir: dir}, log: discardLogger(), boxes: map[string]*box{}, events: newEventLog(), vault: newVault(), settings: cfg.Settings()}
	k.reaper = newReaper()
	k.drivers, k.defaultDriver = map[string]Driver{"fake": netDriver{&fakeDriver{k: k}}}, "fake"
	k.net.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetNS(world, func() (err error) {
			var d net.Dialer
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	if err := os.MkdirAll(k.l.SandboxesDir(), 0o711); err != nil {
		t.Fatal(err)
	}
	k.adopt()
	if err := k.setupNetwork(); err != nil {
		t.Fatal(err)
	}
	serveOn(t, dir, k.handler(func() {}))
	c := NewClient(dir)
	t.Cleanup(func() {
		c.Close()
		k.closeNetwork()
		if k.reaper != nil {
			k.reaper.close()
		}
	})
	return k, c
}

// sandboxDo runs fn in the network namespace of sandbox id's init.
func sandboxDo(t *testing.T, c *Client, id string, fn func() error) error {
	t.Helper()
	s, err := c.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return inNetNS(fmt.Sprintf("/proc/%d/ns/net", s.Pid), fn)
}

// echoes connects from inside sandbox id to addr and reports whether the
// connection echoes.
func echoes(t *testing.T, c *Client, id, addr string) bool {
	t.Helper()
	var conn net.Conn
	if err := sandboxDo(t, c, id, func() (err error) {
		conn, err = net.DialTimeout("tcp4", addr, time.Second)
		return err
	}); err != nil {
		return false
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("ping")); err != nil {
		return false
	}
	buf := make([]byte, 4)
	_, err := io.ReadFull(conn, buf)
	return err == nil && string(buf) == "ping"
}

func resolve(t *testing.T, c *Client, id, name string) (*dns.Msg, error) {
	t.Helper()
	var m *dns.Msg
	err := sandboxDo(t, c, id, func() error {
		conn, err := net.DialTimeout("udp4", "192.0.2.53:53", time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		dc := &dns.Conn{Conn: conn}
		if err := dc.WriteMsg(q); err != nil {
			return err
		}
		m, err = dc.ReadMsg()
		return err
	})
	return m, err
}

// TestKeeperNetwork: PUT, GET and DELETE /v1/network on a running
// sandbox, bad policies, a keeper restart that restores enforcement from
// the record, and deletion that leaves no link.
func TestKeeperNetwork(t *testing.T) {
	testenv.RequireRoot(t)
	world, port := newWorld(t)
	conf := filepath.Join(t.TempDir(), "network.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`version = 1
[services.mirror]
domains = ["mirror.test"]
ports = [%d]
[hosts]
"mirror.test" = ["%s"]
"other.test" = ["%s"]
`, port, worldAllowed, worldDenied)), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := shortTempDir(t)
	t.Cleanup(func() {
		if err := netns.Remove(Layout{StateDir: dir}.NetworkDir()); err != nil {
			t.Errorf("remove router: %v", err)
		}
	})
	k1, c1 := newNetKeeper(t, dir, conf, world)
	ctx := context.Background()
	const id = "net-a"
	if _, err := c1.Create(ctx, CreateRequest{ID: id, Layers: []Layer{{Digest: "sha256:aa"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(Layout{StateDir: dir}.NetworkDir()); err == nil {
		t.Errorf("the router exists before any sandbox has a network")
	}
	allowed := net.JoinHostPort(worldAllowed, strconv.Itoa(port))

	// Bad policies are InvalidArgument naming the rule, and open nothing.
	for _, doc := range []string{
		`{"rules":[{"action":"allow","service":"pipy"}]}`,
		`{"rules":[{"action":"allow","cidr":"10.0.0.0/33"}]}`,
		`{"rules":[{"action":"allow","service":"mirror"},{"action":"deny","service":"mirror"}]}`,
		`{"rules":[{"action":"allow","domain":"a.example","ports":[70000]}]}`,
	} {
		_, err := c1.SetNetwork(ctx, id, NetworkRequest{Policy: json.RawMessage(doc)})
		if !errdefs.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "rule") {
			t.Errorf("SetNetwork(%s) = %v, want InvalidArgument naming the rule", doc, err)
		}
	}
	if _, err := c1.SetNetwork(ctx, "nope", NetworkRequest{Policy: json.RawMessage(`{"mode":"open"}`)}); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("SetNetwork(unknown sandbox) = %v, want NotFound", err)
	}

	info, err := c1.SetNetwork(ctx, id, NetworkRequest{Policy: json.RawMessage(`{"rules":[{"action":"allow","service":"mirror"}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	if info.Address == "" || info.Router == "" || !strings.Contains(string(info.Policy), "mirror") {
		t.Fatalf("SetNetwork = %+v, want addresses and the policy", info)
	}
	if m, err := resolve(t, c1, id, "mirror.test"); err != nil || len(m.Answer) != 1 {
		t.Fatalf("resolve mirror.test = %v, %v", m, err)
	}
	if m, err := resolve(t, c1, id, "other.test"); err != nil || m.Rcode != dns.RcodeNameError {
		t.Errorf("resolve other.test = %v, %v; want NXDOMAIN", m, err)
	}
	if !echoes(t, c1, id, allowed) {
		t.Fatal("the allowed service does not answer")
	}
	if echoes(t, c1, id, net.JoinHostPort(worldDenied, strconv.Itoa(port))) || echoes(t, c1, id, "169.254.169.254:80") {
		t.Error("a denied address answered")
	}
	got, err := c1.Network(ctx, id)
	if err != nil || got.ConnsOut < 1 || got.Denied < 2 || got.DNSDenied != 1 || len(got.Denials) < 3 {
		t.Errorf("Network = %+v, %v; want a connection, 2 denied, 1 DNS denial", got, err)
	}

	// A restarted keeper: enforcement from the record, before serving.
	c1.Close()
	k1.closeNetwork()
	k1.mu.Lock()
	k1.boxes = map[string]*box{}
	k1.mu.Unlock()
	k1.reaper.close()
	k1.reaper = nil
	_ = os.Remove(Layout{StateDir: dir}.Socket())
	_, c2 := newNetKeeper(t, dir, conf, world)
	resolve(t, c2, id, "mirror.test")
	if !echoes(t, c2, id, allowed) {
		t.Error("after a restart, the allowed service does not answer")
	}
	if echoes(t, c2, id, "169.254.169.254:80") {
		t.Error("after a restart, the metadata address answered")
	}

	// An update replaces the policy; DELETE leaves lo only.
	if _, err := c2.SetNetwork(ctx, id, NetworkRequest{Policy: json.RawMessage(`{"rules":[{"action":"deny","service":"mirror"}]}`)}); err != nil {
		t.Fatal(err)
	}
	if echoes(t, c2, id, allowed) {
		t.Error("denied by the update, the service still answers")
	}
	if err := c2.DeleteNetwork(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got, err := c2.Network(ctx, id); err != nil || len(got.Policy) != 0 || got.Address != "" {
		t.Errorf("Network after DELETE = %+v, %v; want none", got, err)
	}
	sandboxDo(t, c2, id, func() error {
		ls, _ := netlink.LinkList()
		if len(ls) != 1 {
			t.Errorf("sandbox links after DELETE = %d, want lo only", len(ls))
		}
		return nil
	})

	// A sandbox deleted with a network takes its link with it.
	if _, err := c2.SetNetwork(ctx, id, NetworkRequest{Policy: json.RawMessage(`{"mode":"open"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := c2.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	var links []netlink.Link
	inNetNS(filepath.Join(Layout{StateDir: dir}.NetworkDir(), "router"), func() error {
		links, _ = netlink.LinkList()
		return nil
	})
	if len(links) != 1 {
		t.Errorf("router links after the sandbox's deletion = %d, want lo only", len(links))
	}
}
