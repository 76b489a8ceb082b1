//go:build linux

// Command suite is issue 4's benchmark: dsec next to what its users would
// use instead — raw `crun`/`runc` on a bundle like dsec's, and docker —
// on the same busybox root file system, in one run, the systems taking
// turns at every iteration so that the machine's noise hits them alike.
//
// Figures: (1) create → first exec done, (2) exec round trip of true in a
// running sandbox, (3) creations/s of a burst at the best of a few
// concurrencies (and dsec's BatchCreate), (4) host memory per idle sandbox
// (MemAvailable before and after), (5) CPU time per create. It prints JSON
// (also written to -json), a table, issue 4's target ratios, and draws
// the latency distributions as a PNG (-png).
//
// It starts everything it measures itself: a `dsec up` on a temporary
// state dir, a free port and its own cgroup parent; a runner process for
// the raw runtimes (in a mount namespace where a hybrid host's cgroup2 is
// hidden, as dsec's keeper does); and, when Debian's docker.io is
// installed, a dockerd of its own with no bridge and no iptables. It
// removes all of them at the end. Run it as root: `make bench`.
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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/bench/internal/harness"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// allSystems are the systems the suite knows, in table order.
var allSystems = []string{"dsec", "crun", "runc", "docker"}

type config struct {
	n, warmup, burst, probe, idle int
	concurrencies                 []int
	systems                       []string
	bin, runtime                  string
	dockerd, dockerCLI            string
	memory                        int64
	settle                        time.Duration
	jsonOut, pngOut               string
	keep                          bool
}

func (c config) has(system string) bool { return slices.Contains(c.systems, system) }

func parseFlags() (config, error) {
	var c config
	var systems, concs, memory string
	flag.IntVar(&c.n, "n", 30, "measured iterations of the latency figures (1, 2)")
	flag.IntVar(&c.warmup, "warmup", 3, "unmeasured iterations before them")
	flag.IntVar(&c.burst, "burst", 1000, "creations in a burst (3, 5)")
	flag.IntVar(&c.probe, "probe", 100, "creations per concurrency tried before the burst (the burst itself when larger)")
	flag.IntVar(&c.idle, "idle", 500, "idle sandboxes of the memory figure (4)")
	flag.StringVar(&concs, "concurrency", "4,8,16,32", "concurrencies tried for the burst; the best is kept per system")
	flag.StringVar(&systems, "systems", strings.Join([]string{"crun", "runc", "docker", "dsec"}, ","), "systems to measure: dsec, crun, runc, docker")
	flag.StringVar(&c.bin, "bin", os.Getenv("DSEC_BIN"), "static dsec binary (default $DSEC_BIN)")
	flag.StringVar(&c.runtime, "runtime", "crun", "OCI runtime of dsec up")
	flag.StringVar(&c.dockerd, "dockerd", "", "dockerd to start (default: dockerd in PATH; docker rows are skipped without one)")
	flag.StringVar(&c.dockerCLI, "docker", "", "docker client (default: the one installed beside dockerd)")
	flag.StringVar(&memory, "memory", "64M", "memory limit of dsec's sandboxes (admission counts it)")
	flag.DurationVar(&c.settle, "settle", 5*time.Second, "wait before each MemAvailable reading")
	flag.StringVar(&c.jsonOut, "json", "", "also write the JSON to this file")
	flag.StringVar(&c.pngOut, "png", "bench-latency.png", "write the latency plot to this PNG (empty: none)")
	flag.BoolVar(&c.keep, "keep", false, "keep the temporary directory (logs, state) for a post-mortem")
	flag.Parse()
	for s := range strings.SplitSeq(systems, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allSystems, s) {
			return c, fmt.Errorf("-systems: unknown system %q (want some of %s)", s, strings.Join(allSystems, ", "))
		}
		if !slices.Contains(c.systems, s) {
			c.systems = append(c.systems, s)
		}
	}
	// Table order, whatever the flag's.
	slices.SortFunc(c.systems, func(a, b string) int { return slices.Index(allSystems, a) - slices.Index(allSystems, b) })
	for s := range strings.SplitSeq(concs, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v < 1 {
			return c, fmt.Errorf("-concurrency: %q is not a positive number", s)
		}
		c.concurrencies = append(c.concurrencies, v)
	}
	m, err := dsec.ParseSize(memory)
	if err != nil {
		return c, fmt.Errorf("-memory: %w", err)
	}
	c.memory = m
	if c.n < 1 || c.burst < 1 || c.idle < 1 || c.probe < 1 || c.warmup < 0 {
		return c, errors.New("-n, -burst, -probe and -idle must be at least 1, -warmup at least 0")
	}
	if c.has("dsec") && c.bin == "" {
		return c, errors.New("no dsec binary: pass -bin or set DSEC_BIN (make bench does)")
	}
	return c, nil
}

