package keeper

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// Warm sandboxes: the keeper starts a few sandboxes of the shapes it was
// recently asked for (the same layers and resources) before anyone asks
// for them, so that a create of that shape only claims one: it names it,
// sets its hostname and renames its directory, which takes well under a
// millisecond where starting one through the OCI runtime takes ~30 ms.
// Agent workloads create sandboxes of one shape over and over (an RL job,
// an evaluation), so nearly every create after the first is a claim; a
// burst larger than the pool creates the rest as usual while one more is
// started in the background at a time. Warm sandboxes are not the edge's:
// they are not listed, count against no admission, and are removed when
// their shape has not been asked for in a while or the keeper restarts.
//
// A shape whose warm starts fail is retried later and later (warmRetry,
// doubling up to warmRetryMax) and, after warmFailures failures in a row
// or one that can never succeed (an invalid request, a layer not found),
// dropped: it is not kept warm again until warmIdle has passed, and the
// log says so once, at Warn, with the reason. Creates of it go on, started
// as usual.

const (
	// warmPrefix starts the slot of a warm sandbox; it has a character
	// sandbox IDs cannot have, so the names never meet.
	warmPrefix = "warm_"
	// warmShapes bounds how many shapes are kept warm at once.
	warmShapes = 4
	// warmIdle is how long a shape nobody asks for is kept warm.
	warmIdle = 10 * time.Minute
	// warmRetry is the wait after a shape's first failed warm start; it
	// doubles with each failure in a row, up to warmRetryMax.
	warmRetry    = 5 * time.Second
	warmRetryMax = 4 * time.Minute
	// warmFailures failed warm starts of a shape in a row drop it.
	warmFailures = 5
)

// warmKey identifies a shape: the layers and the resources of a create.
type warmKey string

func keyOf(req CreateRequest) warmKey {
	var sb strings.Builder
	for _, l := range req.Layers {
		sb.WriteString(l.Digest)
		sb.WriteByte(' ')
	}
	r := req.Resources
	fmt.Fprintf(&sb, "m%d c%g p%d d%d", r.MemoryBytes, r.CPUs, r.Pids, r.DiskBytes)
	return warmKey(sb.String())
}

type warmShape struct {
	req   CreateRequest // a request of this shape (its ID unused)
	last  time.Time     // when it was last asked for
	ready []*box        // started, unclaimed
	// failures counts the failed warm starts in a row; none is tried
	// before retryAt.
	failures int
	retryAt  time.Time
}

// warmPool keeps warm sandboxes; one goroutine (run) starts them.
type warmPool struct {
	log  *slog.Logger
	kick chan struct{}
	// start starts a warm sandbox of a shape and remove removes one: the
	// container driver's (startOne, Destroy), a fake in tests.
	start  func(ctx context.Context, req CreateRequest) (*box, error)
	remove func(b *box)
	// retry, retryMax and failures are warmRetry, warmRetryMax and
	// warmFailures (shorter in tests).
	retry, retryMax time.Duration
	failures        int

	mu sync.Mutex
	// guarded by mu
	per    int // sandboxes kept ready per shape (0: none)
	shapes map[warmKey]*warmShape
	// dropped holds the shapes dropped for failing, until when they are
	// not kept warm again.
	dropped map[warmKey]time.Time
}

func newWarmPool(c *containerDriver, per int) *warmPool {
	w := newWarmPoolOf(c.log, per)
	w.start = func(ctx context.Context, req CreateRequest) (*box, error) { return startWarm(ctx, c, req) }
	w.remove = func(b *box) { c.Destroy(context.Background(), b) }
	return w
}

// newWarmPoolOf returns a pool that still needs its start and remove.
func newWarmPoolOf(log *slog.Logger, per int) *warmPool {
	return &warmPool{log: log, per: per, kick: make(chan struct{}, 1),
		retry: warmRetry, retryMax: warmRetryMax, failures: warmFailures,
		shapes: map[warmKey]*warmShape{}, dropped: map[warmKey]time.Time{}}
}

// size is how many sandboxes are kept ready per shape.
func (w *warmPool) size() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.per
}

// resize keeps per sandboxes ready per shape from now on (0: none),
// removing those beyond it.
func (w *warmPool) resize(per int) {
	var extra []*box
	w.mu.Lock()
	w.per = max(per, 0)
	for k, s := range w.shapes {
		if len(s.ready) > w.per {
			extra = append(extra, s.ready[w.per:]...)
			s.ready = s.ready[:w.per]
		}
		if w.per == 0 {
			delete(w.shapes, k)
		}
	}
	w.mu.Unlock()
	w.destroy(extra)
	w.poke()
}

