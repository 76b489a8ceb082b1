//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/pageout"
	"github.com/dsecproject/dsec/internal/swap"
	"github.com/dsecproject/dsec/internal/testenv"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

const (
	cgroupParent = "dsec-bench-pause"
	rawParent    = "dsec-bench-pause-raw"
	// capWait bounds every wait for memory to move.
	capWait = 2 * time.Minute
)

// bench is one run's shared state.
type bench struct {
	cfg   Config
	d     *harness.Dsec
	kc    *keeper.Client
	raw   *cgroup.Manager
	probe string // the probe binary on the host
	data  []byte // and its bytes
	dir   string
	seq   atomic.Int64
}

func run(cfg Config) (rep *Report, err error) {
	ctx := context.Background()
	rep = &Report{Date: time.Now().UTC(), CPUs: runtime.NumCPU(), LoadStart: harness.LoadAvg(),
		Mechanism: "freeze; pagemap record; process_madvise(MADV_PAGEOUT) of every mapping; wait for writeback; memory.force_empty. Resume: MADV_WILLNEED of the recorded ranges beside the thaw"}
	rep.MemTotal, _ = harness.MemTotal()
	defer func() { rep.LoadEnd = harness.LoadAvg() }()
	dir, err := os.MkdirTemp("", "dsec-bench-pause-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, dir: dir}
	stateDir, swapPath := filepath.Join(dir, "state"), filepath.Join(dir, "swapfile")
	b.d, err = harness.StartDsec(ctx, harness.DsecConfig{Bin: cfg.Bin, StateDir: stateDir, CgroupParent: cgroupParent,
		Args: []string{"--swap", fmt.Sprintf("%s:%dM", swapPath, cfg.Swap>>20), "--warm-pool", "0"}})
	if err != nil {
		return nil, err
	}
	defer func() {
		serr := b.d.Stop(context.WithoutCancel(ctx))
		// dsec up turns its swap file off as it stops; make sure.
		if _, derr := swap.Disable(stateDir, nil); derr != nil {
			serr = errors.Join(serr, derr)
		}
		if swapOn(swapPath) {
			serr = errors.Join(serr, fmt.Errorf("the swap file %s is still on: swapoff it", swapPath))
		}
		if err == nil {
			err = serr
		}
	}()
	b.kc = keeper.NewClient(stateDir)
	defer b.kc.Close()
	root := filepath.Join(dir, "rootfs")
	if err := harness.Busybox(ctx, root); err != nil {
		return rep, err
	}
	if err := b.d.BuildImage(ctx, "busybox", root); err != nil {
		return rep, err
	}
	b.probe = filepath.Join(dir, "probe")
	cmd := exec.Command("go", "build", "-o", b.probe, "./test/adversarial/probe")
	cmd.Dir, cmd.Env = testenv.ModuleRoot(), append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return rep, fmt.Errorf("build the probe: %v\n%s", err, out)
	}
	if b.data, err = os.ReadFile(b.probe); err != nil {
		return rep, err
	}
	if b.raw, err = cgroup.New(cgroup.Config{Parent: rawParent}); err != nil {
		return rep, err
	}
	defer func() {
		if rerr := harness.RemoveCgroupTree(rawParent); rerr != nil && err == nil {
			err = rerr
		}
	}()

	for _, mib := range cfg.Sizes {
		var sbs []sandboxRound
		var raws []rawRound
		for r := range cfg.Rounds {
			// Interleaved: the raw process and the sandbox see the same
			// machine.
			rr, err := b.rawRound(ctx, mib, "pageout+force_empty", "thaw+willneed", false)
			if err != nil {
				return rep, fmt.Errorf("%d MiB, raw round %d: %w", mib, r, err)
			}
			raws = append(raws, rr)
			sr, err := b.sandboxRound(ctx, mib)
			if err != nil {
				return rep, fmt.Errorf("%d MiB, round %d: %w\n%s", mib, r, err, b.d.LogTail(20))
			}
			sbs = append(sbs, sr)
			log.Printf("%d MiB round %d: pause %.2f ms (raw freeze %.2f), 90%% out %.0f ms (raw %.0f), resume→exec %.1f ms, resident %.0f ms (raw %.0f), intact %v",
				mib, r, ms(sr.pause), ms(sr.freeze), ms(sr.out90), ms(rr.out90), ms(sr.resumeExec), ms(sr.resident), ms(rr.back), sr.intact)
		}
		rep.Sizes = append(rep.Sizes, summarize(mib, sbs, raws))
	}
	for _, mib := range cfg.Mechs {
		// Round by round, each mechanism in turn: a busy spell of the
		// machine falls on all of them.
		outs := []string{"squeeze", "force_empty", "pageout", "pageout+force_empty"}
		backs := []string{"demand", "willneed,thaw", "thaw+willneed"}
		rounds := map[string][]rawRound{}
		for r := range cfg.Rounds {
			for _, m := range outs {
				rr, err := b.rawRound(ctx, mib, m, "", false)
				if err != nil {
					return rep, fmt.Errorf("mechanism %s: %w", m, err)
				}
				rounds["out "+m] = append(rounds["out "+m], rr)
			}
			for _, m := range backs {
				rr, err := b.rawRound(ctx, mib, "pageout+force_empty", m, true)
				if err != nil {
					return rep, fmt.Errorf("mechanism %s: %w", m, err)
				}
				rounds["back "+m] = append(rounds["back "+m], rr)
			}
			log.Printf("mechanisms at %d MiB: round %d done", mib, r)
		}
		for _, m := range outs {
			rs := rounds["out "+m]
			mr := MechResult{Kind: "out", Name: m, MiB: mib, Rounds: len(rs)}
			mr.Out90 = msMedian(rs, func(r rawRound) time.Duration { return r.out90 })
			mr.Done = msMedian(rs, func(r rawRound) time.Duration { return r.done })
			mr.OutPct = medianF(rs, func(r rawRound) float64 { return r.outPct })
			rep.Mechs = append(rep.Mechs, mr)
		}
		for _, m := range backs {
			rs := rounds["back "+m]
			mr := MechResult{Kind: "back", Name: m, MiB: mib, Rounds: len(rs)}
			mr.Touch = msMedian(rs, func(r rawRound) time.Duration { return r.touched })
			mr.Back = msMedian(rs, func(r rawRound) time.Duration { return r.back })
			rep.Mechs = append(rep.Mechs, mr)
		}
	}
	if cfg.Many > 0 {
		m, err := b.many(ctx, cfg.Many, cfg.Conc)
		if err != nil {
			return rep, fmt.Errorf("%d sandboxes: %w", cfg.Many, err)
		}
		rep.Many = m
	}
	return rep, nil
}

