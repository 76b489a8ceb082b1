//go:build linux

// Command fusion measures the SandboxFusion API's throughput: HumanEval's
// 164 canonical solutions through run_code at concurrency 1, 2, 4 and 8,
// with each problem's latency (p50, p99) and the host CPU time per problem.
// It starts a private `dsec up`, builds the Python image from Debian
// packages, and prints a table and JSON. Run it as root: `make bench-fusion`
// (or go run ./bench/fusion).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
	"github.com/dsecproject/dsec/internal/codeeval"
)

// Level is one concurrency's result.
type Level struct {
	Concurrency int     `json:"concurrency"`
	Problems    int     `json:"problems"`
	Passed      int     `json:"passed"`
	PerSecond   float64 `json:"problems_per_second"`
	P50ms       float64 `json:"p50_ms"`
	P99ms       float64 `json:"p99_ms"`
	// CPUms is the host's busy CPU time per problem (every process).
	CPUms float64 `json:"host_cpu_ms_per_problem"`
}

// Report is the benchmark's JSON.
type Report struct {
	Date     time.Time `json:"date"`
	CPUs     int       `json:"host_cpus"`
	PoolSize int       `json:"pool_size"`
	ImageS   float64   `json:"python_image_build_s"`
	Levels   []Level   `json:"levels"`
}

func main() {
	bin := flag.String("bin", os.Getenv("DSEC_BIN"), "static dsec binary (default $DSEC_BIN)")
	levels := flag.String("c", "1,2,4,8", "concurrency levels, comma-separated")
	data := flag.String("data", "", "HumanEval jsonl (default: ../shared/acceptance/humaneval/humaneval_python.jsonl from the repository root)")
	pool := flag.Int("pool", 4, "--sandboxfusion-pool of the dsec up")
	jsonOut := flag.String("json", "", "also write the JSON here")
	flag.Parse()
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the benchmark creates real sandboxes")
	}
	if *bin == "" {
		log.Fatal("no dsec binary: pass -bin or set DSEC_BIN (make bench-fusion does)")
	}
	var cs []int
	for _, s := range strings.Split(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			log.Fatalf("-c %q: want positive integers", *levels)
		}
		cs = append(cs, n)
	}
	if *data == "" {
		*data = filepath.Join(repoRoot(), "..", "shared", "acceptance", "humaneval", "humaneval_python.jsonl")
	}
	f, err := os.Open(*data)
	if err != nil {
		log.Fatal(err)
	}
	problems, err := codeeval.Load(f, codeeval.Canonical)
	f.Close()
	if err != nil {
		log.Fatal(err)
	}
	rep, err := run(*bin, *pool, problems, cs)
	if err != nil {
		log.Fatal(err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "concurrency\tproblems/s\tp50 ms\tp99 ms\thost CPU ms/problem\tpassed\t\n")
	for _, l := range rep.Levels {
		fmt.Fprintf(tw, "%d\t%.2f\t%.0f\t%.0f\t%.0f\t%d/%d\t\n", l.Concurrency, l.PerSecond, l.P50ms, l.P99ms, l.CPUms, l.Passed, l.Problems)
	}
	_ = tw.Flush()
	fmt.Printf("(%d CPUs, pool %d per image, python image built in %.0fs)\n", rep.CPUs, rep.PoolSize, rep.ImageS)
	b, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Println(string(b))
	if *jsonOut != "" {
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

func repoRoot() string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		wd, _ := os.Getwd()
		return wd
	}
	return strings.TrimSpace(string(out))
}

func run(bin string, pool int, problems []codeeval.Problem, levels []int) (*Report, error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "dsec-bench-fusion-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// The sandboxes' (unprivileged) roots must traverse it to their roots.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	fusionAddr := ln.Addr().String()
	ln.Close()
	d, err := harness.StartDsec(ctx, harness.DsecConfig{
		Bin: bin, StateDir: filepath.Join(dir, "state"), CgroupParent: "dsec-bench-fusion",
		Args: []string{"--sandboxfusion-listen", fusionAddr, "--sandboxfusion-pool", strconv.Itoa(pool)},
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := d.Stop(ctx); err != nil {
			log.Print(err)
		}
	}()
	rep := &Report{Date: time.Now().UTC(), CPUs: runtime.NumCPU(), PoolSize: pool}
	start := time.Now()
	build := exec.Command(filepath.Join(repoRoot(), "scripts", "sandboxfusion-images.sh"), "python")
	build.Env = append(os.Environ(), "DSEC="+bin, "DSEC_ADDR=http://"+d.Addr, "DSEC_STATE_DIR="+d.StateDir(), "DSEC_API_KEY=")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the python image: %v\n%s", err, out)
	}
	rep.ImageS = time.Since(start).Seconds()
	log.Printf("python image built in %.0fs", rep.ImageS)

	url := "http://" + fusionAddr + "/run_code"
	// Warm up: fill the pool and the page cache.
	warm := &codeeval.Runner{URL: url, Concurrency: 2}
	warm.Run(ctx, problems[:min(8, len(problems))])
	for _, c := range levels {
		time.Sleep(3 * time.Second) // let the pool refill
		r := &codeeval.Runner{URL: url, Concurrency: c}
		cpu0, _ := harness.ReadCPUTimes()
		res, sum := r.Run(ctx, problems)
		cpu1, _ := harness.ReadCPUTimes()
		if sum.Passed != sum.Total {
			for _, r := range res {
				if !r.Passed {
					return nil, fmt.Errorf("concurrency %d: %d/%d passed (%v); first failure %s: %s %s", c, sum.Passed, sum.Total, sum.ByStatus, r.ID, r.Status, r.Message)
				}
			}
		}
		l := Level{
			Concurrency: c, Problems: sum.Total, Passed: sum.Passed, PerSecond: sum.PerSecond,
			P50ms: ms(sum.P50), P99ms: ms(sum.P99),
			CPUms: ms(cpu1.Sub(cpu0).BusyTime()) / float64(max(sum.Total, 1)),
		}
		log.Printf("concurrency %d: %.2f problems/s, p50 %.0f ms, p99 %.0f ms, %d/%d passed", c, l.PerSecond, l.P50ms, l.P99ms, l.Passed, l.Problems)
		rep.Levels = append(rep.Levels, l)
	}
	return rep, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
