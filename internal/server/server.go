// Package server runs the single-node platform of `dsec up`: embedded etcd,
// the apiserver, placement, the watcher and one edge with its backends, in
// one process. The pieces talk through the interfaces they use across
// machines (the edge serves its API on a unix socket that the apiserver
// dials like any remote edge), so the single-node default runs the fleet's
// code.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dsecproject/dsec/internal/apiserver"
	"github.com/dsecproject/dsec/internal/blobstore"
	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/chunkcache"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/edge"
	"github.com/dsecproject/dsec/internal/edge/backend/container"
	"github.com/dsecproject/dsec/internal/edgeclient"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/metrics"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/internal/placement"
	"github.com/dsecproject/dsec/internal/purge"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/swap"
	"github.com/dsecproject/dsec/internal/uplock"
	"github.com/dsecproject/dsec/internal/watcher"
)

// Config configures `dsec up`. Zero fields take CONTRACT.md's defaults.
type Config struct {
	StateDir string
	// Listen is the API address (default 127.0.0.1:7420).
	Listen string
	// Node names this node (default: from the host name).
	Node string
	// Runtime is the OCI runtime of the container backend.
	Runtime string
	// Self is the static dsec binary (default: the running executable).
	Self string
	// CgroupParent is the cgroup holding every sandbox (default "dsec").
	CgroupParent string
	// DiskQuota is how writable layers are limited (keeper.Config).
	DiskQuota string
	// LazyLayers makes stored layers also get their lazy form (a
	// metadata image and a data blob, see internal/lazylayer).
	LazyLayers bool
	// BlobSource, when set ("dir:/path" or "http://host:port"), is where
	// the node reads lazy layers from: layers with a lazy form are then
	// mounted without being downloaded. ChunkCache is the node's chunk
	// cache directory (default <state>/chunks), ChunkCacheSize its cap in
	// bytes (0: none).
	BlobSource     string
	ChunkCache     string
	ChunkCacheSize int64
	// NetworkConfig is the operator's network config file (an absolute
	// path; the keeper reads it), Network its catalogue, which the edge
	// validates policies against; both empty for the built-in catalogue.
	NetworkConfig string
	Network       *netpolicy.Catalogue
	// ChunkSize is the chunk size of lazy layers: of the chunk digests
	// stored with LazyLayers and of the node's chunk cache (0: 1 MiB).
	ChunkSize int64
	// WarmPool is how many sandboxes of each recently created shape the
	// keeper keeps started (0: the default; negative: none; keeper.Config).
	WarmPool int
	IDMap    rootfs.IDMap
	// UIDRanges is how many sandbox id ranges follow IDMap (keeper.Config).
	UIDRanges int
	Defaults  edge.Defaults
	// MemoryOvercommit (default 4) and MemoryReserve (default 512 MiB) are
	// the edge's admission settings.
	MemoryOvercommit float64
	MemoryReserve    int64
	Version          string
	Logger           *slog.Logger
	// HostPidsReserve and HostMemoryReserve are kept for the host out of
	// every sandbox's reach (keeper.Config; zero: the defaults); the edge
	// admits memory against the host's memory minus HostMemoryReserve.
	HostPidsReserve, HostMemoryReserve ceiling.Reserve
	// DiskReserve (zero: ceiling.DiskReserve) and DiskOvercommit (0: 32)
	// are the edge's disk admission settings (edge.Config).
	DiskReserve    ceiling.Reserve
	DiskOvercommit float64
	// Ready is called once the platform serves requests.
	Ready func(addr string)
	// SandboxFusion configures the SandboxFusion-compatible API.
	SandboxFusion FusionConfig
	// MaxRequestBytes bounds the request bodies and stream messages of
	// every API this process serves (0: 64 MiB; internal/reqlimit).
	MaxRequestBytes int64
	// MetricsPerSandbox adds series per sandbox ID to /metrics, which
	// otherwise shows aggregates by project, backend and state only.
	MetricsPerSandbox bool
	// Ports configures the ports proxy (ports.go).
	Ports PortsConfig
	// Swap is the node's swap file, made and turned on at start and
	// turned off and removed when Run returns (swap.go); zero: none (one
	// a crash left on is turned off).
	Swap swap.Spec
}

// DefaultStateDir is where `dsec up` keeps its state.
const DefaultStateDir = "/var/lib/dsec"