// sandboxRound is one round of a sandbox through dsec.
type sandboxRound struct {
	freeze, thaw, exec, rpc                               time.Duration // raw freeze and thaw of it, exec round trip, an empty keeper call
	pause, out90, moved, resumeCall, resumeExec, resident time.Duration
	outPct, swapGrow                                      float64
	intact                                                bool
	// Through the API: Get, an exec of `true` running, Pause, and an exec
	// of `true` on the paused sandbox (resumed by it).
	apiGet, apiExec, apiPause, apiResumeExec time.Duration
	// stopped is the keeper's own time to stop it (PauseInfo.Stopped).
	stopped time.Duration
}

// sandboxRound makes a sandbox holding mib MiB, measures it and deletes it.
func (b *bench) sandboxRound(ctx context.Context, mib int) (r sandboxRound, err error) {
	size := int64(mib) << 20
	sb, err := b.d.Client.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 2*size + 128<<20, Disk: 256 << 20, IdleTTL: time.Hour})
	if err != nil {
		return r, err
	}
	defer func() {
		if derr := sb.Delete(context.WithoutCancel(ctx)); derr != nil && err == nil {
			err = derr
		}
	}()
	if err := sb.WriteFile(ctx, "/usr/bin/probe", b.data, dsec.WithMode(0o755), dsec.WithMakeParents()); err != nil {
		return r, err
	}
	if res, err := sb.Shell(ctx, fmt.Sprintf("mkdir -p /tmp/m && (probe memhold -dir /tmp/m %d > /tmp/m/out 2>&1 &)", mib)); err != nil || res.Code() != 0 {
		return r, fmt.Errorf("start memhold: %v %+v", err, res)
	}
	info, err := b.kc.Status(ctx, sb.ID)
	if err != nil {
		return r, err
	}
	rootOf := func(p string) string { return filepath.Join(fmt.Sprintf("/proc/%d/root", info.Pid), p) }
	sum, err := waitFile(ctx, rootOf("/tmp/m/memhold.sum"))
	if err != nil {
		return r, err
	}
	cg, err := cgroupsOf(info.Pid)
	if err != nil {
		return r, err
	}
	time.Sleep(200 * time.Millisecond)
	var fr, th, ex, rpc []time.Duration
	for range 5 {
		tr := time.Now()
		if _, err := b.kc.PauseState(ctx, sb.ID); err != nil {
			return r, err
		}
		rpc = append(rpc, time.Since(tr))
		f, t, err := rawFreezeThaw(cg.v2)
		if err != nil {
			return r, err
		}
		fr, th = append(fr, f), append(th, t)
		e, err := b.execTrue(ctx, sb.ID)
		if err != nil {
			return r, err
		}
		ex = append(ex, e)
	}
	r.freeze, r.thaw, r.exec, r.rpc = median(fr), median(th), median(ex), median(rpc)

	res0 := readInt(filepath.Join(cg.mem, "memory.usage_in_bytes"))
	swap0 := swapUsed()
	t0 := time.Now()
	pi, err := b.kc.Pause(ctx, sb.ID, false)
	if err != nil {
		return r, err
	}
	r.pause, r.stopped = time.Since(t0), pi.Stopped
	r.out90, err = waitFor(ctx, t0, func() bool {
		return readInt(filepath.Join(cg.mem, "memory.usage_in_bytes")) <= res0-size*9/10
	})
	if err != nil {
		return r, fmt.Errorf("90%% out: %w", err)
	}
	r.moved, err = waitFor(ctx, t0, func() bool {
		p, err := b.kc.PauseState(ctx, sb.ID)
		return err == nil && !p.Moving
	})
	if err != nil {
		return r, fmt.Errorf("move out: %w", err)
	}
	r.outPct = 100 * float64(memStat(cg.mem, "total_swap")) / float64(size)
	r.swapGrow = float64(swapUsed()-swap0) / (1 << 20)
	time.Sleep(100 * time.Millisecond)

	t1 := time.Now()
	if _, err := b.kc.Resume(ctx, sb.ID, false); err != nil {
		return r, err
	}
	r.resumeCall = time.Since(t1)
	if _, err := b.execTrue(ctx, sb.ID); err != nil {
		return r, err
	}
	r.resumeExec = time.Since(t1)
	r.resident, err = waitFor(ctx, t1, func() bool { return memStat(cg.mem, "total_swap") <= max(1<<20, size/100) })
	if err != nil {
		return r, fmt.Errorf("back in RAM: %w", err)
	}
	_ = os.Remove(rootOf("/tmp/m/memhold.check"))
	if _, err := b.exec(ctx, sb.ID, "/bin/sh", "-c", "kill -USR1 $(cat /tmp/m/memhold.pid)"); err != nil {
		return r, err
	}
	check, err := waitFile(ctx, rootOf("/tmp/m/memhold.check"))
	if err != nil {
		return r, err
	}
	r.intact = check == sum

	// The same through the API, as users see it: an empty call (Get) and
	// an exec of `true` while running, the Pause call, and, once the
	// memory is out, an exec of `true` on the paused sandbox, which
	// resumes it first (transparent resume).
	var gets, execs []time.Duration
	for range 5 {
		t := time.Now()
		if _, err := b.d.Client.Get(ctx, sb.ID); err != nil {
			return r, err
		}
		gets = append(gets, time.Since(t))
		t = time.Now()
		if res, err := sb.Exec(ctx, []string{"/bin/true"}); err != nil || res.Code() != 0 {
			return r, fmt.Errorf("exec through the API: %v %+v", err, res)
		}
		execs = append(execs, time.Since(t))
	}
	r.apiGet, r.apiExec = median(gets), median(execs)
	t2 := time.Now()
	if _, err := sb.Pause(ctx); err != nil {
		return r, err
	}
	r.apiPause = time.Since(t2)
	if _, err := waitFor(ctx, t2, func() bool {
		p, err := b.kc.PauseState(ctx, sb.ID)
		return err == nil && !p.Moving
	}); err != nil {
		return r, fmt.Errorf("move out (API): %w", err)
	}
	time.Sleep(100 * time.Millisecond)
	t3 := time.Now()
	if res, err := sb.Exec(ctx, []string{"/bin/true"}); err != nil || res.Code() != 0 {
		return r, fmt.Errorf("exec on a paused sandbox: %v %+v", err, res)
	}
	r.apiResumeExec = time.Since(t3)
	return r, nil
}