func (w *warmPool) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// want records that req's shape was asked for, so that it is kept warm.
func (w *warmPool) want(req CreateRequest) {
	key := keyOf(req)
	w.mu.Lock()
	if until, ok := w.dropped[key]; ok {
		if time.Now().Before(until) {
			w.mu.Unlock()
			return
		}
		delete(w.dropped, key)
	}
	s, ok := w.shapes[key]
	if !ok {
		s = &warmShape{}
		w.shapes[key] = s
	}
	s.req, s.last = req, time.Now()
	var evict []*box
	if len(w.shapes) > warmShapes {
		evict = w.evictOldestLocked()
	}
	w.mu.Unlock()
	w.destroy(evict)
	w.poke()
}

// evictOldestLocked drops the shape asked for longest ago and returns its
// ready sandboxes.
func (w *warmPool) evictOldestLocked() []*box {
	var oldest warmKey
	for k, s := range w.shapes {
		if oldest == "" || s.last.Before(w.shapes[oldest].last) {
			oldest = k
		}
	}
	ready := w.shapes[oldest].ready
	delete(w.shapes, oldest)
	return ready
}

// take returns a ready sandbox of req's shape, or nil.
func (w *warmPool) take(req CreateRequest) *box {
	key := keyOf(req)
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.shapes[key]
	if !ok {
		return nil
	}
	s.req, s.last = req, time.Now()
	defer w.poke()
	if len(s.ready) == 0 {
		return nil
	}
	b := s.ready[0]
	s.ready = s.ready[1:]
	return b
}

// run starts warm sandboxes until ctx ends, one at a time, then removes
// the unclaimed ones.
func (w *warmPool) run(ctx context.Context) {
	defer w.drain()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-tick.C:
		}
		w.expire()
		for ctx.Err() == nil {
			req, ok := w.next()
			if !ok {
				break
			}
			b, err := w.start(ctx, req)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				w.failed(keyOf(req), err)
				continue
			}
			w.mu.Lock()
			s, ok := w.shapes[keyOf(req)]
			if ok {
				s.ready = append(s.ready, b)
				s.failures, s.retryAt = 0, time.Time{}
			}
			w.mu.Unlock()
			if !ok { // its shape was dropped meanwhile
				w.destroy([]*box{b})
			}
		}
	}
}

// failed records that a warm start of shape key failed with err: the
// shape is retried after a longer wait each time, and dropped after
// w.failures in a row or at once when err can never succeed.
func (w *warmPool) failed(key warmKey, err error) {
	w.mu.Lock()
	s, ok := w.shapes[key]
	if !ok {
		w.mu.Unlock()
		return
	}
	s.failures++
	if s.failures < w.failures && !hopeless(err) {
		wait := min(w.retry<<(s.failures-1), w.retryMax)
		s.retryAt = time.Now().Add(wait)
		n := s.failures
		w.mu.Unlock()
		w.log.Debug("start a warm sandbox", "failures", n, "retry_in", wait, "err", err)
		time.AfterFunc(wait, w.poke)
		return
	}
	n := s.failures
	gone := s.ready
	delete(w.shapes, key)
	w.dropped[key] = time.Now().Add(warmIdle)
	w.mu.Unlock()
	w.destroy(gone)
	w.log.Warn("warm sandboxes of a shape keep failing to start: no longer kept warm (creates of it start as usual)",
		"shape", string(key), "failures", n, "for", warmIdle, "err", err)
}

// hopeless reports whether a warm start that failed with err can never
// succeed, however often it is tried.
func hopeless(err error) bool {
	return errdefs.Is(err, errdefs.ErrInvalidArgument) || errdefs.Is(err, errdefs.ErrNotFound) ||
		errdefs.Is(err, errdefs.ErrFailedPrecondition)
}

// next returns a request of the shape most short of warm sandboxes, of
// those not waiting to be retried.
func (w *warmPool) next() (CreateRequest, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	var best *warmShape
	for _, s := range w.shapes {
		if len(s.ready) < w.per && !now.Before(s.retryAt) && (best == nil || len(s.ready) < len(best.ready)) {
			best = s
		}
	}
	if best == nil {
		return CreateRequest{}, false
	}
	return best.req, true
}

