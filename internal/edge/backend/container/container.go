// Package container is the container backend: Linux namespaces and cgroups
// through an OCI runtime (crun or runc), with a root file system of
// overlayfs over read-only EROFS layers. The node's keeper process owns the
// sandboxes' processes and mounts; this package, in the edge, drives it and
// does file operations from outside the sandbox through the sandbox's own
// view of its file system (/proc/<init>/root), never through a daemon
// inside it.
package container

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// Name is the backend's API name.
const Name = "container"

// Config configures the backend. The zero value of every field but
// StateDir works.
type Config struct {
	StateDir string
	// Runtime is "crun", "runc" or a path; default crun if installed.
	Runtime string
	// Self is the static dsec binary; default the running executable.
	Self string
	// IDMap is the first sandbox's host id range, UIDRanges how many
	// follow (keeper.Config); default rootfs.Default.
	IDMap     rootfs.IDMap
	UIDRanges int
	// CgroupParent is the cgroup holding all sandboxes; default "dsec".
	CgroupParent string
	// HostPidsReserve and HostMemoryReserve are kept for the host out of
	// every sandbox's reach (keeper.Config; zero: the keeper's defaults).
	HostPidsReserve, HostMemoryReserve ceiling.Reserve
	// DiskQuota is how writable layers are limited (keeper.Config).
	DiskQuota string
	// WarmPool is how many sandboxes of each recently created shape the
	// keeper keeps started (0: the keeper's default; negative: none).
	WarmPool int
	// BlobSource, ChunkCache and ChunkCacheSize are the keeper's lazy
	// layer settings (keeper.Config).
	BlobSource     string
	ChunkCache     string
	ChunkCacheSize int64
	ChunkSize      int64
	// NetworkConfig is the operator's network config file the keeper
	// reads (keeper.Config).
	NetworkConfig string
	// MaxFileBytes caps one WriteFile; default 1 GiB.
	MaxFileBytes int64
	// MaxTarBytes caps one tar upload or download; default 4 GiB.
	MaxTarBytes int64
	// Version is this build's version, passed to a keeper it starts.
	Version string
	Logger  *slog.Logger
}

// Backend is the container backend.
type Backend struct {
	cfg    Config
	keeper *keeper.Client
	log    *slog.Logger

	stop chan struct{}
	done chan struct{}
}

// keeperCheckInterval is how often the backend makes sure the node's
// keeper runs, restarting it if it died (its sandboxes are adopted).
const keeperCheckInterval = 2 * time.Second

var _ sandbox.Backend = (*Backend)(nil)

// New connects to the node's keeper, starting one when none runs.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("container backend: no state directory")
	}
	if cfg.IDMap == (rootfs.IDMap{}) {
		cfg.IDMap = rootfs.Default
	}
	if cfg.MaxFileBytes == 0 {
		cfg.MaxFileBytes = 1 << 30
	}
	if cfg.MaxTarBytes == 0 {
		cfg.MaxTarBytes = 4 << 30
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Self == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.Self = self
	}
	b := &Backend{cfg: cfg, keeper: keeper.NewClient(cfg.StateDir), log: cfg.Logger, stop: make(chan struct{}), done: make(chan struct{})}
	if err := b.ensureKeeper(ctx); err != nil {
		b.keeper.Close()
		return nil, err
	}
	go b.watchKeeper()
	return b, nil
}

// watchKeeper restarts the keeper when it stops answering.
func (b *Backend) watchKeeper() {
	defer close(b.done)
	t := time.NewTicker(keeperCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := b.keeper.Version(ctx); err != nil {
			b.log.Warn("the node keeper does not answer; starting it again", "err", err)
			if err := b.ensureKeeper(ctx); err != nil {
				b.log.Error("restart the node keeper", "err", err)
			}
		}
		cancel()
	}
}

// Describe implements sandbox.Backend.
func (b *Backend) Describe() sandbox.Description {
	d := sandbox.Description{Name: Name, Tier: sandbox.TierContainer, Features: []sandbox.Capability{
		sandbox.CapMemoryLimit, sandbox.CapPidsLimit, sandbox.CapTTY, sandbox.CapRestart, sandbox.CapSealedExec,
		sandbox.CapSessions, sandbox.CapStepKeys,
	}}
	if b.cfg.DiskQuota != "off" {
		d.Features = append(d.Features, sandbox.CapDiskLimit)
	}
	return d
}

// Keeper returns the client of the node's keeper.
func (b *Backend) Keeper() *keeper.Client { return b.keeper }

// IDMap is the host id range of the sandboxes.
func (b *Backend) IDMap() rootfs.IDMap { return b.cfg.IDMap }

// Create implements sandbox.Backend.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Status, error) {
	if err := sandbox.CheckSpec(b, spec); err != nil {
		return sandbox.Status{}, err
	}
	info, err := b.keeper.Create(ctx, keeper.CreateRequest{ID: spec.ID, Layers: toKeeperLayers(spec.Layers), Resources: toKeeperResources(spec.Resources)})
	if err != nil {
		return sandbox.Status{}, err
	}
	return status(info), nil
}

// Delete implements sandbox.Backend.
func (b *Backend) Delete(ctx context.Context, id string) error {
	return b.keeper.Delete(ctx, id)
}

// Status implements sandbox.Backend.
func (b *Backend) Status(ctx context.Context, id string) (sandbox.Status, error) {
	info, err := b.keeper.Status(ctx, id)
	if err != nil {
		return sandbox.Status{}, err
	}
	return status(info), nil
}

