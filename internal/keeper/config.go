package keeper

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"time"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/nsexec"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// Config configures a keeper. The zero value of every field but StateDir
// works.
type Config struct {
	StateDir string
	// Runtime is the OCI runtime: "crun", "runc" or a path to one of them.
	// Default: crun when installed, else runc.
	Runtime string
	// Self is the dsec binary, statically linked: the sandboxes' init and
	// the exec helper. Default: the running executable.
	Self string
	// IDMap is the first of the sandboxes' host id ranges: each sandbox
	// gets a range of its own, of IDMap.Size ids, the i-th starting at
	// IDMap.HostID + i*IDMap.Size. Default rootfs.Default.
	IDMap rootfs.IDMap
	// UIDRanges is how many such ranges there are, which bounds the
	// sandboxes a node holds at once. Default 16384, or as many as fit
	// below 2^32.
	UIDRanges int
	// CgroupParent holds every sandbox's cgroup. Default "dsec".
	CgroupParent string
	// HostPidsReserve and HostMemoryReserve are the tasks and memory kept
	// for the host, out of every sandbox's reach: CgroupParent's pids.max
	// is the host's task limit (pid_max, or threads-max when lower) minus
	// HostPidsReserve, its memory limit MemTotal minus HostMemoryReserve.
	// Defaults ceiling.PidsReserve (25%, at least 4,096 tasks) and
	// ceiling.MemoryReserve (10%, at least 1 GiB).
	HostPidsReserve   ceiling.Reserve
	HostMemoryReserve ceiling.Reserve
	// OutputLimit caps each exec output stream. Default 16 MiB.
	OutputLimit int64
	// OutputQuota caps the exec output a sandbox keeps in all, until it is
	// deleted. Default 256 MiB.
	OutputQuota int64
	// DiskQuota is how writable layers are limited: "auto" (default:
	// project quotas where the kernel has them, else one file system
	// image per sandbox), "project", "image" or "off".
	DiskQuota string
	// DiskSize is the size of the node-level quota file system (project
	// mode; default: diskquota's).
	DiskSize int64
	// DiskPool is how many writable-layer disks of DiskPoolBytes are kept
	// ready (default 8; negative: none), DiskPoolBytes their size (default
	// 10 GiB, CONTRACT.md's default disk).
	DiskPool      int
	DiskPoolBytes int64
	// WarmPool is how many sandboxes of each recently created shape
	// (layers and resources) are kept started ahead of time, so that a
	// create only claims one (default 2; negative: none).
	WarmPool int
	// BlobSource, when set, is where lazy layers are read from
	// (blobsource.Open: "dir:/path" or "http://host:port"); without it a
	// layer with a lazy form cannot be mounted.
	BlobSource string
	// ChunkCache is the chunk cache directory (default <StateDir>/chunks),
	// ChunkCacheSize its cap in bytes (default none), ChunkSize its chunk
	// size (default 1 MiB; layers whose chunk digests were made for
	// another size are refused).
	ChunkCache     string
	ChunkCacheSize int64
	ChunkSize      int64
	// LazyReadTimeout bounds one read of a lazy layer's data (default
	// 30s); past it the read fails with EIO.
	LazyReadTimeout time.Duration
	// NetworkConfig is the operator's network config file (TOML,
	// netpolicy.LoadCatalogue: services, resolver upstreams, [hosts]),
	// read when the keeper starts; "" is the built-in catalogue with the
	// host's resolvers. See docs/network.md.
	NetworkConfig string
	// NetworkPool is the sandboxes' address pool (default
	// netns.DefaultPool, 100.64.0.0/10).
	NetworkPool netip.Prefix
	// Version is reported to clients.
	Version string
	Logger  *slog.Logger
}

// DefaultUIDRanges is Config.UIDRanges' default: five times the 3,200
// sandboxes a node holds at most today.
const DefaultUIDRanges = 16384

// usernsLimits are set inside every sandbox's user namespace
// (/proc/sys/user). Each bounds what one user of the sandbox may have of
// the thing; the kernel also charges it to the namespace's owner, the
// sandbox's own host uid, in the host's namespace, where the host's own
// limits bound the whole sandbox. Namespaces beyond the ones the runtime
// makes are not needed: new user namespaces are refused outright (the
// seccomp policy refuses them too) and the others need a capability the
// sandbox lacks, so their limits are a second wall only.
var usernsLimits = []nsexec.Limit{
	{Name: "max_user_namespaces", Value: 0},
	{Name: "max_mnt_namespaces", Value: 32},
	{Name: "max_pid_namespaces", Value: 32},
	{Name: "max_net_namespaces", Value: 32},
	{Name: "max_ipc_namespaces", Value: 32},
	{Name: "max_uts_namespaces", Value: 32},
	{Name: "max_cgroup_namespaces", Value: 32},
	{Name: "max_time_namespaces", Value: 32},
	{Name: "max_inotify_instances", Value: 128},
	{Name: "max_inotify_watches", Value: 65536},
	{Name: "max_fanotify_groups", Value: 16},
	{Name: "max_fanotify_marks", Value: 8192},
}

func (c *Config) setDefaults() error {
	if c.StateDir == "" {
		return errors.New("keeper: no state directory")
	}
	if c.Self == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find own executable: %w", err)
		}
		c.Self = self
	}
	// The settings' defaults are those an edge normalizes its own to
	// when it compares them with a running keeper's.
	n, err := c.Settings().Normalize(c.StateDir)
	if err != nil {
		return err
	}
	c.Runtime, c.CgroupParent = n.Runtime, n.CgroupParent
	c.IDMap, c.UIDRanges = rootfs.IDMap{HostID: n.IDBase, Size: n.IDSize}, n.IDRanges
	c.DiskQuota, c.WarmPool = n.DiskQuota, n.WarmPool
	c.ChunkCache, c.ChunkSize = n.ChunkCache, n.ChunkSize
	if c.OutputLimit == 0 {
		c.OutputLimit = 16 << 20
	}
	if c.OutputQuota == 0 {
		c.OutputQuota = 256 << 20
	}
	if c.DiskPool == 0 {
		c.DiskPool = 8
	}
	if c.DiskPoolBytes == 0 {
		c.DiskPoolBytes = 10 << 30
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// FindRuntime resolves a runtime name or path; "" prefers crun.
func FindRuntime(name string) (string, error) {
	cands := []string{name}
	if name == "" {
		cands = []string{"crun", "runc"}
	}
	for _, c := range cands {
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	if name == "" {
		name = "crun or runc"
	}
	return "", errdefs.Newf(errdefs.ErrFailedPrecondition,
		"OCI runtime %s not found: install it (apt-get install crun) or pass --runtime", name)
}
