//go:build linux

// Command density is issue 4's density drill: it starts a `dsec up` of its
// own, creates N idle sandboxes (3,200 by default, DSec's per-node figure)
// with small memory limits, checks that exec answers in every one of them
// and that none is lost (List finds N, all running), measures the host
// memory they take and the keeper's and dsec up's open files, threads and
// RSS, deletes them all with one DeleteSelector, and checks that the
// footprint (cgroups under the parent, mounts, loop devices, processes,
// sandbox directories) is back to where it started. When a limit of the
// machine (open files, pids, memory, admission) stops it, it says which,
// with the error. It prints JSON (also to -json) and a summary.
//
// Run it as root: `make density`, or `go run ./bench/density -n 200` for a
// quick one.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/bench/internal/harness"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

const label = "density"

type config struct {
	n, conc, execConc int
	mode              string
	memory, minAvail  int64
	bin, runtime      string
	settle, ttl       time.Duration
	jsonOut           string
	keep              bool
}

func parseFlags() (config, error) {
	var c config
	var memory, minAvail string
	flag.IntVar(&c.n, "n", 3200, "idle sandboxes to hold")
	flag.StringVar(&c.mode, "mode", "batch", "how to create them: batch (BatchCreate, 1,000 per call) or create (one Create each, -conc at a time)")
	flag.IntVar(&c.conc, "conc", 16, "concurrent Create calls (mode create) or BatchCreate calls (mode batch)")
	flag.IntVar(&c.execConc, "exec-conc", 32, "concurrent execs of the check")
	flag.StringVar(&memory, "memory", "16M", "memory limit of each sandbox (admission counts it)")
	flag.StringVar(&minAvail, "min-available", "2G", "stop creating when the host's MemAvailable falls below this")
	flag.StringVar(&c.bin, "bin", os.Getenv("DSEC_BIN"), "static dsec binary (default $DSEC_BIN)")
	flag.StringVar(&c.runtime, "runtime", "crun", "OCI runtime of dsec up")
	flag.DurationVar(&c.settle, "settle", 5*time.Second, "wait before each MemAvailable reading")
	flag.DurationVar(&c.ttl, "ttl", 12*time.Hour, "TTL and idle TTL of the sandboxes: longer than the drill, so that none expires during it")
	flag.StringVar(&c.jsonOut, "json", "", "also write the JSON to this file")
	flag.BoolVar(&c.keep, "keep", false, "keep the temporary directory (logs, state) for a post-mortem")
	flag.Parse()
	var err error
	if c.memory, err = dsec.ParseSize(memory); err != nil {
		return c, fmt.Errorf("-memory: %w", err)
	}
	if c.minAvail, err = dsec.ParseSize(minAvail); err != nil {
		return c, fmt.Errorf("-min-available: %w", err)
	}
	if c.mode != "batch" && c.mode != "create" {
		return c, fmt.Errorf("-mode %q: want batch or create", c.mode)
	}
	if c.n < 1 || c.conc < 1 || c.execConc < 1 {
		return c, errors.New("-n, -conc and -exec-conc must be at least 1")
	}
	if c.bin == "" {
		return c, errors.New("no dsec binary: pass -bin or set DSEC_BIN (make density does)")
	}
	return c, nil
}

