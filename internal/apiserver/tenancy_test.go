package apiserver

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/dsecproject/dsec/api/dsec/node/v1"
	"github.com/dsecproject/dsec/api/dsec/node/v1/nodev1connect"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/blobstore"
	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/edgeclient"
	"github.com/dsecproject/dsec/internal/watcher"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// countingEdge is a node that creates sandboxes as records only, slowly,
// and reports per-project usage in its status as an edge does.
type countingEdge struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
	delay time.Duration

	mu sync.Mutex
	// guarded by mu
	sandboxes map[string]*sandboxv1.Sandbox
	n         int
	creates   []*sandboxv1.CreateRequest
	grades    int
	// admissible is the memory the node admits (0: 1 PiB); pidsMax and
	// diskMax the most pids and disk it gives one sandbox (0: unreported).
	admissible, pidsMax, diskMax int64
}

func (e *countingEdge) Create(_ context.Context, req *connect.Request[sandboxv1.CreateRequest]) (*connect.Response[sandboxv1.CreateResponse], error) {
	time.Sleep(e.delay)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	sb := &sandboxv1.Sandbox{
		Id: "n1-" + fakeID(e.n), Node: "n1", Project: req.Header().Get(caller.HeaderProject),
		Image: req.Msg.GetImage(), Resources: &sandboxv1.Resources{MemoryBytes: req.Msg.GetResources().GetMemoryBytes()},
	}
	if sb.Resources.MemoryBytes == 0 {
		sb.Resources.MemoryBytes = 512 << 20
	}
	e.sandboxes[sb.Id] = sb
	e.creates = append(e.creates, req.Msg)
	return connect.NewResponse(&sandboxv1.CreateResponse{Sandbox: sb}), nil
}

func (e *countingEdge) List(_ context.Context, req *connect.Request[sandboxv1.ListRequest]) (*connect.Response[sandboxv1.ListResponse], error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := &sandboxv1.ListResponse{}
	for _, sb := range e.sandboxes {
		if sb.Project == req.Header().Get(caller.HeaderProject) {
			out.Sandboxes = append(out.Sandboxes, sb)
		}
	}
	return connect.NewResponse(out), nil
}

func (e *countingEdge) Delete(_ context.Context, req *connect.Request[sandboxv1.DeleteRequest]) (*connect.Response[sandboxv1.DeleteResponse], error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.sandboxes, req.Msg.GetId())
	return connect.NewResponse(&sandboxv1.DeleteResponse{Deleted: []string{req.Msg.GetId()}}), nil
}

func (e *countingEdge) SetTimeout(_ context.Context, req *connect.Request[sandboxv1.SetTimeoutRequest]) (*connect.Response[sandboxv1.SetTimeoutResponse], error) {
	return connect.NewResponse(&sandboxv1.SetTimeoutResponse{Sandbox: &sandboxv1.Sandbox{Id: req.Msg.GetId()}}), nil
}

func (e *countingEdge) Status(context.Context, *connect.Request[nodev1.StatusRequest]) (*connect.Response[nodev1.StatusResponse], error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	projects := map[string]*nodev1.ProjectUsage{}
	var committed int64
	admissible := e.admissible
	if admissible == 0 {
		admissible = 1 << 50
	}
	for _, sb := range e.sandboxes {
		committed += sb.GetResources().GetMemoryBytes()
		u := projects[sb.Project]
		if u == nil {
			u = &nodev1.ProjectUsage{}
			projects[sb.Project] = u
		}
		u.Sandboxes++
		u.MemoryBytes += sb.GetResources().GetMemoryBytes()
	}
	return connect.NewResponse(&nodev1.StatusResponse{
		Node: "n1", Backends: []string{"container"}, Sandboxes: int64(len(e.sandboxes)),
		MemoryAdmissibleBytes: admissible, MemoryCommittedBytes: committed, Projects: projects,
		PidsMax: e.pidsMax, DiskMaxBytes: e.diskMax,
	}), nil
}

func (e *countingEdge) live(project string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, sb := range e.sandboxes {
		if sb.Project == project {
			n++
		}
	}
	return n
}

// fakeID makes the random part of a sandbox ID from n.
func fakeID(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	b := []byte(strings.Repeat("a", 12))
	for i := 11; n > 0; i-- {
		b[i] = alphabet[n%32]
		n /= 32
	}
	return string(b)
}