// rawRound is one round of a process in a plain cgroup of the
// benchmark's own, moved out and back by the named mechanisms.
type rawRound struct {
	out90, done   time.Duration // until 90% left RAM (-1: never), until the mechanism returned
	outPct        float64
	touched, back time.Duration // until the process read all its memory (with a back mechanism), until it is in RAM
}

// rawRound holds mib MiB in a process of the raw cgroup, pushes it out
// with out and brings it back with back ("" skips that); with touch the
// process then reads all of its memory.
func (b *bench) rawRound(ctx context.Context, mib int, out, back string, touch bool) (r rawRound, err error) {
	size := int64(mib) << 20
	const name = "raw"
	if err := b.raw.Create(name, cgroup.Resources{MemoryBytes: 2*size + 128<<20}); err != nil {
		return r, err
	}
	defer func() {
		if derr := b.raw.Delete(context.WithoutCancel(ctx), name); derr != nil && err == nil {
			err = derr
		}
	}()
	if err := b.raw.AllowSwap(name, true); err != nil {
		return r, err
	}
	procs, err := b.raw.ProcsFiles(name)
	if err != nil {
		return r, err
	}
	mdir := filepath.Join(b.dir, fmt.Sprintf("raw%d", b.seq.Add(1)))
	if err := os.MkdirAll(mdir, 0o755); err != nil {
		return r, err
	}
	defer os.RemoveAll(mdir)
	var join strings.Builder
	for _, f := range procs {
		fmt.Fprintf(&join, "echo $$ > %s && ", f)
	}
	cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf("%sexec %s memhold -dir %s %d > %s/out 2>&1", join.String(), b.probe, mdir, mib, mdir))
	if err := cmd.Start(); err != nil {
		return r, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if _, err := waitFile(ctx, filepath.Join(mdir, "memhold.sum")); err != nil {
		return r, err
	}
	p, err := pageout.Open(cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	defer p.Close()
	time.Sleep(200 * time.Millisecond)
	if err := b.raw.Freeze(ctx, name); err != nil {
		return r, err
	}
	resident, err := p.Resident()
	if err != nil {
		return r, err
	}
	m0, err := b.raw.Memory(name)
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	done := make(chan error, 1)
	go func() { done <- b.rawOut(ctx, name, p, out, size) }()
	r.out90 = -1
	cap90 := time.After(capWait)
wait:
	for r.out90 < 0 {
		if m, _ := b.raw.Memory(name); m.Resident <= m0.Resident-size*9/10 {
			r.out90 = time.Since(t0)
			break
		}
		select {
		case err := <-done:
			done <- err
			if r.done == 0 {
				r.done = time.Since(t0)
				// pageout alone returns with its writes in flight:
				// give it a while longer to show.
				cap90 = time.After(5 * time.Second)
			}
		case <-cap90:
			break wait
		case <-time.After(time.Millisecond):
		}
	}
	if err := <-done; err != nil {
		return r, err
	}
	if r.done == 0 {
		r.done = time.Since(t0)
	}
	m1, err := b.raw.Memory(name)
	if err != nil {
		return r, err
	}
	r.outPct = 100 * float64(m1.Swapped) / float64(size)
	if back == "" {
		return r, nil
	}
	time.Sleep(100 * time.Millisecond)
	t1 := time.Now()
	switch back {
	case "demand":
		err = b.raw.Thaw(ctx, name)
	case "willneed,thaw":
		if _, err = p.Advise(ctx, resident, pageout.WillNeed); err == nil {
			err = b.raw.Thaw(ctx, name)
		}
	case "thaw+willneed":
		go func() { _, _ = p.Advise(ctx, resident, pageout.WillNeed) }()
		err = b.raw.Thaw(ctx, name)
	default:
		err = fmt.Errorf("back mechanism %q is unknown", back)
	}
	if err != nil {
		return r, err
	}
	if touch {
		// The process reads all of its memory: what a resumed program
		// that uses it sees.
		if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			return r, err
		}
		if _, err := waitFile(ctx, filepath.Join(mdir, "memhold.check")); err != nil {
			return r, err
		}
		r.touched = time.Since(t1)
	}
	r.back, err = waitFor(ctx, t1, func() bool {
		m, err := b.raw.Memory(name)
		return err == nil && m.Swapped <= max(1<<20, size/100)
	})
	return r, err
}

