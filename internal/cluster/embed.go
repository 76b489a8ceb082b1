package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap/zapcore"

	"github.com/dsecproject/dsec/internal/atomicfile"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// Files StartEmbedded keeps in EmbedConfig.Dir.
const (
	// EmbedDataDir is etcd's data directory (WAL, snapshots, bbolt database).
	EmbedDataDir = "data"
	// EmbedSocket is the unix socket etcd serves clients (etcdctl) on.
	EmbedSocket = "etcd.sock"
	// EmbedEndpointFile holds the client URL of the running etcd
	// (unix:///…/etcd.sock), for `etcdctl --endpoints=$(cat …)`. It exists
	// only while the etcd runs and has a client listener.
	EmbedEndpointFile = "endpoint"
	// embedLockFile is flock(2)ed while an Embedded uses the directory.
	embedLockFile = "lock"
)

// DefaultEmbedStartTimeout bounds StartEmbedded when EmbedConfig.StartTimeout
// is zero.
const DefaultEmbedStartTimeout = 30 * time.Second

// maxSocketPath is the longest unix socket path every supported OS accepts
// (sun_path is 108 bytes on Linux, 104 on the BSDs, including the NUL).
const maxSocketPath = 103

// embedPeerURL is the peer URL the single member advertises. The embedded
// member has no peers and opens no peer listener; etcd still needs a peer URL
// to derive the member ID and to write the membership, and this one can
// never be dialled.
const embedPeerURL = "http://127.0.0.1:0"

// EmbedConfig configures StartEmbedded. Only Dir is required.
type EmbedConfig struct {
	// Dir holds everything the embedded etcd writes (see EmbedDataDir,
	// EmbedSocket, EmbedEndpointFile). It is created with mode 0700 if
	// missing and tightened to 0700 if it is looser, because whoever can
	// reach the socket can rewrite the cluster state.
	Dir string
	// Logger receives etcd's own warnings and errors (nothing below Warn).
	// Nil logs them to stderr.
	Logger *slog.Logger
	// StartTimeout bounds how long StartEmbedded waits for etcd to become
	// ready, in addition to ctx. Zero means DefaultEmbedStartTimeout.
	StartTimeout time.Duration
}

// Embedded is a single-member etcd running inside this process.
//
// It never listens on TCP: clients inside the process use Client, which
// calls the server directly; tools such as etcdctl use the unix socket named
// by Endpoint. There is no peer listener.
type Embedded struct {
	dir      string
	endpoint string // "" when the socket path is too long to bind
	etcd     *embed.Etcd
	client   *clientv3.Client
	unlock   func()

	closeOnce sync.Once
	closeErr  error
}

// StartEmbedded starts an etcd with its data in cfg.Dir and waits until it
// serves requests. A restart on the same Dir finds the data of the previous
// run. It fails with FailedPrecondition when another Embedded (in this or
// another process) uses Dir, and with DeadlineExceeded when etcd is not
// ready within the timeout.
func StartEmbedded(ctx context.Context, cfg EmbedConfig) (_ *Embedded, err error) {
	if cfg.Dir == "" {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "embedded etcd: no directory given")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	timeout := cfg.StartTimeout
	if timeout <= 0 {
		timeout = DefaultEmbedStartTimeout
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", dir, err)
	}
	if err := prepareDir(dir, lg); err != nil {
		return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
	}

	unlock, err := lockFile(filepath.Join(dir, embedLockFile))
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"embedded etcd in %s: the directory is in use by another dsec process; stop it or use another state directory", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			unlock()
		}
	}()

	ecfg, endpoint := embedEtcdConfig(dir, lg)
	if endpoint == "" {
		lg.Warn("embedded etcd: directory path too long for a unix socket; etcd serves only this process",
			"dir", dir, "max_socket_path", maxSocketPath)
	}
	// A stale endpoint file of a crashed run must not point tools at nothing.
	if err := os.Remove(filepath.Join(dir, EmbedEndpointFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
	}

	etcd, err := embed.StartEtcd(ecfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			etcd.Close()
		}
	}()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-etcd.Server.ReadyNotify():
	case err := <-etcd.Err():
		return nil, fmt.Errorf("start embedded etcd in %s: %w", dir, err)
	case <-etcd.Server.StopNotify():
		return nil, fmt.Errorf("start embedded etcd in %s: etcd stopped before it was ready (see its log above)", dir)
	case <-ctx.Done():
		return nil, fmt.Errorf("start embedded etcd in %s: %w", dir, ctx.Err())
	case <-timer.C:
		return nil, errdefs.Newf(errdefs.ErrDeadlineExceeded,
			"start embedded etcd in %s: not ready after %s; check that the disk is not full or very slow, and see etcd's log above", dir, timeout)
	}

	if endpoint != "" {
		sock := filepath.Join(dir, EmbedSocket)
		if err := os.Chmod(sock, 0o600); err != nil {
			return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
		}
		if err := atomicfile.WriteFile(filepath.Join(dir, EmbedEndpointFile), []byte(endpoint+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
		}
	}
	return &Embedded{
		dir:      dir,
		endpoint: endpoint,
		etcd:     etcd,
		client:   v3client.New(etcd.Server),
		unlock:   unlock,
	}, nil
}

