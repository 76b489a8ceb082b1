package keeper

import (
	"errors"
	"os"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/nsexec"
)

// zygoteRetry is how long the keeper waits after a zygote failed to start
// before it tries another; execs meanwhile use the helper binary.
const zygoteRetry = 5 * time.Second

// zygotes keeps one exec zygote running: a fork server that starts
// commands in sandboxes without an execve of the dsec binary per exec
// (about half of an exec's cost). It is started on first use and again
// after it dies; when it cannot run, execs fall back to nsexec.Spawn.
type zygotes struct {
	c *containerDriver

	mu sync.Mutex
	// guarded by mu
	cur      *nsexec.Zygote
	failedAt time.Time
	closed   bool
}

// get returns the running zygote, starting one when none runs; nil when
// none can run now.
func (zs *zygotes) get() *nsexec.Zygote {
	zs.mu.Lock()
	defer zs.mu.Unlock()
	if zs.cur != nil || zs.closed {
		return zs.cur
	}
	if !zs.failedAt.IsZero() && time.Since(zs.failedAt) < zygoteRetry {
		return nil
	}
	started := time.Now()
	z, err := nsexec.StartZygote(zs.c.cfg.Self)
	if err != nil {
		zs.failedAt = time.Now()
		zs.c.log.Warn("exec zygote did not start; execs use the helper binary", "err", err)
		return nil
	}
	zs.failedAt = time.Time{}
	zs.cur = z
	exited := zs.c.k.reaper.watch(z.Pid(), started)
	go func() {
		ws := <-exited
		zs.mu.Lock()
		gone := zs.cur == z
		if gone {
			zs.cur = nil
		}
		closed := zs.closed
		zs.mu.Unlock()
		z.Close()
		if gone && !closed {
			zs.c.log.Warn("exec zygote exited; the next exec starts another", "pid", z.Pid(), "status", int(ws))
		}
	}()
	return z
}

// drop forgets z (found unavailable) so that the next get starts another.
func (zs *zygotes) drop(z *nsexec.Zygote) {
	zs.mu.Lock()
	if zs.cur == z {
		zs.cur = nil
	}
	zs.mu.Unlock()
	z.Close()
}

// close stops the zygote; later gets return nil.
func (zs *zygotes) close() {
	zs.mu.Lock()
	z := zs.cur
	zs.cur, zs.closed = nil, true
	zs.mu.Unlock()
	if z != nil {
		z.Close()
	}
}

// spawn starts cfg's command in its sandbox, through the zygote when one
// runs and through the helper binary otherwise, and returns the command's
// host pid. A helper's exit is reaped and dropped.
func (c *containerDriver) spawn(cfg nsexec.ExecConfig, stdio [3]*os.File) (int, error) {
	for range 2 {
		z := c.zyg.get()
		if z == nil {
			break
		}
		child, err := z.Spawn(cfg, stdio)
		if err == nil || !errors.Is(err, errdefs.ErrUnavailable) {
			return child, err
		}
		// The zygote died between requests: the command did not start.
		c.zyg.drop(z)
	}
	started := time.Now()
	helper, child, err := nsexec.Spawn(c.cfg.Self, cfg, stdio)
	if helper > 0 {
		c.k.reaper.watch(helper, started)
	}
	return child, err
}