// rawOut moves the raw cgroup's memory out with mechanism mech.
func (b *bench) rawOut(ctx context.Context, name string, p *pageout.Process, mech string, size int64) error {
	switch mech {
	case "squeeze":
		dir := filepath.Join("/sys/fs/cgroup/memory", rawParent, name)
		// The kernel reclaims down to the new limit, or refuses it
		// (EBUSY) once it cannot; the limit goes back either way.
		_ = os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte("1048576"), 0)
		return os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(2*size+128<<20, 10)), 0)
	case "force_empty":
		return b.raw.Reclaim(ctx, name)
	case "pageout", "pageout+force_empty":
		maps, err := p.Mappings()
		if err != nil {
			return err
		}
		if _, err := p.Advise(ctx, maps, pageout.PageOut); err != nil {
			return err
		}
		if mech == "pageout" {
			return nil
		}
		if _, err := waitFor(ctx, time.Now(), func() bool {
			m, err := b.raw.Memory(name)
			return err == nil && m.Writeback == 0
		}); err != nil {
			return err
		}
		return b.raw.Reclaim(ctx, name)
	}
	return fmt.Errorf("mechanism %q is unknown", mech)
}

// many pauses and resumes n sandboxes, conc calls at a time.
func (b *bench) many(ctx context.Context, n, conc int) (*ManyResult, error) {
	res := &ManyResult{N: n, Conc: conc}
	job := map[string]string{"job": "bench-pause-many"}
	var ids []string
	defer func() {
		forAll(ids, conc, func(id string) error { return b.d.Client.Sandbox(id).Delete(context.WithoutCancel(ctx)) })
	}()
	for len(ids) < n {
		k := min(n-len(ids), dsec.MaxBatch)
		out, err := b.d.Client.BatchCreate(ctx, dsec.CreateOptions{Image: "busybox", Memory: 32 << 20, Disk: 64 << 20, CPUs: 0.5, IdleTTL: time.Hour, Labels: job}, k)
		for _, o := range out {
			if o.Sandbox != nil {
				ids = append(ids, o.Sandbox.ID)
			}
		}
		if err != nil {
			return res, err
		}
		for _, o := range out {
			if o.Err != nil {
				return res, o.Err
			}
		}
	}
	log.Printf("%d sandboxes made", len(ids))
	// A shell in each, as an idle agent's sandbox has.
	forAll(ids, conc, func(id string) error {
		_, err := b.exec(ctx, id, "/bin/sh", "-c", "(sleep 86400 &)")
		return err
	})
	sumResident := func() float64 {
		var tot int64
		var mu sync.Mutex
		forAll(ids, conc, func(id string) error {
			p, err := b.kc.PauseState(ctx, id)
			mu.Lock()
			tot += p.Resident
			mu.Unlock()
			return err
		})
		return float64(tot) / (1 << 20)
	}
	res.ResidentMiB = sumResident()
	// One call by label each way, through the API, as a trainer pauses
	// its preempted job.
	took := func(rs []dsec.PauseResult, want string) []time.Duration {
		var ds []time.Duration
		for _, r := range rs {
			if r.Err != nil || r.State != want {
				res.Failed++
				continue
			}
			ds = append(ds, r.Took)
		}
		return ds
	}
	t0 := time.Now()
	paused, err := b.d.Client.Pause(ctx, job)
	if err != nil {
		return res, err
	}
	res.PauseAllMs = ms(time.Since(t0))
	if len(paused) != n {
		return res, fmt.Errorf("pause by label: %d results, want %d", len(paused), n)
	}
	pauses := took(paused, dsec.StatePaused)
	moved, err := waitFor(ctx, t0, func() bool {
		var moving atomic.Int32
		forAll(ids, conc, func(id string) error {
			p, err := b.kc.PauseState(ctx, id)
			if err == nil && p.Moving {
				moving.Add(1)
			}
			return nil
		})
		return moving.Load() == 0
	})
	if err != nil {
		return res, err
	}
	res.MovedAllMs = ms(moved)
	res.PausedMiB = sumResident()
	t1 := time.Now()
	resumed, err := b.d.Client.Resume(ctx, job)
	if err != nil {
		return res, err
	}
	res.ResumeAllMs = ms(time.Since(t1))
	resumes := took(resumed, dsec.StateRunning)
	t2 := time.Now()
	res.Failed += forAll(ids, conc, func(id string) error {
		_, err := b.execTrue(ctx, id)
		return err
	})
	res.ExecAllMs = ms(time.Since(t2))
	res.Pause = harness.Summarize("pause", "dsec", pauses)
	res.Resume = harness.Summarize("resume", "dsec", resumes)
	res.Pause.Samples, res.Resume.Samples = nil, nil
	return res, nil
}