// expire drops shapes nobody asked for in warmIdle.
func (w *warmPool) expire() {
	var gone []*box
	w.mu.Lock()
	for k, s := range w.shapes {
		if time.Since(s.last) > warmIdle {
			gone = append(gone, s.ready...)
			delete(w.shapes, k)
		}
	}
	for k, until := range w.dropped {
		if time.Now().After(until) {
			delete(w.dropped, k)
		}
	}
	w.mu.Unlock()
	w.destroy(gone)
}

func (w *warmPool) drain() {
	var all []*box
	w.mu.Lock()
	for k, s := range w.shapes {
		all = append(all, s.ready...)
		delete(w.shapes, k)
	}
	w.mu.Unlock()
	w.destroy(all)
}

func (w *warmPool) destroy(boxes []*box) {
	for _, b := range boxes {
		w.remove(b)
	}
}

// startWarm starts a warm sandbox of req's shape.
func startWarm(ctx context.Context, c *containerDriver, req CreateRequest) (*box, error) {
	slot := warmPrefix + randomHex(8)
	b := c.k.newBox(SandboxInfo{Slot: slot, State: StateCreating})
	b.op.Lock()
	defer b.op.Unlock()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req.ID = ""
	if err := c.start(cctx, b, req); err != nil {
		c.Destroy(context.WithoutCancel(ctx), b)
		return nil, err
	}
	return b, nil
}

// claimWarm makes a warm sandbox of req's shape the sandbox b (a user's,
// not started yet, locked by the caller) and reports whether it did. A
// warm sandbox that cannot be claimed is removed.
func (c *containerDriver) claimWarm(ctx context.Context, b *box, req CreateRequest) bool {
	for {
		wb := c.warm.take(req)
		if wb == nil {
			return false
		}
		err := c.claim(b, wb, req)
		if err == nil {
			return true
		}
		c.log.Warn("claim a warm sandbox", "sandbox", req.ID, "err", err)
		c.Destroy(context.WithoutCancel(ctx), wb)
	}
}

// claim moves the warm sandbox wb into b: the hostname becomes the ID, the
// directory is renamed after it, and b takes over wb's state.
func (c *containerDriver) claim(b, wb *box, req CreateRequest) error {
	wb.op.Lock()
	defer wb.op.Unlock()
	wb.mu.Lock()
	winfo, exitCh := wb.info, wb.initExit
	wb.mu.Unlock()
	if st, err := ProcStartTime(winfo.Pid); err != nil || st != winfo.StartTime {
		return fmt.Errorf("warm sandbox %s: its init is gone", winfo.Slot)
	}
	if err := setHostname(winfo.Pid, req.ID); err != nil {
		return err
	}
	from, to := c.l.SandboxDir(winfo.Slot), c.l.SandboxDir(req.ID)
	if err := os.Rename(from, to); err != nil {
		_ = setHostname(winfo.Pid, winfo.Slot)
		return fmt.Errorf("warm sandbox %s: %w", winfo.Slot, err)
	}
	// The directory is b's now: b's destroy removes it with the rest. The
	// core records b and watches its init.
	info := winfo
	info.ID, info.Driver = req.ID, containerDriverName
	info.Created = time.Now().UTC()
	wb.mu.Lock()
	layers, procs := wb.ct.layers, wb.ct.procs
	wb.ct.layers = nil
	wb.mu.Unlock()
	b.mu.Lock()
	b.info = info
	b.ct.layers, b.ct.procs = layers, procs
	b.initExit = exitCh
	b.mu.Unlock()
	return nil
}

// setHostname sets the hostname of the UTS namespace of process pid. A
// thread that joined another namespace is not given back to the Go
// runtime: it ends with its goroutine.
func setHostname(pid int, name string) error {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	defer unix.Close(fd)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(fd, unix.CLONE_NEWUTS); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("set hostname: join the sandbox's UTS namespace: %w", err)
			return
		}
		if err := unix.Sethostname([]byte(name)); err != nil {
			errc <- fmt.Errorf("set hostname: %w", err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

// isWarmSlot reports whether name is the slot of a warm sandbox.
func isWarmSlot(name string) bool {
	return len(name) > len(warmPrefix) && strings.HasPrefix(name, warmPrefix) && cgroup.ValidName(name)
}
