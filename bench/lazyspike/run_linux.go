package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
)

type machine struct {
	Kernel        string            `json:"kernel"`
	CPUs          int               `json:"cpus"`
	MemTotalMiB   int64             `json:"mem_total_mib"`
	LoadBefore    string            `json:"loadavg_before"`
	LoadAfter     string            `json:"loadavg_after"`
	FuseSysctls   map[string]string `json:"fuse_sysctls"`
	ErofsFeatures []string          `json:"erofs_features"`
	Note          string            `json:"note"`
}

type config struct {
	SizeMiB      int64   `json:"layer_mib"`
	ChunkKiB     int64   `json:"chunk_kib"`
	LatencyMs    float64 `json:"remote_latency_ms"`
	BandwidthMiB int64   `json:"remote_bandwidth_mib_s"`
	Seed         uint64  `json:"seed"`
}

type report struct {
	Command    string            `json:"command"`
	Started    time.Time         `json:"started"`
	Seconds    float64           `json:"seconds"`
	Machine    machine           `json:"machine"`
	Config     config            `json:"config"`
	Image      *images           `json:"image"`
	Chosen     []synthFile       `json:"five_files"`
	Baseline   readFigures       `json:"baseline_local_image_cold"`
	Candidates []candidateResult `json:"candidates"`
	PageCache  []pageCacheResult `json:"page_cache"`
	Faults     []faultResult     `json:"faults"`
	Mounts     []string          `json:"mount_checks"`
	Errors     []string          `json:"errors,omitempty"`
}

func run(args []string) (err error) {
	fl := flag.NewFlagSet("lazyspike", flag.ContinueOnError)
	sizeMiB := fl.Int64("size", 320, "synthetic layer size, MiB of file data")
	chunkKiB := fl.Int64("chunk", 1024, "chunk size, KiB")
	latency := fl.Duration("latency", 2*time.Millisecond, "remote latency per request")
	bwMiB := fl.Int64("bandwidth", 200, "remote bandwidth, MiB/s (0 = unlimited)")
	timeoutSecs := fl.Int("request-timeout", 5, "FUSE request_timeout to test, seconds (0 = skip)")
	jsonOut := fl.String("json", "", "write the JSON report here too")
	base := fl.String("dir", "", "work directory parent (default $TMPDIR); must be on a disk, not tmpfs")
	seed := fl.Uint64("seed", 7, "content seed")
	faultsOnly := fl.Bool("faults-only", false, "run only the mount checks and the fault tests")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("run as root: the spike mounts FUSE and EROFS")
	}
	rep := &report{Command: "lazyspike " + strings.Join(args, " "), Started: time.Now(),
		Config: config{SizeMiB: *sizeMiB, ChunkKiB: *chunkKiB, LatencyMs: float64(latency.Microseconds()) / 1000,
			BandwidthMiB: *bwMiB, Seed: *seed}}
	rep.Machine = machineInfo()

	dir, err := os.MkdirTemp(*base, "lazyspike-")
	if err != nil {
		return err
	}
	clean := &cleanups{}
	clean.push(func() { _ = os.RemoveAll(dir) })
	defer clean.run()
	defer func() {
		if p := recover(); p != nil {
			clean.run()
			panic(p)
		}
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go func() {
		if _, ok := <-sigs; ok {
			clean.run()
			os.Exit(130)
		}
	}()

	k, err := newKeeper(dir, clean)
	if err != nil {
		return err
	}
	ctx := context.Background()
	fmt.Fprintf(os.Stderr, "building a %d MiB layer in %s…\n", *sizeMiB, dir)
	im, err := buildImages(ctx, dir, *sizeMiB<<20, *seed)
	if err != nil {
		return err
	}
	rep.Image = im
	s := &spike{k: k, im: im, chosen: pickFiles(im.files, 5), base: serverConfig{
		chunk: *chunkKiB << 10, latency: *latency, bandwidth: *bwMiB << 20, readers: 8,
	}}
	rep.Chosen = s.chosen
	// The tree's pages are not needed any more; keep them out of the
	// figures (this file set only).
	for _, f := range im.files {
		_ = dropFileCache(filepath.Join(im.tree, f.Path))
	}
	_ = dropFileCache(im.data)
	_ = dropFileCache(im.full)

	note := func(what string, err error) {
		if err != nil {
			rep.Errors = append(rep.Errors, what+": "+err.Error())
			fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
		}
	}
	fmt.Fprintln(os.Stderr, "baseline…")
	if !*faultsOnly {
		rep.Baseline, err = s.baselineLocal()
		note("baseline", err)
	}
	cands := candidates(im)
	fmt.Fprintln(os.Stderr, "mount checks…")
	rep.Mounts = s.mountChecks(cands)
	for _, c := range cands {
		if *faultsOnly {
			break
		}
		fmt.Fprintf(os.Stderr, "candidate %s…\n", c.Name)
		rep.Candidates = append(rep.Candidates, s.runCandidate(c))
	}
	// Page-cache matrix on about an eighth of the layer.
	var subset []synthFile
	var sum int64
	for _, f := range im.files {
		if sum > im.Bytes/8 {
			break
		}
		subset = append(subset, f)
		sum += f.Size
	}
	type cell struct{ fuseDirect, erofsDIO, cacheDirect bool }
	cells := []cell{{false, false, false}, {false, true, false}, {true, false, false}, {true, true, false},
		{true, false, true}, {false, true, true}}
	for _, c := range cands {
		if *faultsOnly {
			break
		}
		for _, x := range cells {
			fmt.Fprintf(os.Stderr, "page cache %s %+v…\n", c.Name, x)
			rep.PageCache = append(rep.PageCache, s.runPageCache(c, x.fuseDirect, x.erofsDIO, x.cacheDirect, subset))
		}
	}
	b := cands[1]
	fmt.Fprintln(os.Stderr, "faults…")
	rep.Faults = append(rep.Faults, s.faultServerExits(b), s.faultServerExits(cands[0]), s.faultAbort(b), s.faultHang(b), s.faultTakeover(b))
	if *timeoutSecs > 0 {
		rep.Faults = append(rep.Faults, s.faultTimeout(b, *timeoutSecs))
	}
	rep.Machine.LoadAfter = loadavg()
	rep.Seconds = time.Since(rep.Started).Seconds()

	out, _ := json.MarshalIndent(rep, "", "  ")
	if *jsonOut != "" {
		if err := os.MkdirAll(filepath.Dir(*jsonOut), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(out, '\n'), 0o644); err != nil {
			return err
		}
	}
	fmt.Println(string(out))
	printTable(rep)
	return nil
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

func machineInfo() machine {
	m := machine{CPUs: runtime.NumCPU(), LoadBefore: loadavg(), FuseSysctls: map[string]string{},
		Note: "shared machine: other jobs run beside the spike; figures are indicative"}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemTotalMiB = int64(si.Totalram) * int64(si.Unit) >> 20
	}
	ents, _ := os.ReadDir("/proc/sys/fs/fuse")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc/sys/fs/fuse", e.Name())) // read only
		if err == nil {
			m.FuseSysctls[e.Name()] = strings.TrimSpace(string(b))
		}
	}
	feats, _ := os.ReadDir("/sys/fs/erofs/features")
	for _, e := range feats {
		m.ErofsFeatures = append(m.ErofsFeatures, e.Name())
	}
	return m
}