func main() {
	harness.RunnerMain()
	log.SetFlags(0)
	log.SetPrefix("bench: ")
	cfg, err := parseFlags()
	if err != nil {
		log.Fatal(err)
	}
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the benchmark creates real containers")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b := &bench{cfg: cfg, res: &Result{}}
	runErr := b.run(ctx)
	if terr := b.teardown(context.WithoutCancel(ctx)); terr != nil {
		log.Printf("teardown: %v", terr)
	}
	if err := b.output(); err != nil {
		log.Print(err)
		runErr = errors.Join(runErr, err)
	}
	if runErr != nil {
		log.Fatal(runErr)
	}
	if len(b.res.Failures) > 0 {
		os.Exit(1)
	}
}

// bench is one run of the suite.
type bench struct {
	cfg config
	res *Result

	dir        string // temporary directory of everything
	tree       string // the busybox tree
	rawParent  string // cgroup parent of the raw runtimes' containers
	runner     *harness.Runner
	raw        map[string]*rawRuntime
	dsec       *dsecSystem
	docker     *dockerDaemon
	dockerSkip string // why docker is not measured
	failed     map[string]string
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// fail records that a system failed; its figures from here on are skipped.
func (b *bench) fail(system string, err error) {
	if b.failed[system] != "" {
		return
	}
	b.failed[system] = "failed: " + err.Error()
	b.res.Failures = append(b.res.Failures, system+": "+err.Error())
	progress("%s failed: %v", system, err)
}

// skip says why a system has no figure, or "" when it is measured.
func (b *bench) skip(system string) string {
	if system == "docker" && b.dockerSkip != "" {
		return b.dockerSkip
	}
	return b.failed[system]
}

func (b *bench) run(ctx context.Context) error {
	b.failed = map[string]string{}
	b.raw = map[string]*rawRuntime{}
	if err := b.setup(ctx); err != nil {
		return err
	}
	b.hostInfo()
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"figure 1: create → first exec", b.createFirstExec},
		{"figure 2: exec round trip", b.execRTT},
		{"figures 3 and 5: bursts", b.bursts},
		{"figure 4: idle memory", b.idleMemory},
	}
	for _, s := range steps {
		progress("%s", s.name)
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	b.res.Targets = computeTargets(b.res)
	return nil
}