// Report is the drill's JSON.
type Report struct {
	Host   Host   `json:"host"`
	Config Config `json:"config"`

	Wanted  int `json:"wanted"`
	Created int `json:"created"`
	// CreateSeconds is the time to create them all; CreateErrors the
	// first errors (of CreateFailures) and StoppedBy the limit that
	// stopped the creation, if one did.
	CreateSeconds  float64  `json:"create_seconds"`
	CreateRate     float64  `json:"creations_per_s"`
	CreateFailures int      `json:"create_failures"`
	CreateErrors   []string `json:"create_errors,omitempty"`
	StoppedBy      string   `json:"stopped_by,omitempty"`

	// Listed is what List found; Running how many of them run.
	Listed     int      `json:"listed"`
	Running    int      `json:"running"`
	NotRunning []string `json:"not_running,omitempty"`

	// ExecOK of ExecTried sandboxes answered exec (true, exit 0).
	ExecTried   int             `json:"exec_tried"`
	ExecOK      int             `json:"exec_ok"`
	ExecErrors  []string        `json:"exec_errors,omitempty"`
	ExecSeconds float64         `json:"exec_seconds"`
	ExecLatency harness.Summary `json:"exec_latency"`

	MemAvailableBefore int64   `json:"mem_available_before_bytes"`
	MemAvailableFull   int64   `json:"mem_available_full_bytes"`
	BytesPerSandbox    float64 `json:"bytes_per_sandbox"`
	Keeper             Process `json:"keeper"`
	Up                 Process `json:"up"`

	DeleteSeconds float64 `json:"delete_seconds"`
	// Deleted is how many sandboxes DeleteSelector said it deleted.
	Deleted     int    `json:"deleted"`
	DeleteError string `json:"delete_error,omitempty"`

	// Footprints: before creating, with every sandbox, after deleting them,
	// and after stopping dsec.
	Start       harness.Footprint `json:"footprint_start"`
	Full        harness.Footprint `json:"footprint_full"`
	AfterDelete harness.Footprint `json:"footprint_after_delete"`
	AfterStop   harness.Footprint `json:"footprint_after_stop"`
	// Leftovers name what deleting did not give back; empty when clean.
	Leftovers []string `json:"leftovers,omitempty"`
	Clean     bool     `json:"clean"`
	// Held: every sandbox wanted was created, listed, running and answered.
	Held   bool     `json:"held"`
	Errors []string `json:"errors,omitempty"`
}

// Host is the machine and its limits.
type Host struct {
	Kernel     string `json:"kernel"`
	CPUs       int    `json:"cpus"`
	MemTotal   int64  `json:"mem_total_bytes"`
	PidMax     int64  `json:"pid_max"`
	ThreadsMax int64  `json:"threads_max"`
	// Nofile are the soft limits of open files of this process, the
	// keeper and dsec up.
	NofileSelf   int64  `json:"nofile_self"`
	NofileKeeper int64  `json:"nofile_keeper"`
	NofileUp     int64  `json:"nofile_up"`
	Dsec         string `json:"dsec_version"`
}

// Config is the run's flags.
type Config struct {
	N            int      `json:"n"`
	Mode         string   `json:"mode"`
	Conc         int      `json:"conc"`
	ExecConc     int      `json:"exec_conc"`
	MemoryLimit  int64    `json:"memory_limit_bytes"`
	MinAvailable int64    `json:"min_available_bytes"`
	UpFlags      []string `json:"dsec_up_flags"`
}

// Process is what the drill reads of the keeper or dsec up with every
// sandbox running.
type Process struct {
	Pid     int   `json:"pid"`
	RSS     int64 `json:"rss_bytes"`
	FDs     int   `json:"fds"`
	Threads int   `json:"threads"`
}

func main() {
	harness.RunnerMain()
	log.SetFlags(0)
	log.SetPrefix("density: ")
	cfg, err := parseFlags()
	if err != nil {
		log.Fatal(err)
	}
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the drill creates real sandboxes")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d := &drill{cfg: cfg, rep: &Report{Wanted: cfg.n}}
	err = d.run(ctx)
	if err != nil {
		d.rep.Errors = append(d.rep.Errors, err.Error())
	}
	js, _ := json.MarshalIndent(d.rep, "", "  ")
	fmt.Println(string(js))
	if cfg.jsonOut != "" {
		if werr := os.WriteFile(cfg.jsonOut, append(js, '\n'), 0o644); werr != nil {
			log.Print(werr)
		}
	}
	d.summary()
	if err != nil || !d.rep.Held || !d.rep.Clean {
		os.Exit(1)
	}
}

type drill struct {
	cfg    config
	rep    *Report
	dir    string
	up     *harness.Dsec
	keeper int
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "density: "+format+"\n", args...)
}

