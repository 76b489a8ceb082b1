package container

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

// TestKeeperSettingsChange starts the backend again with other settings
// while a sandbox runs, as `dsec up` started again with other flags does.
// Before protocol 3 every one of these was ignored silently (the running
// keeper kept its settings until `dsec purge`): now a live setting is
// changed in place, a restart setting gets a new keeper that adopts the
// sandbox (refused while an exec runs, which it would lose), a fixed one
// is refused with the flag to pass, and a keeper of another dsec version
// is replaced.
func TestKeeperSettingsChange(t *testing.T) {
	n := newNode(t)
	open := func(t *testing.T, f func(*Config)) (*Backend, error) {
		t.Helper()
		cfg := Config{StateDir: n.stateDir, Self: n.self, CgroupParent: n.cgroupParent,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
		f(&cfg)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return New(ctx, cfg)
	}
	ctx := context.Background()
	b, err := open(t, func(*Config) {})
	if err != nil {
		t.Fatal(err)
	}
	const id = "settings-1"
	if _, err := b.Create(ctx, sandbox.Spec{ID: id, Layers: n.layers, Resources: sandbox.Resources{MemoryBytes: 64 << 20, CPUs: 1, Pids: 64, DiskBytes: 64 << 20}}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	defer func() {
		if err := b.Delete(ctx, id); err != nil {
			t.Errorf("Delete = %v", err)
		}
		b.Close()
	}()
	version := func(t *testing.T) keeper.Version {
		t.Helper()
		v, err := keeper.NewClient(n.stateDir).Version(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	works := func(t *testing.T, b *Backend) {
		t.Helper()
		r, err := sandboxtest.ExecErr(ctx, b, id, sandbox.ExecSpec{Argv: []string{"echo", "still"}})
		if err != nil || r.Stdout != "still\n" {
			t.Errorf("exec in the sandbox = %+v, %v; want it to run", r, err)
		}
	}
	reopen := func(t *testing.T, f func(*Config)) {
		t.Helper()
		b.Close()
		nb, err := open(t, f)
		if err != nil {
			t.Fatalf("New = %v", err)
		}
		b = nb
	}

	t.Run("live", func(t *testing.T) {
		before := version(t)
		reopen(t, func(c *Config) { c.WarmPool = 5 })
		after := version(t)
		if after.Pid != before.Pid || after.Settings == nil || after.Settings.WarmPool != 5 {
			t.Errorf("keeper after --warm-pool 5 = pid %d, settings %+v; want pid %d with warm pool 5", after.Pid, after.Settings, before.Pid)
		}
		works(t, b)
	})
	t.Run("restart", func(t *testing.T) {
		before := version(t)
		reopen(t, func(c *Config) { c.WarmPool = 5; c.ChunkSize = 4 << 20 })
		after := version(t)
		if after.Pid == before.Pid || after.Settings == nil || after.Settings.ChunkSize != 4<<20 {
			t.Errorf("keeper after --chunk-size 4M = pid %d (was %d), settings %+v; want a new keeper with 4 MiB chunks", after.Pid, before.Pid, after.Settings)
		}
		if st, err := b.Status(ctx, id); err != nil || st.State != sandbox.StateRunning {
			t.Errorf("Status after the keeper was replaced = %+v, %v; want the sandbox running, adopted", st, err)
		}
		works(t, b)
	})
	t.Run("busy", func(t *testing.T) {
		if err := b.StartExec(ctx, id, sandbox.ExecSpec{ID: "busy", Argv: []string{"sleep", "30"}, Env: []string{"PATH=/bin"}}); err != nil {
			t.Fatal(err)
		}
		b.Close()
		_, err := open(t, func(c *Config) { c.WarmPool = 5; c.ChunkSize = 8 << 20 })
		if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "--chunk-size 4194304 as before") {
			t.Errorf("New(--chunk-size 8M) while an exec runs = %v; want FailedPrecondition saying --chunk-size 4194304", err)
		}
		reopen(t, func(c *Config) { c.WarmPool = 5; c.ChunkSize = 4 << 20 })
		if err := b.Signal(ctx, id, "busy", 9); err != nil {
			t.Fatal(err)
		}
		if st, err := b.WaitExec(ctx, id, "busy"); err != nil || st.Signal != 9 || st.Lost {
			t.Errorf("WaitExec(busy) = %+v, %v; want signal 9: the keeper was kept", st, err)
		}
	})
	t.Run("fixed", func(t *testing.T) {
		b.Close()
		_, err := open(t, func(c *Config) { c.WarmPool = 5; c.ChunkSize = 4 << 20; c.DiskQuota = "off" })
		if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "--disk-quota auto as before") {
			t.Errorf("New(--disk-quota off) with a sandbox = %v; want FailedPrecondition saying --disk-quota auto", err)
		}
		reopen(t, func(c *Config) { c.WarmPool = 5; c.ChunkSize = 4 << 20 })
		works(t, b)
	})
	t.Run("version", func(t *testing.T) {
		before := version(t)
		// An edge of another version than the keeper's binary: the keeper
		// is replaced by this dsec's own.
		reopen(t, func(c *Config) { c.WarmPool = 5; c.ChunkSize = 4 << 20; c.Version = "other-" + before.Version })
		if after := version(t); after.Pid == before.Pid {
			t.Errorf("keeper of version %s kept for an edge of another version", before.Version)
		}
		works(t, b)
	})
}