// tenancyServer is an API server with one counting node, an admin client
// and a way to make clients of other projects.
type tenancyServer struct {
	admin *dsec.Client
	store *cluster.Store
	edge  *countingEdge
	addr  string
	blobs string // the layer store's directory
	w     *watcher.Watcher
}

// setAdmissible makes the node admit mem bytes in all and the control
// plane see it.
func (s *tenancyServer) setAdmissible(t *testing.T, mem int64) {
	s.edge.mu.Lock()
	s.edge.admissible = mem
	s.edge.mu.Unlock()
	s.w.Poll(t.Context())
}

func newTenancyServer(t *testing.T, delay time.Duration) *tenancyServer {
	t.Helper()
	return newTenancyServerLog(t, delay, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// newTenancyServerLog is newTenancyServer with the API server logging to
// log.
func newTenancyServerLog(t *testing.T, delay time.Duration, apiLog *slog.Logger) *tenancyServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dir, err := os.MkdirTemp("", "dsec-tenancy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	etcd, err := cluster.StartEmbedded(ctx, cluster.EmbedConfig{Dir: filepath.Join(dir, "etcd"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	store := cluster.NewStore(etcd.Client(), cluster.StoreConfig{Logger: log})
	cw := store.WatchCaches()
	t.Cleanup(cw.Close)
	key, err := store.EnsureAdminKey(ctx, filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := blobstore.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	fe := &countingEdge{delay: delay, sandboxes: map[string]*sandboxv1.Sandbox{}}
	edgeSock := filepath.Join(dir, "edge.sock")
	edgeLn, err := net.Listen("unix", edgeSock)
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(fe))
	mux.Handle(nodev1connect.NewNodeServiceHandler(fe))
	serve(t, &http.Server{Handler: mux, Protocols: &protos}, edgeLn)
	reg, err := store.RegisterNode(ctx, cluster.Node{Name: "n1", Addr: "unix://" + edgeSock, Backends: []string{"container"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	pool := edgeclient.NewPool("token")
	t.Cleanup(pool.Close)
	w := watcher.New(ctx, watcher.Config{Nodes: store, Pool: pool, Logger: log})
	t.Cleanup(w.Close)
	api := New(Config{Cluster: store, Blobs: blobs, Watcher: w, Pool: pool, Logger: apiLog})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, &http.Server{Handler: api.Handler(), Protocols: &protos}, ln)
	addr := "http://" + ln.Addr().String()
	c, err := dsec.New(dsec.Config{Addr: addr, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &tenancyServer{admin: c, store: store, edge: fe, addr: addr, blobs: filepath.Join(dir, "blobs"), w: w}
}

// client returns a client with a new key of project.
func (s *tenancyServer) client(t *testing.T, project string, opts dsec.KeyOptions) *dsec.Client {
	t.Helper()
	opts.Project = project
	secret, _, err := s.admin.CreateKey(t.Context(), opts)
	if err != nil {
		t.Fatalf("CreateKey(%s) = %v", project, err)
	}
	c, err := dsec.New(dsec.Config{Addr: s.addr, APIKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (s *tenancyServer) layer(t *testing.T, c *dsec.Client, data string) string {
	t.Helper()
	d := digestOf([]byte(data))
	if _, err := c.UploadLayer(t.Context(), strings.NewReader(data), d, int64(len(data))); err != nil {
		t.Fatalf("UploadLayer = %v", err)
	}
	return d
}

func ptr[T any](v T) *T { return &v }

// TestProjectSandboxLimit fires many creates at once at a project with a
// sandbox limit: exactly the limit succeed, the others are
// ResourceExhausted naming the project and the limit; deleting one makes
// room again at once (the refused create polls the nodes).
func TestProjectSandboxLimit(t *testing.T) {
	t.Parallel()
	s := newTenancyServer(t, 20*time.Millisecond)
	ctx := t.Context()
	if _, err := s.admin.SetProjectLimits(ctx, "rl", dsec.LimitsUpdate{Sandboxes: ptr[int64](10)}); err != nil {
		t.Fatal(err)
	}
	c := s.client(t, "rl", dsec.KeyOptions{})
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			_, err := c.Create(ctx, dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, dsec.ErrResourceExhausted) && strings.Contains(err.Error(), "project rl") && strings.Contains(err.Error(), "10"):
				refused.Add(1)
			default:
				t.Errorf("Create = %v, want success or ResourceExhausted naming project rl and 10", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 10 || refused.Load() != 30 || s.edge.live("rl") != 10 {
		t.Errorf("40 concurrent creates under a limit of 10: %d created, %d refused, %d live; want 10, 30, 10", ok.Load(), refused.Load(), s.edge.live("rl"))
	}
	// A batch is admitted item by item.
	res, err := c.BatchCreate(ctx, dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}}, 3)
	if err != nil {
		t.Fatalf("BatchCreate = %v", err)
	}
	for _, r := range res {
		if !errors.Is(r.Err, dsec.ErrResourceExhausted) {
			t.Errorf("BatchCreate item %d at the limit = %v, want ResourceExhausted", r.Index, r.Err)
		}
	}
	// Another project is not affected.
	other := s.client(t, "other", dsec.KeyOptions{})
	if _, err := other.Create(ctx, dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}}); err != nil {
		t.Errorf("Create(other project) = %v", err)
	}
	// Room again right after a delete.
	sbs, err := c.List(ctx, nil)
	if err != nil || len(sbs) == 0 {
		t.Fatalf("List = %d, %v", len(sbs), err)
	}
	if err := c.Delete(ctx, sbs[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}}); err != nil {
		t.Errorf("Create right after a delete at the limit = %v, want room", err)
	}
	p, err := s.admin.GetProject(ctx, "rl")
	if err != nil || p.Sandboxes != 10 || p.Limits.Sandboxes != 10 {
		t.Errorf("GetProject(rl) = %+v, %v, want 10 of 10 sandboxes", p, err)
	}
}

func TestProjectMemoryLimit(t *testing.T) {
	t.Parallel()
	s := newTenancyServer(t, 0)
	ctx := t.Context()
	if _, err := s.admin.SetProjectLimits(ctx, "rl", dsec.LimitsUpdate{MemoryBytes: ptr[int64](2 << 30)}); err != nil {
		t.Fatal(err)
	}
	c := s.client(t, "rl", dsec.KeyOptions{})
	create := func(mem int64) error {
		_, err := c.Create(ctx, dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}, Memory: mem})
		return err
	}
	if err := create(1536 << 20); err != nil {
		t.Fatalf("Create(1.5G of 2G) = %v", err)
	}
	err := create(1 << 30)
	if !errors.Is(err, dsec.ErrResourceExhausted) || !strings.Contains(err.Error(), "project rl") || !strings.Contains(err.Error(), "2 GiB") {
		t.Errorf("Create(1G more) = %v, want ResourceExhausted naming project rl and its 2 GiB limit", err)
	}
	if err := create(512 << 20); err != nil {
		t.Errorf("Create(the last 512M) = %v", err)
	}
	// Users see their own project's limits, not others'.
	if p, err := c.GetProject(ctx, ""); err != nil || p.Name != "rl" || p.Limits.MemoryBytes != 2<<30 || p.MemoryBytes != 2<<30 {
		t.Errorf("GetProject(own) = %+v, %v, want rl with 2 GiB of 2 GiB", p, err)
	}
	if _, err := c.GetProject(ctx, "default"); !errors.Is(err, dsec.ErrPermissionDenied) {
		t.Errorf("GetProject(another project) = %v, want PermissionDenied", err)
	}
	if _, err := c.SetProjectLimits(ctx, "rl", dsec.LimitsUpdate{MemoryBytes: ptr[int64](0)}); !errors.Is(err, dsec.ErrPermissionDenied) {
		t.Errorf("SetProjectLimits(user key) = %v, want PermissionDenied", err)
	}
	if ps, err := s.admin.ListProjects(ctx); err != nil || len(ps) != 2 || ps[0].Name != "default" || ps[1].Name != "rl" || ps[1].Keys != 1 {
		t.Errorf("ListProjects() = %+v, %v, want default and rl (1 key)", ps, err)
	}
}

// TestMaxTTL: above the project's maximum TTL a create, a batch and a TTL
// change are InvalidArgument naming the maximum; nothing reaches the node.
func TestMaxTTL(t *testing.T) {
	t.Parallel()
	s := newTenancyServer(t, 0)
	ctx := t.Context()
	c := s.client(t, "rl", dsec.KeyOptions{})
	layers := []string{digestOf([]byte("x"))}
	tenKYears := 200 * 365 * 24 * time.Hour // the Go SDK's longest; the API takes 10,000 years, which saturate
	for _, o := range []dsec.CreateOptions{
		{Layers: layers, TTL: tenKYears},
		{Layers: layers, TTL: 7*24*time.Hour + time.Second},
		{Layers: layers, IdleTTL: 8 * 24 * time.Hour},
	} {
		_, err := c.Create(ctx, o)
		if !errors.Is(err, dsec.ErrInvalidArgument) || !strings.Contains(err.Error(), "7d") {
			t.Errorf("Create(ttl %s, idle %s) = %v, want InvalidArgument naming the maximum 7d", o.TTL, o.IdleTTL, err)
		}
	}
	if _, err := c.BatchCreate(ctx, dsec.CreateOptions{Layers: layers, TTL: tenKYears}, 5); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("BatchCreate(ttl 10000 years) = %v, want InvalidArgument", err)
	}
	sb, err := c.Create(ctx, dsec.CreateOptions{Layers: layers, TTL: 7 * 24 * time.Hour})
	if err != nil {
		t.Fatalf("Create(ttl 7d) = %v", err)
	}
	if err := sb.SetTimeout(ctx, tenKYears, 0); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("SetTimeout(10000 years) = %v, want InvalidArgument", err)
	}
	// An admin lowers the maximum below the default TTL (1h): creates
	// without a TTL get the maximum.
	if _, err := s.admin.SetProjectLimits(ctx, "rl", dsec.LimitsUpdate{MaxTTL: ptr(10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	for {
		_, err := c.Create(ctx, dsec.CreateOptions{Layers: layers, TTL: 20 * time.Minute})
		if errors.Is(err, dsec.ErrInvalidArgument) && strings.Contains(err.Error(), "10m0s") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Create(20m) after the maximum became 10m = %v, want InvalidArgument naming 10m0s within a second", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.Create(ctx, dsec.CreateOptions{Layers: layers}); err != nil {
		t.Fatalf("Create(no TTL) = %v", err)
	}
	s.edge.mu.Lock()
	last := s.edge.creates[len(s.edge.creates)-1]
	n := len(s.edge.creates)
	s.edge.mu.Unlock()
	if got := last.GetTtl().AsDuration(); got != 10*time.Minute {
		t.Errorf("forwarded TTL of a create without one = %s, want the maximum 10m", got)
	}
	if n != 2 {
		t.Errorf("%d creates reached the node, want 2 (the refused ones never do)", n)
	}
}

// TestImageVisibility: a private image runs only for its project (others
// are told it does not exist), a public one for everyone; listing follows.
func TestImageVisibility(t *testing.T) {
	t.Parallel()
	s := newTenancyServer(t, 0)
	ctx := t.Context()
	victim := s.client(t, "victim", dsec.KeyOptions{})
	mallory := s.client(t, "mallory", dsec.KeyOptions{})
	d := s.layer(t, victim, "victim layer")
	if _, err := victim.CreateImage(ctx, "victim/app", []string{d}, dsec.ImageConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := mallory.Create(ctx, dsec.CreateOptions{Image: "victim/app"}); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("Create(another project's private image) = %v, want NotFound", err)
	}
	if _, err := mallory.GetImage(ctx, "victim/app"); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("GetImage(another project's private image) = %v, want NotFound", err)
	}
	if imgs, err := mallory.ListImages(ctx); err != nil || len(imgs) != 0 {
		t.Errorf("ListImages(mallory) = %d images, %v, want none", len(imgs), err)
	}
	if _, err := victim.Create(ctx, dsec.CreateOptions{Image: "victim/app"}); err != nil {
		t.Errorf("Create(own private image) = %v", err)
	}
	if _, err := s.admin.Create(ctx, dsec.CreateOptions{Image: "victim/app"}); err != nil {
		t.Errorf("Create(admin, private image) = %v", err)
	}
	if _, err := mallory.SetImagePublic(ctx, "victim/app", true); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("SetImagePublic(another project's private image) = %v, want NotFound", err)
	}
	img, err := victim.SetImagePublic(ctx, "victim/app", true)
	if err != nil || !img.Public || img.Project != "victim" {
		t.Fatalf("SetImagePublic(own) = %+v, %v", img, err)
	}
	if _, err := mallory.Create(ctx, dsec.CreateOptions{Image: "victim/app"}); err != nil {
		t.Errorf("Create(public image) = %v", err)
	}
	if imgs, err := mallory.ListImages(ctx); err != nil || len(imgs) != 1 || !imgs[0].Public || imgs[0].Project != "victim" {
		t.Errorf("ListImages(mallory) = %+v, %v, want the public image of victim", imgs, err)
	}
	if _, err := mallory.DeleteImage(ctx, "victim/app"); !errors.Is(err, dsec.ErrPermissionDenied) {
		t.Errorf("DeleteImage(another project's public image) = %v, want PermissionDenied", err)
	}
	evil := s.layer(t, mallory, "attacker layer")
	if _, err := mallory.CreateImage(ctx, "victim/app", []string{evil}, dsec.ImageConfig{}, dsec.WithForce()); !errors.Is(err, dsec.ErrPermissionDenied) {
		t.Errorf("CreateImage(onto another project's image, force) = %v, want PermissionDenied", err)
	}
	if img, err := victim.GetImage(ctx, "victim/app"); err != nil || img.Layers[0].Digest != d {
		t.Errorf("victim's image after the attacks = %+v, %v, want its own layer", img, err)
	}
	// The owner: same content without force, other content with it.
	if _, err := victim.CreateImage(ctx, "victim/app", []string{d}, dsec.ImageConfig{}); err != nil {
		t.Errorf("CreateImage(same content, no force) = %v", err)
	}
	if _, err := victim.CreateImage(ctx, "victim/app", []string{evil}, dsec.ImageConfig{}); !errors.Is(err, dsec.ErrFailedPrecondition) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("CreateImage(other layers, no force) = %v, want FailedPrecondition naming --force", err)
	}
	if img, err := victim.CreateImage(ctx, "victim/app", []string{evil}, dsec.ImageConfig{}, dsec.WithForce()); err != nil || !img.Public {
		t.Errorf("CreateImage(other layers, force) = %+v, %v, want it, still public", img, err)
	}
	if _, err := victim.DeleteImage(ctx, "victim/app"); err != nil {
		t.Errorf("DeleteImage(own) = %v", err)
	}
}

// TestKeysAPI: list (never a secret), revoke (refused at once), expiry,
// and only admin keys manage keys.
func TestKeysAPI(t *testing.T) {
	t.Parallel()
	s := newTenancyServer(t, 0)
	ctx := t.Context()
	secret, k, err := s.admin.CreateKey(ctx, dsec.KeyOptions{Name: "ci", Project: "rl", ExpiresIn: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if k.ExpiresAt.IsZero() || k.ExpiresAt.Sub(k.CreatedAt) != 1500*time.Millisecond {
		t.Errorf("CreateKey(expires 1.5s) = created %v expires %v", k.CreatedAt, k.ExpiresAt)
	}
	keys, err := s.admin.ListKeys(ctx)
	if err != nil || len(keys) != 2 {
		t.Fatalf("ListKeys() = %+v, %v, want the admin key and ci", keys, err)
	}
	user, err := dsec.New(dsec.Config{Addr: s.addr, APIKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()
	if _, err := user.WhoAmI(ctx); err != nil {
		t.Fatalf("WhoAmI(new key) = %v", err)
	}
	if _, err := user.ListKeys(ctx); !errors.Is(err, dsec.ErrPermissionDenied) {
		t.Errorf("ListKeys(user key) = %v, want PermissionDenied", err)
	}
	if _, err := user.RevokeKey(ctx, keys[0].ID); !errors.Is(err, dsec.ErrPermissionDenied) {
		t.Errorf("RevokeKey(user key) = %v, want PermissionDenied", err)
	}
	time.Sleep(time.Until(k.ExpiresAt) + 10*time.Millisecond)
	if _, err := user.WhoAmI(ctx); !errors.Is(err, dsec.ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("WhoAmI(expired key) = %v, want Unauthenticated saying it expired", err)
	}

	other := s.client(t, "rl", dsec.KeyOptions{Name: "other"})
	me, err := other.WhoAmI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.admin.RevokeKey(ctx, me.ID); err != nil || got.Name != "other" {
		t.Fatalf("RevokeKey = %+v, %v", got, err)
	}
	if _, err := other.WhoAmI(ctx); !errors.Is(err, dsec.ErrUnauthenticated) {
		t.Errorf("WhoAmI(revoked key) = %v, want Unauthenticated", err)
	}
	if _, err := s.admin.RevokeKey(ctx, me.ID); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("RevokeKey(revoked) = %v, want NotFound", err)
	}
}

// TestLedger checks the ledger's arithmetic: creates count until a report
// of their node taken after them covers them, never twice.
func TestLedger(t *testing.T) {
	var l projectLedger
	p := cluster.Project{Name: "rl", Limits: cluster.ProjectLimits{Sandboxes: 3}}
	t0 := time.Now()
	report := func(n int64, seen time.Time) []watcher.NodeState {
		return []watcher.NodeState{{
			Node: cluster.Node{Name: "n1"}, Seen: seen, Healthy: true,
			Status: &nodev1.StatusResponse{Projects: map[string]*nodev1.ProjectUsage{"rl": {Sandboxes: n}}},
		}}
	}
	done1, err := l.reserve(p, 1, report(1, t0), t0)
	if err != nil {
		t.Fatal(err)
	}
	done2, err := l.reserve(p, 1, report(1, t0), t0)
	if err != nil {
		t.Fatal(err)
	}
	// 1 reported + 2 in flight: full.
	if _, err := l.reserve(p, 1, report(1, t0), t0); err == nil {
		t.Errorf("reserve(1 reported, 2 in flight, limit 3) = nil, want ResourceExhausted")
	}
	done1("n1", true)
	done2("n1", false) // failed: frees its place
	if _, err := l.reserve(p, 1, report(1, t0), time.Now()); err != nil {
		t.Errorf("reserve(1 reported, 1 recent, 1 in flight... ) = %v", err)
	}
	// A report taken after the creates covers them: 3 reported (the old
	// one, done1's and the in-flight one's, which landed too).
	if _, err := l.reserve(p, 1, report(3, time.Now().Add(time.Second)), time.Now()); err == nil {
		t.Errorf("reserve(3 reported) = nil, want ResourceExhausted")
	}
	l.mu.Lock()
	recent := len(l.recent)
	l.mu.Unlock()
	if recent != 0 {
		t.Errorf("%d recent creates kept after a report covered them, want 0", recent)
	}
}

// GradeFrom checks the grading image as Create does: another project's
// private image is NotFound and never reaches the node.
func TestGradeFromImageVisibility(t *testing.T) {
	t.Parallel()
	s := newTenancyServer(t, 0)
	ctx := t.Context()
	victim := s.client(t, "victim", dsec.KeyOptions{})
	d := s.layer(t, victim, "victim layer")
	if _, err := victim.CreateImage(ctx, "victim/app", []string{d}, dsec.ImageConfig{}); err != nil {
		t.Fatal(err)
	}
	api := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, s.addr)
	for _, tt := range []struct {
		project string
		image   string
		want    connect.Code // 0: forwarded
	}{
		{"mallory", "victim/app", connect.CodeNotFound},
		{"mallory", "nope", connect.CodeNotFound},
		{"mallory", "Bad Name!", connect.CodeInvalidArgument},
		{"victim", "victim/app", 0},
		{"mallory", "", 0},
	} {
		secret, _, err := s.admin.CreateKey(ctx, dsec.KeyOptions{Name: tt.project + "-grade", Project: tt.project})
		if err != nil {
			t.Fatal(err)
		}
		req := connect.NewRequest(&sandboxv1.GradeFromRequest{SandboxId: "n1-aaaaaaaaaaab", Paths: []string{"/w"}, Image: tt.image, Shell: "true"})
		req.Header().Set("Authorization", "Bearer "+secret)
		s.edge.mu.Lock()
		before := s.edge.grades
		s.edge.mu.Unlock()
		_, err = api.GradeFrom(ctx, req)
		s.edge.mu.Lock()
		forwarded := s.edge.grades - before
		s.edge.mu.Unlock()
		switch {
		case tt.want != 0 && (connect.CodeOf(err) != tt.want || forwarded != 0):
			t.Errorf("GradeFrom(%s, image %q) = %v, forwarded %d; want %v, not forwarded", tt.project, tt.image, err, forwarded, tt.want)
		case tt.want == 0 && (err != nil || forwarded != 1):
			t.Errorf("GradeFrom(%s, image %q) = %v, forwarded %d; want it forwarded", tt.project, tt.image, err, forwarded)
		}
	}
}

func (e *countingEdge) GradeFrom(_ context.Context, req *connect.Request[sandboxv1.GradeFromRequest]) (*connect.Response[sandboxv1.GradeFromResponse], error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.grades++
	return connect.NewResponse(&sandboxv1.GradeFromResponse{Exit: &sandboxv1.ExecExit{}}), nil
}