// forAll calls f for every id, conc at a time, and returns how many
// failed (the first failure is logged).
func forAll(ids []string, conc int, f func(id string) error) int {
	var wg sync.WaitGroup
	var failed atomic.Int32
	var once sync.Once
	ch := make(chan string)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ch {
				if err := f(id); err != nil {
					failed.Add(1)
					once.Do(func() { log.Printf("%s: %v", id, err) })
				}
			}
		}()
	}
	for _, id := range ids {
		ch <- id
	}
	close(ch)
	wg.Wait()
	return int(failed.Load())
}

// execTrue runs `true` in sandbox id through the keeper and returns the
// round trip.
func (b *bench) execTrue(ctx context.Context, id string) (time.Duration, error) {
	t := time.Now()
	_, err := b.exec(ctx, id, "/bin/true")
	return time.Since(t), err
}

// exec runs argv in sandbox id through the keeper and waits for it.
func (b *bench) exec(ctx context.Context, id string, argv ...string) (keeper.ExitStatus, error) {
	execID := fmt.Sprintf("b%d", b.seq.Add(1))
	if err := b.kc.StartExec(ctx, keeper.ExecRequest{Sandbox: id, Spec: keeper.ExecSpec{ID: execID, Argv: argv, Env: []string{"PATH=/usr/bin:/bin"}}}); err != nil {
		return keeper.ExitStatus{}, err
	}
	st, err := b.kc.WaitExec(ctx, id, execID)
	if err == nil && (st.Code != 0 || st.Signal != 0) {
		err = fmt.Errorf("exec %v: %+v", argv, st)
	}
	return st, err
}