func (b *bench) setup(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "dsec-bench-")
	if err != nil {
		return err
	}
	b.dir = dir
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	b.tree = filepath.Join(dir, "busybox")
	if err := harness.Busybox(ctx, b.tree); err != nil {
		return err
	}
	idmap := rootfs.Default
	if b.cfg.has("crun") || b.cfg.has("runc") {
		progress("raw runtimes: shifted copy of the busybox tree")
		shifted := filepath.Join(dir, "raw-rootfs")
		if err := harness.ShiftedCopy(ctx, b.tree, shifted, idmap.HostID); err != nil {
			return err
		}
		if b.runner, err = harness.StartRunner(harness.RunnerConfig{HideCgroup2: true}); err != nil {
			return err
		}
		b.rawParent = fmt.Sprintf("dsec-bench-%d-raw", os.Getpid())
		for _, name := range []string{"crun", "runc"} {
			if !b.cfg.has(name) {
				continue
			}
			rt, err := newRawRuntime(name, dir, shifted, b.rawParent, idmap, b.runner)
			if err != nil {
				b.fail(name, err)
				continue
			}
			b.raw[name] = rt
		}
	}
	if b.cfg.has("dsec") {
		if err := b.startDsec(ctx); err != nil {
			b.fail("dsec", err)
		}
	}
	if b.cfg.has("docker") {
		b.startDocker(ctx)
	}
	return nil
}

func (b *bench) startDsec(ctx context.Context) error {
	progress("dsec: starting dsec up")
	args := []string{"--runtime", b.cfg.runtime}
	// Admission counts memory limits against the node's memory × the
	// overcommit ratio (default 4): raise it when the figures need more.
	total, err := harness.MemTotal()
	if err != nil {
		return err
	}
	need := float64(max(b.cfg.burst, b.cfg.idle)+8) * float64(b.cfg.memory) * 1.25
	if oc := need / float64(total); oc > 4 {
		args = append(args, "--memory-overcommit", strconv.FormatFloat(math.Ceil(oc), 'f', 0, 64))
	}
	// Disks are admitted against the state dir's free space × the disk
	// overcommit ratio (default 32); the idle sandboxes write nothing.
	if oc := harness.DiskOvercommit(b.dir, max(b.cfg.burst, b.cfg.idle)+8); oc > 32 {
		args = append(args, "--disk-overcommit", strconv.FormatFloat(math.Ceil(oc), 'f', 0, 64))
	}
	b.res.Host.DsecFlags = args
	up, err := harness.StartDsec(ctx, harness.DsecConfig{
		Bin: b.cfg.bin, StateDir: filepath.Join(b.dir, "dsec"),
		CgroupParent: fmt.Sprintf("dsec-bench-%d", os.Getpid()), Args: args,
	})
	if up != nil {
		b.dsec = &dsecSystem{up: up, image: "busybox", memory: b.cfg.memory}
	}
	if err != nil {
		return err
	}
	if err := up.BuildImage(ctx, "busybox", b.tree); err != nil {
		return err
	}
	if b.dsec.keeper, err = up.KeeperPid(ctx); err != nil {
		return err
	}
	return nil
}

func (b *bench) startDocker(ctx context.Context) {
	dockerd, cli, err := findDocker(b.cfg.dockerd, b.cfg.dockerCLI)
	if err != nil {
		b.dockerSkip = "skipped: " + err.Error()
		progress("docker %s", b.dockerSkip)
		return
	}
	progress("docker: starting %s", dockerd)
	d, err := startDocker(ctx, b.dir, dockerd, cli, fmt.Sprintf("dsec-bench-%d-docker", os.Getpid()))
	if d != nil {
		b.docker = d
	}
	if err == nil {
		err = d.importTree(ctx, b.tree, b.dir)
	}
	if err != nil {
		b.fail("docker", err)
	}
}

func (b *bench) hostInfo() {
	h := &b.res.Host
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		h.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) == nil {
		h.CPUs = set.Count()
	}
	h.MemTotal, _ = harness.MemTotal()
	h.Versions = map[string]string{}
	firstLine := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).Output()
		if err != nil {
			return ""
		}
		l, _, _ := strings.Cut(string(out), "\n")
		return strings.TrimSpace(l)
	}
	if b.cfg.has("dsec") {
		h.Versions["dsec"] = firstLine(b.cfg.bin, "--version")
	}
	for _, rt := range []string{"crun", "runc"} {
		if b.cfg.has(rt) || b.cfg.runtime == rt {
			h.Versions[rt] = firstLine(rt, "--version")
		}
	}
	if b.docker != nil {
		h.Versions["docker"] = b.docker.Version
		h.DockerFS = b.docker.Driver
	}
	cfg := b.cfg
	b.res.Config = ConfigInfo{
		N: cfg.n, Warmup: cfg.warmup, Burst: cfg.burst, Probe: min(cfg.probe, cfg.burst), Idle: cfg.idle,
		Concurrencies: cfg.concurrencies, Systems: cfg.systems, MemoryLimit: cfg.memory,
		SettleSeconds: cfg.settle.Seconds(),
	}
}