// DefaultListen is the API's default address.
const DefaultListen = "127.0.0.1:7420"

// DefaultFusionListen is the SandboxFusion API's default address.
const DefaultFusionListen = "127.0.0.1:8080"

// Run runs the platform until ctx ends, then shuts it down without
// stopping sandboxes.
func Run(ctx context.Context, cfg Config) (err error) {
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger
	if cfg.Node == "" {
		cfg.Node = NodeNameFromHost()
	}
	// 0711: sandboxes' roots are mounted below it, and a runtime sets them
	// up as the sandbox's (unprivileged) root, which must be able to
	// traverse the path; nothing in it can be listed by others.
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		return fmt.Errorf("state dir %s: %w", cfg.StateDir, err)
	}
	if err := os.Chmod(cfg.StateDir, 0o711); err != nil {
		return fmt.Errorf("state dir %s: %w", cfg.StateDir, err)
	}
	for _, d := range []string{"run", "logs"} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, d), 0o700); err != nil {
			return err
		}
	}
	// One `dsec up` per state dir: a second one names the first.
	lock, err := uplock.Acquire(cfg.StateDir)
	if err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	if lock != nil {
		defer lock.Release()
	}
	// Bind first: a busy port is the most common start-up failure.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "listen on %s (--listen): %v", cfg.Listen, err)
	}
	defer ln.Close()
	// Recorded once bound, so that whoever reads it (dsec down, dsec up -d)
	// knows this process is the one serving the address.
	if lock != nil {
		if err := lock.Record(ln.Addr().String()); err != nil {
			return fmt.Errorf("record this dsec up in %s: %w", cfg.StateDir, err)
		}
	}
	fusionLn, err := listenFusion(&cfg.SandboxFusion, cfg.StateDir)
	if err != nil {
		return err
	}
	if fusionLn != nil {
		defer fusionLn.Close()
	}
	portsLn, err := listenPorts(cfg.Ports)
	if err != nil {
		return err
	}
	if portsLn != nil {
		defer portsLn.Close()
	}

	// The swap file, once this process holds the state dir.
	swapOff, err := setupSwap(cfg, log)
	if err != nil {
		return err
	}
	defer swapOff()

	// Tell `dsec purge` what this node uses.
	rc := purge.RunConfig{CgroupParent: cfg.CgroupParent, UpPid: os.Getpid()}
	if rc.CgroupParent == "" {
		rc.CgroupParent = "dsec"
	}
	if b, err := json.Marshal(rc); err == nil {
		_ = os.WriteFile(purge.RunConfigPath(cfg.StateDir), b, 0o600)
	}

	etcd, err := cluster.StartEmbedded(ctx, cluster.EmbedConfig{Dir: filepath.Join(cfg.StateDir, "etcd"), Logger: log})
	if err != nil {
		return err
	}
	defer etcd.Close()
	store := cluster.NewStore(etcd.Client(), cluster.StoreConfig{Logger: log})
	// Revoked keys, changed project limits and images are seen at once.
	cacheWatch := store.WatchCaches()
	defer cacheWatch.Close()
	if _, err := store.EnsureAdminKey(ctx, filepath.Join(cfg.StateDir, "admin.key")); err != nil {
		return fmt.Errorf("admin key: %w", err)
	}
	blobs, err := blobstore.New(filepath.Join(cfg.StateDir, "store"))
	if err != nil {
		return err
	}

	be, err := container.New(ctx, container.Config{
		StateDir: cfg.StateDir, Runtime: cfg.Runtime, Self: cfg.Self, IDMap: cfg.IDMap, UIDRanges: cfg.UIDRanges,
		CgroupParent: cfg.CgroupParent, DiskQuota: cfg.DiskQuota, WarmPool: cfg.WarmPool,
		BlobSource: cfg.BlobSource, ChunkCache: cfg.ChunkCache, ChunkCacheSize: cfg.ChunkCacheSize,
		ChunkSize: cfg.ChunkSize, NetworkConfig: cfg.NetworkConfig,
		Version: cfg.Version, Logger: log,
		HostPidsReserve: cfg.HostPidsReserve, HostMemoryReserve: cfg.HostMemoryReserve,
	})
	if err != nil {
		return err
	}
	defer be.Close()
	ceilings, err := sandboxCeilings(cfg)
	if err != nil {
		return err
	}
	mets := metrics.New()
	if cfg.BlobSource != "" {
		// The chunk cache of lazy layers lives in the keeper: its figures
		// are read from it at each scrape.
		kc := be.Keeper()
		mets.Registry.MustRegister(chunkcache.NewStatsCollector(func() (chunkcache.Stats, bool) {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			st, err := kc.ChunkCacheStats(ctx)
			return st, err == nil
		}))
	}
	ed, err := edge.New(ctx, edge.Config{
		Metrics: mets,
		Node:    cfg.Node, StateDir: cfg.StateDir,
		Backends:       map[string]sandbox.Backend{container.Name: be},
		DefaultBackend: container.Name,
		Images:         &Images{Cluster: store, Blobs: blobs, LazyLayers: cfg.LazyLayers, LazyMount: cfg.BlobSource != "", ChunkSize: cfg.ChunkSize},
		Defaults:       cfg.Defaults, MemoryOvercommit: cfg.MemoryOvercommit, MemoryReserve: cfg.MemoryReserve,
		MetricsPerSandbox: cfg.MetricsPerSandbox, MaxRequestBytes: cfg.MaxRequestBytes,
		MemoryBytes: ceilings.MemoryBytes, PidsCeiling: ceilings.Pids, DiskReserve: cfg.DiskReserve, DiskOvercommit: cfg.DiskOvercommit,
		Network: cfg.Network,
		Version: cfg.Version, Logger: log,
	})
	if err != nil {
		return err
	}
	defer ed.Close()

	token := randomToken()
	edgeSock := filepath.Join(cfg.StateDir, "run", "edge.sock")
	_ = os.Remove(edgeSock)
	edgeLn, err := net.Listen("unix", edgeSock)
	if err != nil {
		return fmt.Errorf("edge socket: %w", err)
	}
	if err := os.Chmod(edgeSock, 0o600); err != nil {
		edgeLn.Close()
		return err
	}
	edgeSrv := &http.Server{Handler: ed.Handler(token), Protocols: h2c(), ReadHeaderTimeout: 10 * time.Second}
	edgeDone := make(chan error, 1)
	go func() { edgeDone <- edgeSrv.Serve(edgeLn) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = edgeSrv.Shutdown(sctx)
		<-edgeDone
	}()

	reg, err := store.RegisterNode(ctx, cluster.Node{
		Name: cfg.Node, Addr: "unix://" + edgeSock, Backends: []string{container.Name},
		Version: cfg.Version,
	})
	if err != nil {
		return err
	}
	defer reg.Close()

	pool := edgeclient.NewPool(token)
	defer pool.Close()
	w := watcher.New(ctx, watcher.Config{Nodes: store, Pool: pool, Logger: log})
	defer w.Close()

	var ready atomic.Bool
	var serviceKeys apiserver.ServiceKeys
	api := apiserver.New(apiserver.Config{
		Cluster: store, Blobs: blobs, Watcher: w, Pool: pool,
		Placer: placement.New(placement.Config{}), DefaultBackend: container.Name,
		Ready: ready.Load, Logger: log, Metrics: mets, LazyLayers: cfg.LazyLayers, LazyChunkSize: cfg.ChunkSize, MaxRequestBytes: cfg.MaxRequestBytes,
		ServiceKeys: &serviceKeys,
	})
	srv := &http.Server{Handler: api.Handler(), Protocols: h2c(), ReadHeaderTimeout: 10 * time.Second}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ln) }()
	stopSandboxAPI, err := serveSandboxAPI(keeper.Layout{StateDir: cfg.StateDir}.SandboxAPISocket(), api, log)
	if err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-srvDone
		return err
	}
	defer stopSandboxAPI()
	ready.Store(true)
	addr := "http://" + ln.Addr().String()
	stopFusion := func() {}
	if fusionLn != nil {
		if cfg.SandboxFusion.MaxBodyBytes == 0 {
			cfg.SandboxFusion.MaxBodyBytes = cfg.MaxRequestBytes
		}
		stop, err := startFusion(ctx, cfg.SandboxFusion, fusionLn, addr, &serviceKeys, api, cfg.Node, mets.Registry, log)
		if err != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			<-srvDone
			return err
		}
		stopFusion = stop
		log.Info("SandboxFusion API is up", "addr", "http://"+fusionLn.Addr().String())
	}
	defer stopFusion()
	stopPorts := func() {}
	if portsLn != nil {
		stopPorts = startPorts(cfg.Ports, portsLn, api, log)
	}
	defer stopPorts()
	log.Info("dsec is up", "api", addr, "node", cfg.Node, "state_dir", cfg.StateDir,
		"admin_key", filepath.Join(cfg.StateDir, "admin.key"))
	if cfg.Ready != nil {
		cfg.Ready(addr)
	}
	select {
	case <-ctx.Done():
	case err := <-srvDone:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("API server: %w", err)
		}
	case <-etcd.Done():
		return errors.New("embedded etcd stopped")
	}
	log.Info("shutting down; sandboxes keep running")
	stopFusion()
	stopPorts()
	ready.Store(false)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-srvDone
	return nil
}