// cgroups are a sandbox's groups on the host: its v1 memory group and its
// cgroup2 group.
type cgroups struct{ mem, v2 string }

// cgroupsOf reads process pid's groups from /proc/PID/cgroup.
func cgroupsOf(pid int) (cgroups, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return cgroups{}, err
	}
	var c cgroups
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			c.v2 = filepath.Join("/sys/fs/cgroup/unified", f[2])
		case f[1] == "memory":
			c.mem = filepath.Join("/sys/fs/cgroup/memory", f[2])
		}
	}
	if c.mem == "" || c.v2 == "" {
		return c, fmt.Errorf("process %d: no v1 memory or cgroup2 group in %q (the benchmark wants a hybrid host)", pid, b)
	}
	return c, nil
}

// rawFreezeThaw freezes and thaws the cgroup2 group dir by hand and
// returns how long each took to take effect (cgroup.events polled).
func rawFreezeThaw(dir string) (freeze, thaw time.Duration, err error) {
	for _, v := range []string{"1", "0"} {
		t := time.Now()
		if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte(v), 0); err != nil {
			return 0, 0, err
		}
		for {
			b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
			if err != nil {
				return 0, 0, err
			}
			if bytes.Contains(b, []byte("frozen "+v)) {
				break
			}
			if time.Since(t) > 10*time.Second {
				return 0, 0, fmt.Errorf("%s: cgroup.freeze %s did not take effect", dir, v)
			}
			time.Sleep(10 * time.Microsecond)
		}
		if v == "1" {
			freeze = time.Since(t)
		} else {
			thaw = time.Since(t)
		}
	}
	return freeze, thaw, nil
}