// contestant is one system in a latency figure: one timed operation.
type contestant struct {
	name, system string
	op           func(ctx context.Context, i int) (time.Duration, error)
}

// interleave runs warmup+n iterations; in each every contestant runs once,
// in an order that rotates, and the rows keep the last n.
func (b *bench) interleave(ctx context.Context, cs []contestant) []LatencyRow {
	samples := make([][]time.Duration, len(cs))
	cpu := make([]time.Duration, len(cs))
	for i := range b.cfg.warmup + b.cfg.n {
		for j := range cs {
			k := (i + j) % len(cs)
			c := cs[k]
			if b.skip(c.system) != "" {
				continue
			}
			h0, _ := harness.ReadCPUTimes()
			d, err := c.op(ctx, i)
			h1, _ := harness.ReadCPUTimes()
			if err != nil {
				b.fail(c.system, err)
				continue
			}
			if i >= b.cfg.warmup {
				samples[k] = append(samples[k], d)
				cpu[k] += h1.Sub(h0).BusyTime()
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	rows := make([]LatencyRow, len(cs))
	for k, c := range cs {
		rows[k] = LatencyRow{Summary: harness.Summarize(c.name, c.system, samples[k])}
		if why := b.skip(c.system); why != "" {
			rows[k].Skipped = why
		} else if n := len(samples[k]); n > 0 {
			rows[k].HostCPUPerOp = float64(cpu[k]) / 1e6 / float64(n)
		}
	}
	return rows
}

func (b *bench) createFirstExec(ctx context.Context) error {
	var cs []contestant
	if b.cfg.has("dsec") {
		cs = append(cs, contestant{"dsec Create + Exec(true)", "dsec", func(ctx context.Context, _ int) (time.Duration, error) {
			return b.dsec.createFirstExec(ctx)
		}})
	}
	for _, name := range []string{"crun", "runc"} {
		if !b.cfg.has(name) {
			continue
		}
		cs = append(cs, contestant{name + " run (true)", name, func(ctx context.Context, i int) (time.Duration, error) {
			return b.raw[name].runOnce(ctx, i)
		}})
	}
	if b.cfg.has("docker") {
		cs = append(cs, contestant{"docker run --rm (true)", "docker", func(ctx context.Context, _ int) (time.Duration, error) {
			_, d, err := b.docker.timed(ctx, "run", "--rm", "--network", "none", dockerImage, "true")
			return d, err
		}})
	}
	b.res.CreateFirstExec = b.interleave(ctx, cs)
	return ctx.Err()
}

func (b *bench) execRTT(ctx context.Context) error {
	var cs []contestant
	var cleanups []func(context.Context) error
	defer func() {
		for _, c := range cleanups {
			if err := c(context.WithoutCancel(ctx)); err != nil {
				progress("exec targets: %v", err)
			}
		}
	}()
	if b.cfg.has("dsec") && b.skip("dsec") == "" {
		sb, err := b.dsec.up.Client.Create(ctx, b.dsec.opts(map[string]string{"bench": "exec"}))
		if err != nil {
			b.fail("dsec", fmt.Errorf("create the exec target: %w", err))
		} else {
			cleanups = append(cleanups, sb.Delete)
		}
		cs = append(cs, contestant{"dsec Exec(true) via the API", "dsec", func(ctx context.Context, _ int) (time.Duration, error) {
			t0 := time.Now()
			err := execTrue(ctx, sb)
			return time.Since(t0), err
		}})
	} else if b.cfg.has("dsec") {
		cs = append(cs, contestant{"dsec Exec(true) via the API", "dsec", nil})
	}
	if b.cfg.has("crun") {
		rt := b.raw["crun"]
		if b.skip("crun") == "" {
			if err := rt.startSleeper(ctx, "exec-target"); err != nil {
				b.fail("crun", fmt.Errorf("start the exec target: %w", err))
			}
			cleanups = append(cleanups, func(ctx context.Context) error { return rt.deleteAll(ctx, 1) })
		}
		cs = append(cs, contestant{"crun exec (true)", "crun", func(ctx context.Context, _ int) (time.Duration, error) {
			return rt.execOnce(ctx, "exec-target")
		}})
	}
	if b.cfg.has("docker") {
		var id string
		if b.skip("docker") == "" {
			out, err := b.docker.docker(ctx, "run", "-d", "--network", "none", dockerImage, "sleep", "86400")
			if err != nil {
				b.fail("docker", fmt.Errorf("start the exec target: %w", err))
			} else {
				id = strings.TrimSpace(out)
				cleanups = append(cleanups, func(ctx context.Context) error {
					_, err := b.docker.docker(ctx, "rm", "-f", id)
					return err
				})
			}
		}
		cs = append(cs, contestant{"docker exec (true)", "docker", func(ctx context.Context, _ int) (time.Duration, error) {
			_, d, err := b.docker.timed(ctx, "exec", id, "true")
			return d, err
		}})
	}
	b.res.ExecRTT = b.interleave(ctx, cs)
	return ctx.Err()
}

// creators returns the burst and idle figures' systems, in table order.
func (b *bench) creators() []creator {
	var cs []creator
	if b.cfg.has("dsec") && b.dsec != nil {
		cs = append(cs, &dsecCreator{s: b.dsec})
	}
	if rt := b.raw["crun"]; rt != nil {
		cs = append(cs, &rawCreator{rt: rt})
	}
	if b.cfg.has("docker") && b.docker != nil {
		cs = append(cs, &dockerCreator{d: b.docker})
	}
	return cs
}

// creatorRows names the rows of systems that have no creator.
func (b *bench) missingCreators() []BurstRow {
	var rows []BurstRow
	if b.cfg.has("dsec") && b.dsec == nil {
		rows = append(rows, BurstRow{Name: "dsec Create", System: "dsec", Skipped: b.skip("dsec")})
	}
	if b.cfg.has("crun") && b.raw["crun"] == nil {
		rows = append(rows, BurstRow{Name: "crun create+start (sleep)", System: "crun", Skipped: b.skip("crun")})
	}
	if b.cfg.has("docker") && b.docker == nil {
		rows = append(rows, BurstRow{Name: "docker run -d (sleep)", System: "docker", Skipped: b.skip("docker")})
	}
	return rows
}

// fillAndClean runs a burst and deletes what it made, timing the delete.
func (b *bench) fillAndClean(ctx context.Context, c creator, count, conc int) (fill, time.Duration, error) {
	f, err := runFill(ctx, c, count, conc)
	t0 := time.Now()
	cerr := c.cleanup(context.WithoutCancel(ctx))
	del := time.Since(t0)
	if err == nil && cerr != nil {
		err = fmt.Errorf("%s: cleanup: %w", c.name(), cerr)
	}
	return f, del, err
}

func (b *bench) bursts(ctx context.Context) error {
	cs := b.creators()
	// The host's CPU while everything idles, to subtract from the bursts'.
	c0, err := harness.ReadCPUTimes()
	if err != nil {
		return err
	}
	t0 := time.Now()
	select {
	case <-time.After(3 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	c1, _ := harness.ReadCPUTimes()
	b.res.BackgroundCPUPct = 100 * c1.Sub(c0).BusyTime().Seconds() / time.Since(t0).Seconds()

	probeN := min(b.cfg.probe, b.cfg.burst)
	probes := make([][]Probe, len(cs))
	best := make([]fill, len(cs))
	bestDel := make([]time.Duration, len(cs))
	for ci, conc := range b.cfg.concurrencies {
		for j := range cs {
			k := (ci + j) % len(cs)
			c := cs[k]
			if b.skip(c.system()) != "" {
				continue
			}
			progress("  %s: %d at concurrency %d", c.name(), probeN, conc)
			f, del, err := b.fillAndClean(ctx, c, probeN, conc)
			if err != nil {
				b.fail(c.system(), err)
				continue
			}
			probes[k] = append(probes[k], Probe{Concurrency: conc, Count: probeN, Rate: f.rate()})
			if best[k].Count == 0 || f.rate() > best[k].rate() {
				best[k], bestDel[k] = f, del
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	for k, c := range cs {
		if b.skip(c.system()) != "" {
			b.res.Burst = append(b.res.Burst, BurstRow{Name: c.name(), System: c.system(), Skipped: b.skip(c.system())})
			continue
		}
		f, del := best[k], bestDel[k]
		if probeN < b.cfg.burst {
			progress("  %s: %d at concurrency %d", c.name(), b.cfg.burst, f.Conc)
			var err error
			f, del, err = b.fillAndClean(ctx, c, b.cfg.burst, f.Conc)
			if err != nil {
				b.fail(c.system(), err)
				b.res.Burst = append(b.res.Burst, BurstRow{Name: c.name(), System: c.system(), Skipped: b.skip(c.system())})
				continue
			}
		}
		row := burstRow(f, c.name(), c.system(), b.res.BackgroundCPUPct)
		row.DeleteSeconds = del.Seconds()
		row.Probes = probes[k]
		b.res.Burst = append(b.res.Burst, row)
		if dc, ok := c.(*dsecCreator); ok {
			b.res.Burst = append(b.res.Burst, b.batchBurst(ctx, dc))
		}
	}
	b.res.Burst = append(b.res.Burst, b.missingCreators()...)
	return ctx.Err()
}

// batchBurst is dsec's BatchCreate of the whole burst.
func (b *bench) batchBurst(ctx context.Context, dc *dsecCreator) BurstRow {
	const name = "dsec BatchCreate"
	if why := b.skip("dsec"); why != "" {
		return BurstRow{Name: name, System: "dsec", Skipped: why}
	}
	progress("  %s of %d", name, b.cfg.burst)
	n := b.cfg.burst
	f := fill{Count: n, Conc: 1}
	_ = dc.prepare(ctx, n)
	c0, err := readCPU(dc.roots())
	if err != nil {
		return BurstRow{Name: name, System: "dsec", Skipped: "failed: " + err.Error()}
	}
	t0 := time.Now()
	err = dc.batch(ctx, n, 1)
	f.Elapsed = time.Since(t0)
	c1, _ := readCPU(dc.roots())
	f.HostCPU, f.ServerCPU, f.ClientCPU = c1.host.Sub(c0.host).BusyTime(), c1.server-c0.server, c1.client-c0.client
	t1 := time.Now()
	cerr := dc.cleanup(context.WithoutCancel(ctx))
	del := time.Since(t1)
	if err = errors.Join(err, cerr); err != nil {
		b.res.Failures = append(b.res.Failures, "dsec BatchCreate: "+err.Error())
		return BurstRow{Name: name, System: "dsec", Skipped: "failed: " + err.Error()}
	}
	row := burstRow(f, name, "dsec", b.res.BackgroundCPUPct)
	row.DeleteSeconds = del.Seconds()
	return row
}

func (b *bench) settle(ctx context.Context) error {
	select {
	case <-time.After(b.cfg.settle):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *bench) idleMemory(ctx context.Context) error {
	for _, c := range b.creators() {
		row := MemoryRow{Name: c.name(), System: c.system(), Count: b.cfg.idle}
		if why := b.skip(c.system()); why != "" {
			row.Skipped = why
			b.res.IdleMemory = append(b.res.IdleMemory, row)
			continue
		}
		row.Concurrency = 8
		for _, r := range b.res.Burst {
			if r.Name == c.name() && r.Concurrency > 0 {
				row.Concurrency = r.Concurrency
			}
		}
		progress("  %s: %d idle at concurrency %d", c.name(), b.cfg.idle, row.Concurrency)
		if err := b.settle(ctx); err != nil {
			return err
		}
		before, err := harness.MemAvailable()
		if err != nil {
			return err
		}
		_, ferr := runFill(ctx, c, b.cfg.idle, row.Concurrency)
		var after int64
		if ferr == nil {
			if err := b.settle(ctx); err != nil {
				_ = c.cleanup(context.WithoutCancel(ctx))
				return err
			}
			after, ferr = harness.MemAvailable()
		}
		if cerr := c.cleanup(context.WithoutCancel(ctx)); ferr == nil && cerr != nil {
			ferr = fmt.Errorf("%s: cleanup: %w", c.name(), cerr)
		}
		if ferr != nil {
			b.fail(c.system(), ferr)
			row.Skipped = b.skip(c.system())
		} else {
			row.Before, row.After = before, after
			row.PerSandbox = float64(before-after) / float64(b.cfg.idle)
		}
		b.res.IdleMemory = append(b.res.IdleMemory, row)
	}
	if b.cfg.has("dsec") && b.dsec == nil {
		b.res.IdleMemory = append(b.res.IdleMemory, MemoryRow{Name: "dsec Create", System: "dsec", Skipped: b.skip("dsec")})
	}
	if b.cfg.has("crun") && b.raw["crun"] == nil {
		b.res.IdleMemory = append(b.res.IdleMemory, MemoryRow{Name: "crun create+start (sleep)", System: "crun", Skipped: b.skip("crun")})
	}
	if b.cfg.has("docker") && b.docker == nil {
		b.res.IdleMemory = append(b.res.IdleMemory, MemoryRow{Name: "docker run -d (sleep)", System: "docker", Skipped: b.skip("docker")})
	}
	return nil
}

// teardown stops every system and removes what the run made.
func (b *bench) teardown(ctx context.Context) error {
	var errs []error
	if b.docker != nil {
		errs = append(errs, b.docker.Stop(ctx))
	}
	if b.dsec != nil {
		if err := b.dsec.up.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("dsec: %w", err))
			if b.cfg.keep {
				progress("dsec logs:\n%s", b.dsec.up.LogTail(20))
			}
		}
	}
	for _, rt := range b.raw {
		errs = append(errs, rt.deleteAll(ctx, 8))
	}
	if b.runner != nil {
		errs = append(errs, b.runner.Close(30*time.Second))
	}
	if b.rawParent != "" {
		errs = append(errs, harness.RemoveCgroupTree(b.rawParent))
	}
	if b.dir != "" {
		if b.cfg.keep {
			progress("kept %s", b.dir)
		} else if err := os.RemoveAll(b.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// output writes the JSON, the table and the plot.
func (b *bench) output() error {
	r := b.res
	var errs []error
	if b.cfg.pngOut != "" && (len(r.CreateFirstExec) > 0 || len(r.ExecRTT) > 0) {
		if err := writePlot(b.cfg.pngOut, r); err != nil {
			errs = append(errs, fmt.Errorf("plot: %w", err))
		} else {
			r.Plot = b.cfg.pngOut
		}
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	fmt.Println(string(js))
	if b.cfg.jsonOut != "" {
		if err := os.WriteFile(b.cfg.jsonOut, append(js, '\n'), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	fmt.Println()
	writeTable(os.Stdout, r)
	return errors.Join(errs...)
}
