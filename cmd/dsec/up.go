//go:build !dsec_client

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/server"
	"github.com/dsecproject/dsec/internal/swap"
	"github.com/dsecproject/dsec/internal/uplock"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newUpCmd(g *globalFlags) *cobra.Command {
	var (
		listen, node, runtime, logLevel string
		cgroupParent, diskQuota         string
		detach                          bool
		uidBase, uidCount               uint32
		uidRanges                       int
		overcommit                      float64
		reserve                         string
		fusionListen, fusionKeyFile     string
		fusionRequireKey                bool
		fusionImages                    []string
		fusionPool                      int
		fusionMemory                    string
		warmPool                        int
		lazyLayers                      bool
		blobSource, chunkCache          string
		networkConfig                   string
		chunkCacheSize                  string
		chunkSize                       string
		ceil                            ceilingFlags
		maxRequestSize                  string
		metricsPerSandbox               bool
		portsListen, portsDomain        string
		swapFlag                        string
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: verbShort("up"),
		Long: `Run the single-node platform: API server, placement, watcher, one edge with
the container backend, and an embedded etcd, all in this process (plus one node
keeper process that owns the sandboxes and outlives it).

In the foreground it runs until Ctrl-C or SIGTERM, which stop the platform but
not the sandboxes: the next "dsec up" finds them again; "dsec down" does the
same from another terminal (and "dsec down --all" also deletes the sandboxes).
One dsec up runs per state directory: a second one says which runs (pid, API). With -d it starts in the
background and returns once the API answers (exit 0) or start-up failed.

On first start it writes an admin API key to <state-dir>/admin.key (0600).

For profiling, DSEC_PPROF=127.0.0.1:PORT serves this process's Go profiles
(/debug/pprof/) and DSEC_KEEPER_PPROF=127.0.0.1:PORT the node keeper's.

It also serves the SandboxFusion-compatible run_code API (POST /run_code) on
--sandboxfusion-listen (default 127.0.0.1:8080; empty turns it off). Each call
runs in a sandbox of its own, deleted after it, in the reserved project
dsec-sandboxfusion, which no API key can list, exec into or read: not even an
admin key. SandboxFusion's clients send no credentials, so on loopback calls
need no key unless --sandboxfusion-require-key; beyond loopback every call
needs one. A key is any dsec API key, sent as "Authorization: Bearer <key>"
or in the URL path (http://HOST:PORT/<key>/run_code); it only admits the call.
Build its images first (see docs/sandboxfusion.md):
  scripts/sandboxfusion-images.sh

Sandboxes' listening ports are reachable only through the ports proxy on
--ports-listen (default 127.0.0.1:7422; empty turns it off), never on the API's
address nor on a host port per sandbox: /ID/PORT/... with an API key, and
http://PORT-ID.<--ports-domain>/ for browsers (dsec port ID PORT --browser).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			stateDir := g.resolvedStateDir()
			if detach {
				return upDetached(cmd, stateDir, listen)
			}
			level := slog.LevelInfo
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: use debug, info, warn or error", logLevel)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			if err := servePprof("DSEC_PPROF", log); err != nil {
				return err
			}
			res, err := dsec.ParseSize(reserve)
			if err != nil {
				return fmt.Errorf("--memory-reserve: %w", err)
			}
			fmem, err := dsec.ParseSize(fusionMemory)
			if err != nil {
				return usageErrorf("--sandboxfusion-memory: %v", err)
			}
			images, err := parseKV("--sandboxfusion-image", fusionImages)
			if err != nil {
				return err
			}
			if warmPool == 0 {
				warmPool = -1 // none; zero is the keeper's default
			}
			ccSize, err := dsec.ParseSize(chunkCacheSize)
			if err != nil {
				return usageErrorf("--chunk-cache-size: %v", err)
			}
			cSize, err := dsec.ParseSize(chunkSize)
			if err != nil || cSize < 4096 || cSize > 64<<20 || cSize&(cSize-1) != 0 {
				return usageErrorf("--chunk-size %q: want a power of two from 4K to 64M, such as 1M", chunkSize)
			}
			if fusionPool == 0 {
				fusionPool = -1 // none; zero is the package default
			}
			maxReq, err := dsec.ParseSize(maxRequestSize)
			if err != nil || maxReq < 64<<10 {
				return usageErrorf("--max-request-size %q: want a size of at least 64K, such as 64M", maxRequestSize)
			}
			pidsRes, memRes, err := ceil.parseHost()
			if err != nil {
				return err
			}
			diskRes, err := ceil.parseDisk()
			if err != nil {
				return err
			}
			netCat, err := loadNetworkConfig(&networkConfig)
			if err != nil {
				return err
			}
			swapSpec, err := parseSwap(swapFlag)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return server.Run(ctx, server.Config{
				HostPidsReserve: pidsRes, HostMemoryReserve: memRes,
				DiskReserve: diskRes, DiskOvercommit: ceil.diskOvercommit,
				SandboxFusion: server.FusionConfig{
					Listen: fusionListen, RequireKey: fusionRequireKey, KeyFile: fusionKeyFile, Images: images,
					PoolSize: fusionPool, Memory: fmem,
				},
				StateDir: stateDir, Listen: listen, Node: node, Runtime: runtime,
				CgroupParent: cgroupParent, DiskQuota: diskQuota, WarmPool: warmPool,
				LazyLayers: lazyLayers, BlobSource: blobSource, ChunkCache: chunkCache, ChunkCacheSize: ccSize, ChunkSize: cSize,
				IDMap: rootfs.IDMap{HostID: uidBase, Size: uidCount}, UIDRanges: uidRanges,
				NetworkConfig: networkConfig, Network: netCat,
				Defaults:         sandbox.ContractDefaults,
				MemoryOvercommit: overcommit, MemoryReserve: res,
				MaxRequestBytes: maxReq, MetricsPerSandbox: metricsPerSandbox, Ports: server.PortsConfig{Listen: portsListen, Domain: portsDomain},
				Swap:    swapSpec,
				Version: buildVersion(), Logger: log,
			})
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&detach, "detach", "d", false, "start in the background and return once ready")
	f.StringVar(&listen, "listen", server.DefaultListen, "address of the API (host:port)")
	f.StringVar(&node, "node", "", "name of this node, the prefix of its sandbox IDs (default: from the host name)")
	f.StringVar(&runtime, "runtime", "", "OCI runtime: crun, runc or a path (default: crun if installed, else runc)")
	f.Uint32Var(&uidBase, "uid-base", rootfs.Default.HostID, "first host uid/gid of the sandboxes' id ranges (each sandbox has a range of its own)")
	f.Uint32Var(&uidCount, "uid-count", rootfs.Default.Size, "uids/gids per sandbox (the size of each sandbox's range)")
	f.IntVar(&uidRanges, "uid-ranges", 0, "how many sandboxes' id ranges follow --uid-base, which bounds the sandboxes held at once (0: 16384, or as many as fit below 2^32)")
	f.Float64Var(&overcommit, "memory-overcommit", 4, "memory limits may add up to this many times the node's memory")
	f.StringVar(&reserve, "memory-reserve", "512M", "refuse new sandboxes while less memory than this is available")
	ceil.registerHost(f)
	ceil.registerDisk(f)
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error (the node keeper takes DSEC_LOG_LEVEL)")
	f.StringVar(&cgroupParent, "cgroup-parent", "dsec", "cgroup (under each hierarchy's root) that holds every sandbox's cgroup")
	f.StringVar(&fusionListen, "sandboxfusion-listen", server.DefaultFusionListen, "address of the SandboxFusion-compatible run_code API (host:port); empty turns it off")
	f.BoolVar(&fusionRequireKey, "sandboxfusion-require-key", false, "make every SandboxFusion call bring a dsec API key (Authorization: Bearer <key>, or the URL path /<key>/run_code) on loopback too; beyond loopback one is always required")
	f.StringVar(&fusionKeyFile, "sandboxfusion-key-file", "", "file with the one API key the SandboxFusion API accepts from clients (default: any valid key); beyond loopback it may not be the admin key")
	f.StringArrayVar(&fusionImages, "sandboxfusion-image", nil, "image of a SandboxFusion language, LANG=IMAGE (repeatable; defaults: python=sandboxfusion/python, bash=sandboxfusion/bash, go=sandboxfusion/go)")
	f.IntVar(&fusionPool, "sandboxfusion-pool", 4, "sandboxes created ahead per SandboxFusion image, each used by one call (0 for none)")
	f.StringVar(&fusionMemory, "sandboxfusion-memory", "1G", "memory limit of SandboxFusion sandboxes when a call sets no memory_limit_MB")
	f.StringVar(&diskQuota, "disk-quota", "auto", "how writable layers are size-limited: auto, project (XFS project quotas), image (a file system image per sandbox) or off")
	f.IntVar(&warmPool, "warm-pool", 2, "sandboxes of each recently created shape (image and resources) kept started ahead, so that a create claims one; 0 for none")
	f.BoolVar(&lazyLayers, "lazy-layers", false, "also store every new layer in its lazy form (metadata image + data blob), so nodes with --blob-source mount it on demand")
	f.StringVar(&blobSource, "blob-source", "", "where this node reads lazy layers from: dir:/path (a blob store directory) or http://host:port (dsec blobserver); empty mounts every layer from a local image")
	f.StringVar(&chunkCache, "chunk-cache", "", "directory of the node's chunk cache for lazy layers (default <state-dir>/chunks)")
	f.StringVar(&networkConfig, "network-config", "", "the operator's network config (TOML, docs/network.md): services of the catalogue (which may name internal mirrors), [resolver] upstreams, [hosts]; read at start (default: the built-in catalogue and the host's resolvers)")
	f.StringVar(&chunkCacheSize, "chunk-cache-size", "0", "cap of the chunk cache, e.g. 20G (0: no cap)")
	f.StringVar(&maxRequestSize, "max-request-size", "64M", "largest request body of an API call, and largest message of a stream, on every listener (calls that carry no data, such as create, take at most 1M of it); file, tar and layer uploads stream under their own total limits")
	f.BoolVar(&metricsPerSandbox, "metrics-per-sandbox", false, "also export series per sandbox ID (CPU, memory and their limits; network counters) at /metrics; without it /metrics, which needs no key on loopback, shows only aggregates by project, backend and state")
	f.StringVar(&portsListen, "ports-listen", server.DefaultPortsListen, "address of the ports proxy (host:port), the only way into sandboxes' listening ports: /ID/PORT/... with an API key, http://PORT-ID.<--ports-domain>/ for browsers (see docs/network.md); empty turns it off")
	f.StringVar(&portsDomain, "ports-domain", "localhost", "domain of the ports proxy's host form PORT-ID.DOMAIN (point *.DOMAIN at the proxy; subdomains of localhost resolve to loopback in browsers)")
	f.StringVar(&swapFlag, "swap", "", "a swap file of dsec's own, FILE:SIZE (e.g. /var/lib/dsec-swap:8G), where paused sandboxes' memory goes: made (without holes) and turned on at start, turned off and removed when dsec up stops (dsec down) or by dsec purge, and after a crash by the next dsec up; the host's vm.swappiness is left as it is, and running sandboxes never swap. FILE must not exist and must be on ext4 or xfs. Without it pause only stops sandboxes: their memory stays in RAM")
	f.StringVar(&chunkSize, "chunk-size", "1M", "size of the chunks lazy layers are fetched, verified and cached in: the chunk digests of layers stored with --lazy-layers, and this node's chunk cache (a power of two, 4K-64M; a node refuses layers stored with another size)")
	return cmd
}

// upDetached starts `dsec up` in the background and waits until it is ready
// or has failed.
func upDetached(cmd *cobra.Command, stateDir, listen string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if rec, running, err := uplock.Running(stateDir); running && err == nil {
		return &uplock.RunningError{Record: rec, StateDir: stateDir}
	}
	if err := os.MkdirAll(filepath.Join(stateDir, "logs"), 0o700); err != nil {
		return err
	}
	logPath := filepath.Join(stateDir, "logs", "dsec.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	var args []string
	for _, a := range os.Args[1:] {
		if a == "-d" || a == "--detach" || a == "--detach=true" {
			continue
		}
		args = append(args, a)
	}
	if !strings.Contains(strings.Join(args, " "), "--state-dir") {
		args = append(args, "--state-dir", stateDir)
	}
	c := exec.Command(self, args...)
	c.Stdout, c.Stderr = logf, logf
	c.SysProcAttr = detachAttr()
	if err := c.Start(); err != nil {
		return fmt.Errorf("start dsec up: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	url := "http://" + listen + "/healthz"
	deadline := time.After(90 * time.Second)
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("dsec up exited during start-up (%v); its log:\n%s", err, tail(logPath, 20))
		case <-deadline:
			_ = c.Process.Signal(syscall.SIGTERM)
			return fmt.Errorf("dsec up did not become ready within 90s; see %s", logPath)
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			// Another server may answer the address: only the one
			// started here, once it has bound it, counts.
			if resp.StatusCode == http.StatusOK && startedHere(stateDir, c.Process.Pid) {
				fmt.Fprintf(cmd.OutOrStdout(), "dsec is up at http://%s (pid %d, log %s)\n", listen, c.Process.Pid, logPath)
				return nil
			}
		}
	}
}

// startedHere reports whether the dsec up recorded in stateDir (which
// records itself once it has bound its address) is pid.
func startedHere(stateDir string, pid int) bool {
	rec, running, err := uplock.Running(stateDir)
	return err == nil && running && rec.Pid == pid
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func newKeeperCmd(g *globalFlags) *cobra.Command {
	var (
		runtime, cgroupParent, diskQuota string
		uidBase, uidCount                uint32
		uidRanges                        int
		warmPool                         int
		blobSource, chunkCache           string
		networkConfig                    string
		chunkCacheSize                   int64
		chunkSize                        int64
		ceil                             ceilingFlags
	)
	cmd := &cobra.Command{
		Use:    "keeper",
		Short:  verbShort("keeper"),
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelInfo
			if v := os.Getenv("DSEC_LOG_LEVEL"); v != "" {
				_ = level.UnmarshalText([]byte(v))
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			if err := servePprof("DSEC_KEEPER_PPROF", log); err != nil {
				return err
			}
			pidsRes, memRes, err := ceil.parseHost()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			err = keeper.Run(ctx, keeper.Config{
				HostPidsReserve: pidsRes, HostMemoryReserve: memRes,
				StateDir: g.resolvedStateDir(), Runtime: runtime, CgroupParent: cgroupParent, DiskQuota: diskQuota,
				WarmPool:   warmPool,
				BlobSource: blobSource, ChunkCache: chunkCache, ChunkCacheSize: chunkCacheSize, ChunkSize: chunkSize,
				IDMap: rootfs.IDMap{HostID: uidBase, Size: uidCount}, UIDRanges: uidRanges,
				NetworkConfig: networkConfig,
				Version:       buildVersion(), Logger: log,
			})
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&runtime, "runtime", "", "OCI runtime")
	f.StringVar(&cgroupParent, "cgroup-parent", "dsec", "cgroup holding every sandbox")
	ceil.registerHost(f)
	f.StringVar(&diskQuota, "disk-quota", "auto", "auto, project, image or off")
	f.IntVar(&warmPool, "warm-pool", 0, "warm sandboxes per recent shape (0: the default; negative: none)")
	f.StringVar(&blobSource, "blob-source", "", "blob source of lazy layers (dir:/path or http://host:port)")
	f.StringVar(&chunkCache, "chunk-cache", "", "chunk cache directory (default <state>/chunks)")
	f.StringVar(&networkConfig, "network-config", "", "the operator's network config file (default: the built-in catalogue)")
	f.Int64Var(&chunkCacheSize, "chunk-cache-size", 0, "chunk cache cap in bytes (0: none)")
	f.Int64Var(&chunkSize, "chunk-size", 0, "chunk size of the chunk cache in bytes (0: 1 MiB)")
	f.Uint32Var(&uidBase, "uid-base", rootfs.Default.HostID, "first host uid/gid of the sandboxes' range")
	f.Uint32Var(&uidCount, "uid-count", rootfs.Default.Size, "ids per sandbox")
	f.IntVar(&uidRanges, "uid-ranges", 0, "sandboxes' id ranges (0: the default)")
	return cmd
}

// parseSwap reads --swap FILE:SIZE (the last colon splits them); FILE is
// made absolute. Empty: no swap file.
func parseSwap(v string) (swap.Spec, error) {
	if v == "" {
		return swap.Spec{}, nil
	}
	i := strings.LastIndexByte(v, ':')
	if i <= 0 || i == len(v)-1 {
		return swap.Spec{}, usageErrorf("--swap %q: want FILE:SIZE, such as /var/lib/dsec-swap:8G", v)
	}
	size, err := dsec.ParseSize(v[i+1:])
	if err != nil {
		return swap.Spec{}, usageErrorf("--swap %q: size: %v", v, err)
	}
	path, err := filepath.Abs(v[:i])
	if err != nil {
		return swap.Spec{}, usageErrorf("--swap %q: %v", v, err)
	}
	spec := swap.Spec{Path: path, Size: size}
	if err := spec.Validate(); err != nil {
		return swap.Spec{}, usageErrorf("--swap: %v", err)
	}
	return spec, nil
}

// loadNetworkConfig checks dsec up's --network-config file, makes *path
// absolute (the keeper reads it too, from another working directory) and
// returns its catalogue; nil without a file (the built-in one).
func loadNetworkConfig(path *string) (*netpolicy.Catalogue, error) {
	if *path == "" {
		return nil, nil
	}
	abs, err := filepath.Abs(*path)
	if err != nil {
		return nil, usageErrorf("--network-config %s: %v", *path, err)
	}
	cat, err := netpolicy.LoadCatalogue(abs)
	if err != nil {
		return nil, usageErrorf("--network-config: %v", err)
	}
	*path = abs
	return cat, nil
}