func (d *drill) run(ctx context.Context) (err error) {
	d.hostInfo()
	d.dir, err = os.MkdirTemp("", "dsec-density-")
	if err != nil {
		return err
	}
	defer func() {
		if d.cfg.keep {
			progress("kept %s", d.dir)
		} else {
			_ = os.RemoveAll(d.dir)
		}
	}()
	if err := os.Chmod(d.dir, 0o711); err != nil {
		return err
	}
	tree := filepath.Join(d.dir, "busybox")
	if err := harness.Busybox(ctx, tree); err != nil {
		return err
	}
	args := []string{"--runtime", d.cfg.runtime}
	// Admission counts memory limits against the node's memory × the
	// overcommit ratio (default 4): raise it when N × the limit needs it.
	if oc := float64(d.cfg.n+8) * float64(d.cfg.memory) * 1.25 / float64(d.rep.Host.MemTotal); oc > 4 {
		args = append(args, "--memory-overcommit", strconv.FormatFloat(math.Ceil(oc), 'f', 0, 64))
	}
	// Writable disks (10 GiB each, and 256 MiB of exec output) are
	// admitted against the state dir's free space × the disk overcommit
	// ratio (default 32); the drill's sandboxes write nothing, so raise it
	// when N default disks need it.
	if oc := harness.DiskOvercommit(d.dir, d.cfg.n+8); oc > 32 {
		args = append(args, "--disk-overcommit", strconv.FormatFloat(math.Ceil(oc), 'f', 0, 64))
	}
	d.rep.Config = Config{
		N: d.cfg.n, Mode: d.cfg.mode, Conc: d.cfg.conc, ExecConc: d.cfg.execConc,
		MemoryLimit: d.cfg.memory, MinAvailable: d.cfg.minAvail, UpFlags: args,
	}
	progress("starting dsec up")
	parent := fmt.Sprintf("dsec-density-%d", os.Getpid())
	d.up, err = harness.StartDsec(ctx, harness.DsecConfig{
		Bin: d.cfg.bin, StateDir: filepath.Join(d.dir, "state"), CgroupParent: parent, Args: args,
	})
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = d.up.Stop(context.WithoutCancel(ctx))
		}
	}()
	if err := d.up.BuildImage(ctx, "busybox", tree); err != nil {
		return err
	}
	if d.keeper, err = d.up.KeeperPid(ctx); err != nil {
		return err
	}
	d.rep.Host.NofileKeeper, _ = harness.NofileLimit(d.keeper)
	d.rep.Host.NofileUp, _ = harness.NofileLimit(d.up.UpPid())

	if err := d.settle(ctx); err != nil {
		return err
	}
	d.rep.Start = d.footprint()
	d.rep.MemAvailableBefore, _ = harness.MemAvailable()

	d.create(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := d.settle(ctx); err != nil {
		return err
	}
	d.rep.MemAvailableFull, _ = harness.MemAvailable()
	if d.rep.Created > 0 {
		d.rep.BytesPerSandbox = float64(d.rep.MemAvailableBefore-d.rep.MemAvailableFull) / float64(d.rep.Created)
	}
	d.rep.Full = d.footprint()
	d.rep.Keeper = readProcess(d.keeper)
	d.rep.Up = readProcess(d.up.UpPid())

	ids, err := d.list(ctx)
	if err != nil {
		return err
	}
	d.execAll(ctx, ids)

	progress("deleting them all")
	t0 := time.Now()
	stopCount := d.countWhile(ctx, "  %d sandboxes left")
	deleted, err := d.up.Client.DeleteSelector(ctx, map[string]string{"bench": label})
	d.rep.DeleteSeconds = time.Since(t0).Seconds()
	stopCount()
	d.rep.Deleted = len(deleted)
	if err != nil {
		d.rep.DeleteError = err.Error()
	}
	d.rep.AfterDelete, d.rep.Leftovers = d.waitClean(ctx, 60*time.Second)
	d.rep.Clean = len(d.rep.Leftovers) == 0

	progress("stopping dsec")
	stopped = true
	if err := d.up.Stop(context.WithoutCancel(ctx)); err != nil {
		d.rep.Errors = append(d.rep.Errors, "stop: "+err.Error())
	}
	d.rep.AfterStop = d.footprintStopped()
	if left := stoppedLeftovers(d.rep.AfterStop); len(left) > 0 {
		d.rep.Leftovers = append(d.rep.Leftovers, left...)
		d.rep.Clean = false
	}
	d.rep.Held = d.rep.Created == d.cfg.n && d.rep.Listed == d.cfg.n && d.rep.Running == d.cfg.n &&
		d.rep.ExecOK == d.cfg.n && d.rep.Deleted == d.rep.Created
	return nil
}