// waitFor polls cond every millisecond until it holds, and returns the
// time since t0; it fails after capWait.
func waitFor(ctx context.Context, t0 time.Time, cond func() bool) (time.Duration, error) {
	deadline := time.Now().Add(capWait)
	for !cond() {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("not within %v", capWait)
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(t0), nil
}

// waitFile waits for a file to be there and returns it, trimmed.
func waitFile(ctx context.Context, path string) (string, error) {
	var s string
	_, err := waitFor(ctx, time.Now(), func() bool {
		b, err := os.ReadFile(path)
		s = strings.TrimSpace(string(b))
		return err == nil && s != ""
	})
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func readInt(file string) int64 {
	b, _ := os.ReadFile(file)
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// memStat reads key of a v1 memory group's memory.stat.
func memStat(dir, key string) int64 {
	f, err := os.Open(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// swapUsed is the host's swap in use (/proc/meminfo).
func swapUsed() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	var total, free int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "SwapTotal:":
			total = v << 10
		case "SwapFree:":
			free = v << 10
		}
	}
	return total - free
}

// swapOn reports whether the host swaps to path.
func swapOn(path string) bool {
	b, _ := os.ReadFile("/proc/swaps")
	es, _ := swap.ParseSwaps(string(b))
	return slices.ContainsFunc(es, func(e swap.SwapEntry) bool { return e.Path == path })
}

func summarize(mib int, sbs []sandboxRound, raws []rawRound) SizeResult {
	size := float64(mib)
	s := SizeResult{MiB: mib, Rounds: len(sbs), Intact: true}
	s.PauseMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.pause })
	s.Out90Ms = msMedian(sbs, func(r sandboxRound) time.Duration { return r.out90 })
	s.MovedMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.moved })
	s.OutPct = medianF(sbs, func(r sandboxRound) float64 { return r.outPct })
	s.ResumeExecMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.resumeExec })
	s.ResumeCallMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.resumeCall })
	s.ResidentMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.resident })
	s.RawFreezeMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.freeze })
	s.RawThawMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.thaw })
	s.ExecMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.exec })
	s.RPCMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.rpc })
	s.SwapGrowMiB = medianF(sbs, func(r sandboxRound) float64 { return r.swapGrow })
	s.StoppedMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.stopped })
	s.StoppedRatio = s.StoppedMs / s.RawFreezeMs
	s.APIGetMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.apiGet })
	s.APIExecMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.apiExec })
	s.APIPauseMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.apiPause })
	s.APIResumeExecMs = msMedian(sbs, func(r sandboxRound) time.Duration { return r.apiResumeExec })
	for _, r := range sbs {
		s.Intact = s.Intact && r.intact
		s.ResumeExecSpans = append(s.ResumeExecSpans, ms(r.resumeExec))
	}
	s.RawOut90Ms = msMedian(raws, func(r rawRound) time.Duration { return r.out90 })
	s.RawResidentMs = msMedian(raws, func(r rawRound) time.Duration { return r.back })
	s.ReclaimMiBps = 0.9 * size / (s.Out90Ms / 1000)
	s.RawOutMiBps = 0.9 * size / (s.RawOut90Ms / 1000)
	s.PageInMiBps = size / (s.ResidentMs / 1000)
	s.RawInMiBps = size / (s.RawResidentMs / 1000)
	s.PauseRatio = s.PauseMs / s.RawFreezeMs
	s.ResumeBoundMs = 2 * (s.RawThawMs + s.ExecMs)
	s.ReclaimRatio = s.ReclaimMiBps / s.RawOutMiBps
	return s
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func msMedian[T any](rs []T, f func(T) time.Duration) float64 {
	ds := make([]time.Duration, len(rs))
	for i, r := range rs {
		ds[i] = f(r)
	}
	return ms(median(ds))
}

func medianF[T any](rs []T, f func(T) float64) float64 {
	fs := make([]float64, len(rs))
	for i, r := range rs {
		fs[i] = f(r)
	}
	slices.Sort(fs)
	return fs[len(fs)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