// serveSandboxAPI serves the API for sandboxes (dsec-api) on a Unix
// socket at path that only root can open: the node's egress proxy, in the
// keeper, is its only client. It returns the function that stops it.
func serveSandboxAPI(path string, api *apiserver.Server, log *slog.Logger) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("the API for sandboxes: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("the API for sandboxes: %w", err)
	}
	// Made with no access for anyone but root from the start: a sandbox's
	// processes never see the state dir, and no other local user may
	// speak for a sandbox.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("the API for sandboxes: listen on %s: %w", path, err)
	}
	srv := &http.Server{
		Handler: api.SandboxHandler(), Protocols: h2c(), ReadHeaderTimeout: 10 * time.Second,
		ConnContext: apiserver.SandboxConnContext,
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(apiserver.SandboxListener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("the API for sandboxes stopped", "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// h2c serves HTTP/1.1 and HTTP/2 without TLS (prior knowledge), so gRPC
// and Connect clients can stream over plain loopback connections.
func h2c() *http.Protocols {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &p
}

func randomToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// NodeNameFromHost makes a node name from the host name.
func NodeNameFromHost() string {
	h, _ := os.Hostname()
	h = strings.ToLower(strings.Split(h, ".")[0])
	var b strings.Builder
	for _, c := range h {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteRune(c)
		}
	}
	s := strings.Trim(b.String(), "-")
	if len(s) > 40 {
		s = strings.Trim(s[:40], "-")
	}
	if s == "" {
		s = "node"
	}
	return s
}

// Images resolves images from the cluster state and the local blob store.
type Images struct {
	Cluster *cluster.Store
	Blobs   *blobstore.Dir
	// LazyLayers: StoreLayer also makes the layer's lazy form, with chunk
	// digests for ChunkSize-byte chunks (0: the default).
	LazyLayers bool
	ChunkSize  int64
	// LazyMount: layers with a lazy form resolve to it, not to a local
	// image (the node has a blob source).
	LazyMount bool
}

// Resolve implements edge.ImageResolver.
func (im *Images) Resolve(ctx context.Context, name string) (edge.Image, error) {
	ref, err := cluster.ParseRef(name)
	if err != nil {
		return edge.Image{}, err
	}
	img, err := im.Cluster.GetImage(ctx, ref)
	if err != nil {
		return edge.Image{}, err
	}
	out := edge.Image{Name: ref.String(), Env: img.Config.Env, Workdir: img.Config.Workdir, User: img.Config.User}
	for _, d := range img.Layers {
		if im.LazyMount {
			l, err := im.Cluster.GetLayer(ctx, d)
			if err != nil {
				return edge.Image{}, fmt.Errorf("image %s: %w", ref, err)
			}
			if f := l.Lazy; f != nil {
				out.Layers = append(out.Layers, sandbox.Layer{Digest: d, Lazy: &sandbox.LazyLayer{
					Meta: f.Meta, Data: f.Data, DataSize: f.DataSize, ChunkSize: f.ChunkSize, ChunkDigests: f.ChunkDigests,
				}})
				continue
			}
		}
		p, err := im.Blobs.Path(d)
		if err != nil {
			return edge.Image{}, fmt.Errorf("image %s: layer %s: %w", ref, d, err)
		}
		out.Layers = append(out.Layers, sandbox.Layer{Digest: d, Path: p})
	}
	return out, nil
}
