package edge

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

// portBackend is the fake backend with ports: each DialPort is an echo
// over a pipe, recorded.
type portBackend struct {
	sandbox.Backend

	mu    sync.Mutex
	dials []string // guarded by mu
	conns []net.Conn
}

func (b *portBackend) DialPort(_ context.Context, id string, port int) (net.Conn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dials = append(b.dials, id)
	if port != 80 {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "nothing listens on port %d in sandbox %s", port, id)
	}
	c, s := net.Pipe()
	b.conns = append(b.conns, s)
	go func() { _, _ = io.Copy(s, s) }()
	return c, nil
}

func (b *portBackend) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
}

func (b *portBackend) dialed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.dials)
}

func openPortsEdge(t *testing.T, withPorts bool) (*Edge, *portBackend) {
	t.Helper()
	var be sandbox.Backend = sandboxtest.NewFakeNode().Open()
	pb := &portBackend{Backend: be}
	t.Cleanup(pb.close)
	if withPorts {
		be = pb
	}
	e, err := New(context.Background(), Config{
		Node: "n", StateDir: t.TempDir(),
		Backends: map[string]sandbox.Backend{"fake": be},
		Images:   fakeImages{}, MemoryBytes: 1 << 30, MemoryOvercommit: 1, MemoryReserve: 1, CPUs: 2,
		Defaults:    Defaults{MemoryBytes: 64 * testMiB, DiskBytes: 16 * testMiB},
		OutputQuota: 16 * testMiB, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.diskSpace = func() (ceiling.Space, error) { return ceiling.Space{Free: 1 << 40, Size: 1 << 41}, nil }
	t.Cleanup(func() { e.Close() })
	return e, pb
}

func TestDialPort(t *testing.T) {
	ctx := context.Background()
	e, pb := openPortsEdge(t, true)
	team := Caller{Project: "a", KeyID: "ka"}
	r, err := e.Create(ctx, team, CreateParams{Image: "busybox"}, "")
	if err != nil {
		t.Fatal(err)
	}
	// Another project sees nothing, and nothing is dialled for it.
	if _, _, err := e.DialPort(ctx, Caller{Project: "b", KeyID: "kb"}, r.ID, 80); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DialPort as another project = %v, want NotFound", err)
	}
	if _, _, err := e.DialPort(ctx, team, "n-nosuch", 80); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DialPort of no sandbox = %v, want NotFound", err)
	}
	if n := pb.dialed(); n != 0 {
		t.Fatalf("dials after refusals = %d, want 0", n)
	}
	if _, _, err := e.DialPort(ctx, team, r.ID, 81); !errdefs.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("DialPort of a closed port = %v, want Unavailable", err)
	}
	// The limit of open connections per sandbox, freed by done.
	var dones []func()
	for range MaxPortConns {
		c, done, err := e.DialPort(ctx, admin, r.ID, 80)
		if err != nil {
			t.Fatalf("DialPort = %v", err)
		}
		c.Close()
		dones = append(dones, done)
	}
	if _, _, err := e.DialPort(ctx, team, r.ID, 80); !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("DialPort past the limit = %v, want ResourceExhausted", err)
	}
	// An open connection is activity: the sandbox is not idle.
	if d := e.idleFor(r.ID, time.Now().Add(time.Hour)); d != 0 {
		t.Errorf("idle for %v with port connections open, want 0", d)
	}
	dones[0]()
	dones[0]() // a second call changes nothing
	c, done, err := e.DialPort(ctx, team, r.ID, 80)
	if err != nil {
		t.Fatalf("DialPort after one closed = %v", err)
	}
	c.Close()
	done()
	for _, d := range dones[1:] {
		d()
	}
	if d := e.idleFor(r.ID, time.Now().Add(time.Hour)); d == 0 {
		t.Error("not idle once every port connection closed")
	}
	e.tunnels.mu.Lock()
	left := len(e.tunnels.open)
	e.tunnels.mu.Unlock()
	if left != 0 {
		t.Errorf("port connections counted after all closed: %d sandboxes", left)
	}
}

func TestDialPortLacksCapability(t *testing.T) {
	ctx := context.Background()
	e, _ := openPortsEdge(t, false)
	r, err := e.Create(ctx, admin, CreateParams{Image: "busybox"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.DialPort(ctx, admin, r.ID, 80); !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "ports capability") {
		t.Errorf("DialPort on a backend without ports = %v, want FailedPrecondition naming the capability", err)
	}
}

// TestPortTunnelHandler drives the node API's tunnel: only with the node
// token, then 101 and bytes both ways, or an error with its code.
func TestPortTunnelHandler(t *testing.T) {
	ctx := context.Background()
	e, _ := openPortsEdge(t, true)
	r, err := e.Create(ctx, admin, CreateParams{Image: "busybox"}, "")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.Handler("tok"))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	send := func(path, token string) (*http.Response, *bufio.Reader, net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		caller.Caller{Project: "default", Admin: true, KeyID: "k1"}.SetHeader(h)
		req := "GET " + path + " HTTP/1.1\r\nHost: edge\r\nConnection: Upgrade\r\nUpgrade: " + sandbox.PortTunnelUpgrade + "\r\nDsec-Node-Token: " + token + "\r\n"
		for k, v := range h {
			req += k + ": " + v[0] + "\r\n"
		}
		_, _ = io.WriteString(c, req+"\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			c.Close()
			t.Fatal(err)
		}
		return resp, br, c
	}
	resp, _, c := send(sandbox.PortTunnelPath(r.ID, 80), "wrong")
	c.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("tunnel without the node token = %d, want 401", resp.StatusCode)
	}
	resp, _, c = send(sandbox.PortTunnelPath(r.ID, 81), "tok")
	c.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(sandbox.HeaderErrorCode) != "unavailable" {
		t.Errorf("tunnel to a closed port = %d %q, want 503 with code unavailable", resp.StatusCode, resp.Header.Get(sandbox.HeaderErrorCode))
	}
	resp, br, c := send(sandbox.PortTunnelPath(r.ID, 80), "tok")
	defer c.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("tunnel = %d, want 101", resp.StatusCode)
	}
	_, _ = io.WriteString(c, "hello\n")
	if got, err := br.ReadString('\n'); got != "hello\n" {
		t.Errorf("echo through the tunnel = %q, %v", got, err)
	}
}