// List implements sandbox.Backend.
func (b *Backend) List(ctx context.Context) ([]sandbox.Status, error) {
	infos, err := b.keeper.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.Status, len(infos))
	for i, info := range infos {
		out[i] = status(info)
	}
	return out, nil
}

func status(info keeper.SandboxInfo) sandbox.Status {
	return sandbox.Status{ID: info.ID, State: fromKeeperState(info.State), Reason: info.Reason, Pid: info.Pid, RunningExecs: info.RunningExecs, Paused: info.Paused}
}

// Stats implements sandbox.Backend.
func (b *Backend) Stats(ctx context.Context, id string) (sandbox.Stats, error) {
	s, err := b.keeper.Stats(ctx, id)
	if err != nil {
		return sandbox.Stats{}, err
	}
	return sandbox.Stats{
		CPUUsage: s.CPUUsage, MemoryBytes: s.MemoryBytes, MemoryLimit: s.MemoryLimit,
		Pids: s.Pids, PidsLimit: s.PidsLimit, DiskBytes: s.DiskBytes, DiskLimit: s.DiskLimit,
		OOMKills: int64(s.OOMKills), OutputBytes: s.OutputBytes, OutputLimit: s.OutputLimit,
		SwappedBytes: s.SwappedBytes,
	}, nil
}

// WriteStdin implements sandbox.Backend.
func (b *Backend) WriteStdin(ctx context.Context, id, execID string, data []byte, close bool) error {
	return b.keeper.WriteStdin(ctx, keeper.StdinRequest{Sandbox: id, Exec: execID, Data: data, Close: close})
}

// Signal implements sandbox.Backend.
func (b *Backend) Signal(ctx context.Context, id, execID string, sig int) error {
	return b.keeper.Signal(ctx, keeper.SignalRequest{Sandbox: id, Exec: execID, Signal: sig})
}

// ResizeTTY implements sandbox.Backend.
func (b *Backend) ResizeTTY(ctx context.Context, id, execID string, rows, cols uint16) error {
	return b.keeper.Resize(ctx, keeper.ResizeRequest{Sandbox: id, Exec: execID, Rows: rows, Cols: cols})
}

// ListExecs implements sandbox.Backend.
func (b *Backend) ListExecs(ctx context.Context, id string) ([]sandbox.ExecInfo, error) {
	execs, err := b.keeper.ListExecs(ctx, id)
	return fromKeeperExecs(execs), err
}

// Events implements sandbox.EventSource.
func (b *Backend) Events(ctx context.Context, cursor string) ([]sandbox.Event, string, error) {
	evs, next, err := b.keeper.Events(ctx, cursor)
	return fromKeeperEvents(evs), next, err
}

var _ sandbox.EventSource = (*Backend)(nil)

// StartExec implements sandbox.Backend.
func (b *Backend) StartExec(ctx context.Context, id string, spec sandbox.ExecSpec) error {
	if spec.Seal != sandbox.SealNone {
		// An older keeper would ignore the field and run the command
		// unsealed.
		v, err := b.keeper.Version(ctx)
		if err != nil {
			return err
		}
		if v.Protocol < 4 {
			return errdefs.Newf(errdefs.ErrFailedPrecondition,
				"the node keeper (pid %d) speaks keeper protocol %d, which has no sealed execs: restart dsec up once the sandboxes on lazy layers it serves are gone, so that a keeper of this dsec replaces it", v.Pid, v.Protocol)
		}
	}
	if spec.StepKey != "" {
		// An older keeper would ignore the field: the step would run again
		// and nothing would record it.
		v, err := b.keeper.Version(ctx)
		if err != nil {
			return err
		}
		if v.Protocol < stepKeyProtocol {
			return errdefs.Newf(errdefs.ErrFailedPrecondition,
				"the node keeper (pid %d) speaks keeper protocol %d, which has no exec step keys: run the command without a step key, or restart dsec up once the sandboxes on lazy layers it serves are gone, so that a keeper of this dsec replaces it", v.Pid, v.Protocol)
		}
	}
	return b.keeper.StartExec(ctx, keeper.ExecRequest{Sandbox: id, Spec: toKeeperExec(spec)})
}

// stepKeyProtocol is the first keeper protocol with exec step keys.
const stepKeyProtocol = 6

// WaitExec implements sandbox.Backend.
func (b *Backend) WaitExec(ctx context.Context, id, execID string) (sandbox.ExitStatus, error) {
	st, err := b.keeper.WaitExec(ctx, id, execID)
	return fromKeeperExit(st), err
}

// OpenOutput implements sandbox.Backend.
func (b *Backend) OpenOutput(_ context.Context, id, execID string, s sandbox.Stream) (sandbox.Output, error) {
	f, err := os.Open(b.keeper.OutputPath(id, execID, toKeeperStream(s)))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, errdefs.Newf(errdefs.ErrNotFound, "exec %s not found in sandbox %s", execID, id)
		}
		return nil, err
	}
	return output{f}, nil
}

type output struct{ *os.File }

func (o output) Size() (int64, error) {
	st, err := o.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Close releases the keeper connection; sandboxes keep running.
func (b *Backend) Close() error {
	select {
	case <-b.stop:
	default:
		close(b.stop)
		<-b.done
	}
	b.keeper.Close()
	return nil
}

var _ io.ReaderAt = output{}
