package keeper

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/pageout"
)

// How the container driver pauses a sandbox (docs/pause.md has the
// measurements behind each choice):
//
//   - freeze: cgroup2's cgroup.freeze (or v1's freezer) of the sandbox's
//     group; the pause replies once every process is frozen.
//   - move out, in the background: the group may swap (v1 swappiness
//     100, cgroup2 memory.swap.max max); which pages of each process are
//     resident is written to the sandbox's pause.json; every mapping of
//     every process is advised MADV_PAGEOUT (process_madvise), which
//     issues the swap writes of all of it at once; once the writes are
//     done, the group's own reclaim (v1 memory.force_empty, cgroup2
//     memory.reclaim) drops the swap cache left behind and reaches what
//     MADV_PAGEOUT cannot (pages shared by processes, tmpfs, page cache).
//     The limits are never lowered: nothing of the sandbox is OOM-killed
//     by a pause, and out of swap its memory stays in RAM, said so.
//   - resume: the group may no longer swap, MADV_WILLNEED over the ranges
//     pause.json names starts reading them back, and the group thaws at
//     once; the reads go on beside it.

// pauseRecordName is the file in a sandbox's directory that lists what
// was resident when it was paused.
const pauseRecordName = "pause.json"

// pauseRecord is what was resident in each process of a sandbox when it
// was paused.
type pauseRecord struct {
	Procs []pausedProc `json:"procs"`
}

// pausedProc is one process of a paused sandbox: its pid and start time
// (a reused pid is not it) and the ranges of its memory in RAM.
type pausedProc struct {
	Pid       int             `json:"pid"`
	StartTime uint64          `json:"start_time"`
	Resident  []pageout.Range `json:"resident"`
}

// swapReserve is the swap a move out leaves free: with none free the
// kernel's reclaim passes over anonymous memory altogether, and what was
// just written to swap would stay in RAM as well (swap cache).
const swapReserve = 32 << 20

// writebackWait bounds how long a move out waits for its swap writes
// before the group's reclaim (which would wait for them itself, one at a
// time on cgroup v1).
const writebackWait = 30 * time.Second

var _ pauser = (*containerDriver)(nil)

// pauseBusy implements pauser.
func (c *containerDriver) pauseBusy(b *box) error {
	id := b.snapshot().ID
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.packing[id] {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s is being packed: wait for the pack to end, then pause it", id)
	}
	if other := c.sealing[id]; other != "" {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s runs sealed exec %s: wait for it to end, then pause it", id, other)
	}
	return nil
}