// prepareDir creates dir 0700, or tightens it to 0700.
func prepareDir(dir string, lg *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		lg.Info("embedded etcd: restricting directory to its owner",
			"dir", dir, "mode", fi.Mode().Perm().String())
		if err := os.Chmod(dir, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// embedEtcdConfig returns the etcd configuration for a single member in dir,
// and the client URL it serves on ("" when it cannot bind a socket there).
func embedEtcdConfig(dir string, lg *slog.Logger) (*embed.Config, string) {
	cfg := embed.NewConfig()
	cfg.Name = "dsec"
	cfg.Dir = filepath.Join(dir, EmbedDataDir)
	cfg.InitialClusterToken = "dsec-embedded"
	cfg.ClusterState = embed.ClusterStateFlagNew // ignored once the data exists

	peer, _ := url.Parse(embedPeerURL)
	cfg.ListenPeerUrls = nil
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + embedPeerURL

	var endpoint string
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = nil, nil
	if sock := filepath.Join(dir, EmbedSocket); len(sock) <= maxSocketPath {
		u := url.URL{Scheme: "unix", Path: sock}
		endpoint = u.String()
		cfg.ListenClientUrls = []url.URL{u}
		cfg.AdvertiseClientUrls = []url.URL{u}
	}
	cfg.ListenMetricsUrls = nil
	cfg.EnableGRPCGateway = false
	cfg.EnablePprof = false

	// Cluster state is small and changes rarely; keep an hour of history.
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = "1h"

	cfg.LogLevel = "warn"
	cfg.LogOutputs = nil
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newZapLogger(lg, zapcore.WarnLevel))
	return cfg, endpoint
}

// Client returns a client that calls the server inside this process, without
// a socket. It is valid until Close; do not close it yourself.
func (e *Embedded) Client() *clientv3.Client { return e.client }

// Endpoint returns the URL tools outside the process reach etcd at
// (unix:///…/etcd.sock), or "" when Dir was too long to hold a socket.
func (e *Embedded) Endpoint() string { return e.endpoint }

// Dir returns the absolute directory etcd keeps its files in.
func (e *Embedded) Dir() string { return e.dir }

// Done is closed when the etcd server has stopped, after Close or because it
// failed.
func (e *Embedded) Done() <-chan struct{} { return e.etcd.Server.StopNotify() }

// Close closes the client, stops etcd, waits for it, removes the endpoint
// file and releases the directory. It is safe to call more than once.
func (e *Embedded) Close() error {
	e.closeOnce.Do(func() {
		var errs []error
		if err := e.client.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("close etcd client: %w", err))
		}
		e.etcd.Close()
		<-e.etcd.Server.StopNotify()
		if e.endpoint != "" {
			if err := os.Remove(filepath.Join(e.dir, EmbedEndpointFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		e.unlock()
		if err := errors.Join(errs...); err != nil {
			e.closeErr = fmt.Errorf("stop embedded etcd in %s: %w", e.dir, err)
		}
	})
	return e.closeErr
}