// countWhile prints how many sandbox directories the keeper still has
// every 15s, until the returned stop is called.
func (d *drill) countWhile(ctx context.Context, format string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(15 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				ents, _ := os.ReadDir(filepath.Join(d.up.StateDir(), "sandboxes"))
				progress(format, len(ents))
			case <-done:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

func (d *drill) settle(ctx context.Context) error {
	select {
	case <-time.After(d.cfg.settle):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *drill) footprint() harness.Footprint {
	return harness.TakeFootprint(d.up.CgroupParent(), d.up.StateDir(), d.keeper, d.up.UpPid())
}

func (d *drill) footprintStopped() harness.Footprint {
	return harness.TakeFootprint(d.up.CgroupParent(), d.up.StateDir(), 0, 0)
}

// stoppedLeftovers names what is left on the host once dsec has stopped.
func stoppedLeftovers(f harness.Footprint) []string {
	var out []string
	if f.Cgroups > 0 || f.CgroupProcesses > 0 {
		out = append(out, fmt.Sprintf("after stop: %d cgroups, %d processes under the cgroup parent", f.Cgroups, f.CgroupProcesses))
	}
	if f.HostMounts > 0 {
		out = append(out, fmt.Sprintf("after stop: %d mounts under the state dir", f.HostMounts))
	}
	if f.StateLoopDevices > 0 {
		out = append(out, fmt.Sprintf("after stop: %d loop devices on files of the state dir", f.StateLoopDevices))
	}
	return out
}

// leftovers compares a footprint after deleting everything with the start.
func leftovers(start, now harness.Footprint) []string {
	var out []string
	for _, c := range []struct {
		what       string
		start, now int
	}{
		{"cgroups under the parent", start.Cgroups, now.Cgroups},
		{"processes in sandbox cgroups", start.CgroupProcesses, now.CgroupProcesses},
		{"mounts under the state dir (host)", start.HostMounts, now.HostMounts},
		{"mounts under the state dir (keeper)", start.KeeperMounts, now.KeeperMounts},
		{"loop devices on files of the state dir", start.StateLoopDevices, now.StateLoopDevices},
		{"sandbox directories", start.SandboxDirs, now.SandboxDirs},
	} {
		if c.now > c.start {
			out = append(out, fmt.Sprintf("%s: %d, was %d", c.what, c.now, c.start))
		}
	}
	return out
}

// waitClean waits until deleting has given everything back, or timeout.
func (d *drill) waitClean(ctx context.Context, timeout time.Duration) (harness.Footprint, []string) {
	deadline := time.Now().Add(timeout)
	for {
		f := d.footprint()
		left := leftovers(d.rep.Start, f)
		if len(left) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return f, left
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func readProcess(pid int) Process {
	p := Process{Pid: pid}
	if pr, err := harness.ReadProc(pid); err == nil {
		p.RSS, p.Threads = pr.RSS, pr.Threads
	}
	p.FDs, _ = harness.OpenFDs(pid)
	return p
}

func (d *drill) hostInfo() {
	h := &d.rep.Host
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		h.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) == nil {
		h.CPUs = set.Count()
	}
	h.MemTotal, _ = harness.MemTotal()
	h.PidMax = readInt("/proc/sys/kernel/pid_max")
	h.ThreadsMax = readInt("/proc/sys/kernel/threads-max")
	h.NofileSelf, _ = harness.NofileLimit(os.Getpid())
	if out, err := exec.Command(d.cfg.bin, "--version").Output(); err == nil {
		h.Dsec = strings.TrimSpace(string(out))
	}
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// create makes the sandboxes, stopping at the first call that fails or
// when the host runs short of memory.
func (d *drill) create(ctx context.Context) {
	n := d.cfg.n
	progress("creating %d sandboxes (%s)", n, d.cfg.mode)
	opts := dsec.CreateOptions{
		Image: "busybox", Memory: d.cfg.memory, Labels: map[string]string{"bench": label},
		TTL: d.cfg.ttl, IdleTTL: d.cfg.ttl,
	}
	var mu sync.Mutex // guards the report's create fields and stop
	var stopErr error
	note := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		d.rep.CreateFailures++
		if len(d.rep.CreateErrors) < 5 {
			d.rep.CreateErrors = append(d.rep.CreateErrors, err.Error())
		}
		if stopErr == nil {
			stopErr = err
		}
	}
	created := func(k int) {
		mu.Lock()
		defer mu.Unlock()
		before := d.rep.Created
		d.rep.Created += k
		if step := max(n/10, 1); d.rep.Created/step != before/step {
			progress("  %d of %d", d.rep.Created, n)
		}
	}
	stopped := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return stopErr != nil
	}
	lowMemory := func() error {
		if avail, err := harness.MemAvailable(); err == nil && avail < d.cfg.minAvail {
			return fmt.Errorf("host MemAvailable %d MiB is under -min-available %d MiB: stopped creating", avail>>20, d.cfg.minAvail>>20)
		}
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 := time.Now()
	switch d.cfg.mode {
	case "create":
		var wg sync.WaitGroup
		next := make(chan struct{})
		for range d.cfg.conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					if _, err := d.up.Client.Create(ctx, opts); err != nil {
						note(err)
						continue
					}
					created(1)
				}
			}()
		}
		for i := range n {
			if stopped() || ctx.Err() != nil {
				break
			}
			if i%50 == 0 {
				if err := lowMemory(); err != nil {
					note(err)
					break
				}
			}
			next <- struct{}{}
		}
		close(next)
		wg.Wait()
	case "batch":
		for done := 0; done < n && !stopped() && ctx.Err() == nil; {
			if err := lowMemory(); err != nil {
				note(err)
				break
			}
			k := min(dsec.MaxBatch, n-done)
			res, err := d.up.Client.BatchCreate(ctx, opts, k)
			ok := 0
			for _, r := range res {
				if r.Err != nil {
					note(fmt.Errorf("item %d: %w", done+r.Index, r.Err))
				} else {
					ok++
				}
			}
			created(ok)
			if err != nil {
				note(err)
			}
			done += k
		}
	}
	el := time.Since(t0)
	d.rep.CreateSeconds = el.Seconds()
	d.rep.CreateRate = float64(d.rep.Created) / el.Seconds()
	if stopErr != nil {
		d.rep.StoppedBy = d.whichLimit(stopErr)
		progress("creation stopped at %d of %d: %v (%s)", d.rep.Created, n, stopErr, d.rep.StoppedBy)
	}
}

// whichLimit tells which limit of the machine or of dsec is the likeliest
// cause of err, from the counters it is measured by.
func (d *drill) whichLimit(err error) string {
	var why []string
	if errors.Is(err, dsec.ErrResourceExhausted) {
		why = append(why, "dsec admission (ResourceExhausted: memory limits × overcommit, or the memory reserve)")
	}
	for _, p := range []struct {
		name  string
		pid   int
		limit int64
	}{{"keeper", d.keeper, d.rep.Host.NofileKeeper}, {"dsec up", d.up.UpPid(), d.rep.Host.NofileUp}} {
		if fds, ferr := harness.OpenFDs(p.pid); ferr == nil && p.limit > 0 && float64(fds) >= 0.95*float64(p.limit) {
			why = append(why, fmt.Sprintf("open files of the %s: %d of nofile %d", p.name, fds, p.limit))
		}
	}
	threads := 0
	for _, p := range harness.Procs() {
		threads += p.Threads
	}
	if lim := d.rep.Host.PidMax; lim > 0 && float64(threads) >= 0.9*float64(lim) {
		why = append(why, fmt.Sprintf("pid_max: %d tasks of %d", threads, lim))
	}
	if avail, aerr := harness.MemAvailable(); aerr == nil && avail < d.cfg.minAvail {
		why = append(why, fmt.Sprintf("host memory: MemAvailable %d MiB", avail>>20))
	}
	if len(why) == 0 {
		return "no machine limit is near: see the error and the logs"
	}
	return strings.Join(why, "; ")
}

// list checks that List finds every sandbox created, and that they run.
func (d *drill) list(ctx context.Context) ([]string, error) {
	sbs, err := d.up.Client.List(ctx, map[string]string{"bench": label})
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	d.rep.Listed = len(sbs)
	ids := make([]string, 0, len(sbs))
	for _, sb := range sbs {
		ids = append(ids, sb.ID)
		if sb.State == dsec.StateRunning {
			d.rep.Running++
		} else if len(d.rep.NotRunning) < 10 {
			d.rep.NotRunning = append(d.rep.NotRunning, fmt.Sprintf("%s: %s %s", sb.ID, sb.State, sb.Reason))
		}
	}
	progress("listed %d, %d running", d.rep.Listed, d.rep.Running)
	return ids, nil
}

// execAll runs true in every sandbox, execConc at a time.
func (d *drill) execAll(ctx context.Context, ids []string) {
	progress("exec in all %d", len(ids))
	var mu sync.Mutex // guards lat and the report's exec fields
	lat := make([]time.Duration, 0, len(ids))
	failed := 0
	work := make(chan string)
	var wg sync.WaitGroup
	t0 := time.Now()
	for range d.cfg.execConc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				t1 := time.Now()
				r, err := d.up.Client.Sandbox(id).Exec(ctx, []string{"true"})
				el := time.Since(t1)
				if err == nil && r.Code() != 0 {
					err = fmt.Errorf("true ended with %d: %s", r.Code(), r.Stderr)
				}
				mu.Lock()
				if err != nil {
					failed++
					if len(d.rep.ExecErrors) < 5 {
						d.rep.ExecErrors = append(d.rep.ExecErrors, fmt.Sprintf("%s: %v", id, err))
					}
				} else {
					d.rep.ExecOK++
					lat = append(lat, el)
				}
				if n := d.rep.ExecOK + failed; n%max(len(ids)/10, 1) == 0 {
					progress("  %d of %d answered (%d failed)", n, len(ids), failed)
				}
				mu.Unlock()
			}
		}()
	}
	for _, id := range ids {
		if ctx.Err() != nil {
			break
		}
		work <- id
	}
	close(work)
	wg.Wait()
	d.rep.ExecTried = len(ids)
	d.rep.ExecSeconds = time.Since(t0).Seconds()
	d.rep.ExecLatency = harness.Summarize("exec true, all sandboxes held", "dsec", lat)
	d.rep.ExecLatency.Samples = nil
	progress("exec answered in %d of %d", d.rep.ExecOK, len(ids))
}