// freeze implements pauser.
func (c *containerDriver) freeze(ctx context.Context, b *box) error {
	if err := os.Remove(filepath.Join(b.dir(c.l), pauseRecordName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the last pause's record: %w", err)
	}
	return c.cg.Freeze(ctx, b.snapshot().slot())
}

// thaw implements pauser.
func (c *containerDriver) thaw(ctx context.Context, b *box) error {
	return c.cg.Thaw(ctx, b.snapshot().slot())
}

// allowSwap implements pauser.
func (c *containerDriver) allowSwap(b *box, allow bool) error {
	return c.cg.AllowSwap(b.snapshot().slot(), allow)
}

// pausedMark is the cgroup mark (cgroup.Manager.SetMark) that records a
// sandbox paused: an extended attribute of its group, which lives in the
// kernel as long as the sandbox. A file in the sandbox's directory did the
// same but waited on the file system's journal: up to 27 ms under the swap
// writes of other pauses; rewriting keeper.json costs 2-3 ms always (ext4
// writes a renamed-over file's data out at the rename).
const pausedMark = "paused"

// setPaused implements pauser.
func (c *containerDriver) setPaused(b *box, paused bool) error {
	return c.cg.SetMark(b.snapshot().slot(), pausedMark, paused)
}

// recordedPaused implements pauser.
func (c *containerDriver) recordedPaused(info SandboxInfo) bool {
	on, err := c.cg.HasMark(info.slot(), pausedMark)
	if err != nil && !errdefs.Is(err, errdefs.ErrNotFound) {
		c.log.Warn("read whether a sandbox is paused", "sandbox", info.ID, "err", err)
	}
	return on
}

// memory implements pauser.
func (c *containerDriver) memory(b *box) (PauseInfo, error) {
	m, err := c.cg.Memory(b.snapshot().slot())
	if err != nil {
		return PauseInfo{}, err
	}
	return PauseInfo{Resident: m.Resident, Swapped: m.Swapped, Locked: m.Unevictable}, nil
}

// moveOut implements pauser.
func (c *containerDriver) moveOut(ctx context.Context, b *box) (string, error) {
	info := b.snapshot()
	slot, path := info.slot(), filepath.Join(b.dir(c.l), pauseRecordName)
	tm := newPhases("pausemove")
	defer func() { c.log.Debug("pause move phases", "sandbox", info.ID, "ms", tm.String()) }()
	if err := c.cg.AllowSwap(slot, true); err != nil {
		return "", err
	}
	pids, err := c.cg.Procs(slot)
	if err != nil {
		return "", err
	}
	var procs []*pageout.Process
	defer func() {
		for _, p := range procs {
			p.Close()
		}
	}()
	for _, pid := range pids {
		p, err := pageout.Open(pid)
		if errdefs.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return "", err
		}
		procs = append(procs, p)
	}
	// What is resident now is what a resume reads back; a record of this
	// pause (a keeper restarted during its move) is kept.
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		var rec pauseRecord
		for _, p := range procs {
			st, err := ProcStartTime(p.Pid())
			if err != nil {
				continue // ended
			}
			res, err := p.Resident()
			if errdefs.Is(err, errdefs.ErrNotFound) {
				continue
			}
			if err != nil {
				return "", err
			}
			rec.Procs = append(rec.Procs, pausedProc{Pid: p.Pid(), StartTime: st, Resident: res})
		}
		if err := writeJSON(path, rec); err != nil {
			return "", fmt.Errorf("record the resident memory: %w", err)
		}
	}
	tm.mark("record")
	total, _ := hostSwap()
	if total > 0 {
		// In pieces, each no larger than the swap left above the reserve
		// (a mapping's size bounds what of it is resident).
	procs:
		for _, p := range procs {
			maps, err := p.Mappings()
			if errdefs.Is(err, errdefs.ErrNotFound) {
				continue
			}
			if err != nil {
				return "", err
			}
			for len(maps) > 0 {
				_, free := hostSwap()
				if free <= swapReserve {
					break procs
				}
				var head []pageout.Range
				head, maps = pageout.Split(maps, uint64(min(free-swapReserve, pageout.ChunkBytes)))
				if _, err := p.Advise(ctx, head, pageout.PageOut); err != nil && !errdefs.Is(err, errdefs.ErrNotFound) {
					return "", err
				}
			}
		}
		tm.mark("pageout")
		// Let the swap writes end before the group's reclaim, which on v1
		// would wait for them one page at a time.
		wctx, cancel := context.WithTimeout(ctx, writebackWait)
		err := waitUntil(wctx, func() (bool, error) {
			m, err := c.cg.Memory(slot)
			return m.Writeback == 0, err
		})
		cancel()
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return "", err
		}
		tm.mark("writeback")
	}
	if err := c.cg.Reclaim(ctx, slot); err != nil {
		return "", err
	}
	tm.mark("reclaim")
	m, err := c.cg.Memory(slot)
	if err != nil {
		return "", err
	}
	return leftWarning(m.Resident, m.Swapped, m.Unevictable, total), nil
}

// leftWarning says why a paused sandbox's memory stayed in RAM, "" when
// little did (at most a tenth, or 16 MiB: page tables, kernel memory).
func leftWarning(resident, swapped, locked, swapTotal int64) string {
	if resident <= max(16<<20, (resident+swapped)/10) {
		return ""
	}
	mib := func(n int64) int64 { return (n + 1<<19) >> 20 }
	switch {
	case swapTotal == 0:
		return fmt.Sprintf("%d MiB stay in RAM: the node has no swap (start dsec up with --swap FILE:SIZE)", mib(resident))
	case locked > resident/2:
		return fmt.Sprintf("%d MiB stay in RAM, %d MiB of it locked by the sandbox (mlock)", mib(resident), mib(locked))
	}
	_, free := hostSwap()
	if free < resident {
		return fmt.Sprintf("%d MiB stay in RAM: the node's swap is full (%d MiB free)", mib(resident), mib(free))
	}
	return fmt.Sprintf("%d MiB stay in RAM (%d MiB went to swap)", mib(resident), mib(swapped))
}

// moveBack implements pauser.
func (c *containerDriver) moveBack(ctx context.Context, b *box) error {
	path := filepath.Join(b.dir(c.l), pauseRecordName)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // paused without a record (the move out never began)
	}
	if err != nil {
		return err
	}
	var rec pauseRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	for _, pp := range rec.Procs {
		p, err := pageout.Open(pp.Pid)
		if err != nil {
			continue // ended since
		}
		if st, err := ProcStartTime(pp.Pid); err != nil || st != pp.StartTime {
			p.Close()
			continue // not the process paused
		}
		_, err = p.Advise(ctx, pp.Resident, pageout.WillNeed)
		p.Close()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && !errdefs.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	return os.Remove(path)
}

// hostSwap reads the host's swap size and what is free of it
// (/proc/meminfo), in bytes; zeros when it cannot be read.
func hostSwap() (total, free int64) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "SwapTotal:":
			total = v << 10
		case "SwapFree:":
			free = v << 10
		}
	}
	return total, free
}

// waitUntil calls done every few milliseconds until it reports true or
// fails, or ctx ends.
func waitUntil(ctx context.Context, done func() (bool, error)) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