func printTable(r *report) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\nlayer: %d files, %.0f MiB data; image %.0f MiB; meta-only %.2f MiB + data blob %.0f MiB; chunk %d KiB; remote %.1f ms + %d MiB/s\n",
		r.Image.Files, mib(r.Image.Bytes), mib(r.Image.FullSize), mib(r.Image.MetaSize), mib(r.Image.DataSize),
		r.Config.ChunkKiB, r.Config.LatencyMs, r.Config.BandwidthMiB)
	fmt.Fprintf(w, "baseline: local image, cold\t%.0f MiB/s\n", r.Baseline.MiBps)
	fmt.Fprintln(w, "\ncandidate\tstep\tMiB read\tMiB/s\tchunks touched\tchunks fetched\tMiB fetched\tFUSE reads")
	for _, c := range r.Candidates {
		if c.Err != "" {
			fmt.Fprintf(w, "%s\tERROR\t%s\n", c.Name, c.Err)
		}
		fmt.Fprintf(w, "%s\twalk (%d stat)\t-\t%.0f ms\t-\t%d\t-\t-\n", c.Name, c.WalkEntries, c.WalkMillis, c.WalkFetched)
		for _, x := range []struct {
			n string
			f readFigures
		}{{"5 files cold", c.Cold5}, {"5 files, 2nd mount", c.Warm5}, {"all, cold", c.SeqCold},
			{"all, chunk cache", c.SeqWarm}, {"all, FUSE page cache", c.SeqPageCached}} {
			fmt.Fprintf(w, "%s\t%s\t%.1f\t%.0f\t%d\t%d\t%.1f\t%d\n", c.Name, x.n, mib(x.f.BytesRead), x.f.MiBps,
				x.f.ChunksTouched, x.f.ChunksFetched, mib(x.f.BytesFetched), x.f.FuseReads)
		}
		fmt.Fprintf(w, "%s\tpage cache after a full read\terofs %.0f MiB, FUSE file %.0f MiB, chunk cache file %.0f MiB\n",
			c.Name, c.CacheAfter.ErofsMiB, c.CacheAfter.FuseFileMiB, c.CacheAfter.ChunkCacheMiB)
	}
	fmt.Fprintln(w, "\ncandidate\tFOPEN_DIRECT_IO\terofs directio\tcache O_DIRECT\tcold MiB/s\terofs MiB\tFUSE file MiB\tchunk cache MiB\t2nd mount MiB/s\t2nd mount FUSE reads")
	for _, p := range r.PageCache {
		if p.Err != "" {
			fmt.Fprintf(w, "%s\t%v\t%v\t%v\tERROR %s\n", p.Candidate, p.FuseDirect, p.ErofsDIO, p.CacheODIR, p.Err)
			continue
		}
		fmt.Fprintf(w, "%s\t%v\t%v\t%v\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\n", p.Candidate, p.FuseDirect, p.ErofsDIO, p.CacheODIR, p.Cold.MiBps,
			p.Cache.ErofsMiB, p.Cache.FuseFileMiB, p.Cache.ChunkCacheMiB, p.Remount.MiBps, p.Remount.FuseReads)
	}
	w.Flush()
	fmt.Println()
	for _, l := range r.Mounts {
		fmt.Printf("mount check: %s\n", l)
	}
	for _, f := range r.Faults {
		fmt.Printf("\nfault: %s (%s)\n", f.Name, f.Candidate)
		for _, s := range f.Steps {
			fmt.Printf("  - %s\n", s)
		}
		if f.Err != "" {
			fmt.Printf("  ERROR %s\n", f.Err)
		}
	}
	for _, e := range r.Errors {
		fmt.Printf("error: %s\n", e)
	}
}