func (d *drill) summary() {
	r := d.rep
	w := os.Stdout
	fmt.Fprintln(w)
	fmt.Fprintf(w, "density drill: %d wanted, %d created in %.1fs (%.1f/s)", r.Wanted, r.Created, r.CreateSeconds, r.CreateRate)
	if r.StoppedBy != "" {
		fmt.Fprintf(w, ", stopped by: %s", r.StoppedBy)
	}
	fmt.Fprintln(w)
	for _, e := range r.CreateErrors {
		fmt.Fprintln(w, "  create error:", e)
	}
	fmt.Fprintf(w, "listed %d, running %d; exec answered in %d of %d (%.1fs; p50 %.1f ms, p99 %.1f ms)\n",
		r.Listed, r.Running, r.ExecOK, r.ExecTried, r.ExecSeconds, r.ExecLatency.P50, r.ExecLatency.P99)
	for _, e := range r.ExecErrors {
		fmt.Fprintln(w, "  exec error:", e)
	}
	fmt.Fprintf(w, "host memory per sandbox: %.2f MiB (MemAvailable %d → %d MiB)\n",
		r.BytesPerSandbox/(1<<20), r.MemAvailableBefore>>20, r.MemAvailableFull>>20)
	fmt.Fprintf(w, "keeper: RSS %d MiB, %d fds (nofile %d), %d threads; dsec up: RSS %d MiB, %d fds (nofile %d), %d threads\n",
		r.Keeper.RSS>>20, r.Keeper.FDs, r.Host.NofileKeeper, r.Keeper.Threads, r.Up.RSS>>20, r.Up.FDs, r.Host.NofileUp, r.Up.Threads)
	fmt.Fprintf(w, "with all: %d cgroups, %d keeper mounts, %d loop devices of the state dir, %d processes in sandbox cgroups\n",
		r.Full.Cgroups, r.Full.KeeperMounts, r.Full.StateLoopDevices, r.Full.CgroupProcesses)
	fmt.Fprintf(w, "DeleteSelector deleted %d of %d in %.1fs", r.Deleted, r.Created, r.DeleteSeconds)
	if r.DeleteError != "" {
		fmt.Fprintf(w, " (error: %s)", r.DeleteError)
	}
	fmt.Fprintln(w)
	if r.Clean {
		fmt.Fprintln(w, "footprint: back to where it started")
	} else {
		fmt.Fprintln(w, "footprint NOT back to where it started:")
		for _, l := range r.Leftovers {
			fmt.Fprintln(w, "  ", l)
		}
	}
	fmt.Fprintf(w, "held: %v\n", r.Held)
	for _, e := range r.Errors {
		fmt.Fprintln(w, "error:", e)
	}
}
