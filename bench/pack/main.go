//go:build linux

// Command pack measures pack_diff: how long PackDiff takes, and how long
// it keeps the sandbox frozen, as the sandbox's diff grows in bytes (one
// large file) and in files (many small ones). It starts a private
// `dsec up`, builds a busybox image, and for each case writes the diff in
// a fresh sandbox and packs it -n times; it prints a table and JSON. Run
// it as root: `make bench-pack` (or go run ./bench/pack).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Case is one diff's result; times are medians over the runs.
type Case struct {
	Name      string  `json:"name"`
	DiffBytes int64   `json:"diff_bytes"`
	DiffFiles int     `json:"diff_files"`
	Runs      int     `json:"runs"`
	LayerSize int64   `json:"layer_bytes"`
	Names     int64   `json:"layer_names"`
	PackMs    float64 `json:"pack_ms_p50"`
	PackMaxMs float64 `json:"pack_ms_max"`
	FrozenMs  float64 `json:"frozen_ms_p50"`
	MBps      float64 `json:"mib_per_s"`
}

// Report is the benchmark's JSON.
type Report struct {
	Date  time.Time `json:"date"`
	CPUs  int       `json:"host_cpus"`
	Cases []Case    `json:"cases"`
}

func main() {
	bin := flag.String("bin", os.Getenv("DSEC_BIN"), "static dsec binary (default $DSEC_BIN)")
	sizes := flag.String("sizes", "1M,10M,100M", "sizes of one-file diffs, comma-separated (K, M, G suffixes)")
	files := flag.String("files", "1000,10000", "numbers of small files of many-file diffs, comma-separated")
	runs := flag.Int("n", 3, "packs per case")
	jsonOut := flag.String("json", "", "also write the JSON here")
	flag.Parse()
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the benchmark creates real sandboxes")
	}
	if *bin == "" {
		log.Fatal("no dsec binary: pass -bin or set DSEC_BIN (make bench-pack does)")
	}
	if *runs < 1 {
		log.Fatal("-n must be at least 1")
	}
	var cases []Case
	for _, s := range splitList(*sizes) {
		n, err := dsec.ParseSize(s)
		if err != nil || n <= 0 {
			log.Fatalf("-sizes %q: %v", s, err)
		}
		cases = append(cases, Case{Name: "1 file of " + s, DiffBytes: n, DiffFiles: 1})
	}
	for _, s := range splitList(*files) {
		var n int
		if _, err := fmt.Sscan(s, &n); err != nil || n <= 0 {
			log.Fatalf("-files %q: want positive integers", s)
		}
		cases = append(cases, Case{Name: fmt.Sprintf("%d small files", n), DiffFiles: n})
	}
	rep, err := run(*bin, cases, *runs)
	if err != nil {
		log.Fatal(err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "diff\tlayer bytes\tnames\tpack ms p50\tpack ms max\tfrozen ms p50\tMiB/s\t\n")
	for _, c := range rep.Cases {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.0f\t\n", c.Name, c.LayerSize, c.Names, c.PackMs, c.PackMaxMs, c.FrozenMs, c.MBps)
	}
	_ = tw.Flush()
	fmt.Printf("(%d CPUs, %d packs per case)\n", rep.CPUs, *runs)
	b, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Println(string(b))
	if *jsonOut != "" {
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func run(bin string, cases []Case, runs int) (rep *Report, err error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "dsec-bench-pack-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// The sandboxes' (unprivileged) roots must traverse it to their roots.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	d, err := harness.StartDsec(ctx, harness.DsecConfig{Bin: bin, StateDir: filepath.Join(dir, "state"), CgroupParent: "dsec-bench-pack"})
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := d.Stop(ctx); serr != nil && err == nil {
			err = serr
		}
	}()
	root := filepath.Join(dir, "rootfs")
	if out, err := exec.Command(filepath.Join(repoRoot(), "scripts", "busybox-rootfs.sh"), root).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("busybox rootfs: %v\n%s", err, out)
	}
	if err := d.BuildImage(ctx, "busybox", root); err != nil {
		return nil, err
	}
	rep = &Report{Date: time.Now().UTC(), CPUs: runtime.NumCPU()}
	for i, c := range cases {
		res, err := measure(ctx, d.Client, c, runs, i)
		if err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", c.Name, err, d.LogTail(20))
		}
		log.Printf("%s: pack %.1f ms, frozen %.1f ms, layer %d bytes", res.Name, res.PackMs, res.FrozenMs, res.LayerSize)
		rep.Cases = append(rep.Cases, res)
	}
	return rep, nil
}

// measure writes c's diff in a new sandbox and packs it runs times.
func measure(ctx context.Context, c *dsec.Client, cs Case, runs, idx int) (Case, error) {
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Disk: max(2*cs.DiffBytes, 1<<30)})
	if err != nil {
		return cs, err
	}
	defer sb.Delete(context.WithoutCancel(ctx))
	script := fmt.Sprintf("mkdir -p /data && head -c %d /dev/urandom > /data/blob", cs.DiffBytes)
	if cs.DiffBytes == 0 {
		// One directory, 64-byte files, written by one shell.
		script = fmt.Sprintf(`mkdir -p /data && cd /data && i=0; while [ $i -lt %d ]; do echo "file $i of the diff, sixty-four bytes long.........." > f$i; i=$((i+1)); done`, cs.DiffFiles)
	}
	r, err := sb.Shell(ctx, script)
	if err != nil {
		return cs, err
	}
	if r.ExitCode != 0 {
		return cs, fmt.Errorf("write the diff: exit %d: %s", r.ExitCode, r.Stderr)
	}
	var packs, frozen []time.Duration
	for i := range runs {
		t0 := time.Now()
		p, err := sb.PackDiff(ctx, fmt.Sprintf("bench/pack-%d:%d", idx, i))
		if err != nil {
			return cs, err
		}
		packs = append(packs, time.Since(t0))
		frozen = append(frozen, p.Frozen)
		cs.LayerSize, cs.Names = p.LayerSize, p.Files
	}
	cs.Runs = runs
	cs.PackMs, cs.PackMaxMs = ms(median(packs)), ms(slices.Max(packs))
	cs.FrozenMs = ms(median(frozen))
	cs.MBps = float64(cs.LayerSize) / (1 << 20) / median(packs).Seconds()
	return cs, nil
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func repoRoot() string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		wd, _ := os.Getwd()
		return wd
	}
	return strings.TrimSpace(string(out))
}
