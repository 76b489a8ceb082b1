//go:build linux

// Command createexec measures the time from asking for a sandbox to its
// first exec being done, through dsec's API, next to the raw OCI runtime's
// `run` of the same busybox bundle in the same run, interleaved. It prints
// JSON and a table. Run it as root: `make bench` (or go run ./bench/createexec).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/nsexec"
	"github.com/dsecproject/dsec/internal/oci"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/testenv"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

const rawHelperEnv = "DSEC_BENCH_RAW_HELPER"

func main() {
	if os.Getenv(rawHelperEnv) != "" {
		rawHelper()
		return
	}
	n := flag.Int("n", 30, "measured iterations of each")
	warmup := flag.Int("warmup", 3, "unmeasured iterations first")
	runtime := flag.String("runtime", "crun", "OCI runtime for both dsec and the raw baseline: crun or runc")
	bin := flag.String("bin", os.Getenv("DSEC_BIN"), "static dsec binary (default $DSEC_BIN)")
	jsonOut := flag.String("json", "", "also write the JSON here")
	flag.Parse()
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the benchmark creates real sandboxes")
	}
	if *bin == "" {
		log.Fatal("no dsec binary: pass -bin or set DSEC_BIN (make bench does)")
	}
	res, err := run(*bin, *runtime, *n, *warmup)
	if err != nil {
		log.Fatal(err)
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	fmt.Println(string(b))
	if *jsonOut != "" {
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "measure\tn\tp50 ms\tp90 ms\tp99 ms\tmean ms")
	for _, s := range []Stats{res.DsecCreateFirstExec, res.RawRun, res.DsecExecRTT} {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\n", s.Name, s.N, s.P50, s.P90, s.P99, s.Mean)
	}
	tw.Flush()
	fmt.Printf("\ndsec create→first exec p50 / raw %s run p50 = %.2f×\n", *runtime, res.RatioP50)
}

// Result is the benchmark's JSON.
type Result struct {
	Runtime             string  `json:"runtime"`
	Kernel              string  `json:"kernel"`
	CPUs                int     `json:"cpus"`
	DsecCreateFirstExec Stats   `json:"dsec_create_first_exec"`
	RawRun              Stats   `json:"raw_run"`
	DsecExecRTT         Stats   `json:"dsec_exec_rtt"`
	RatioP50            float64 `json:"ratio_p50_dsec_over_raw"`
}

// Stats summarises durations in milliseconds.
type Stats struct {
	Name string  `json:"name"`
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Mean float64 `json:"mean_ms"`
}

func summarize(name string, ds []time.Duration) Stats {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	q := func(p float64) float64 { return ms(ds[min(len(ds)-1, int(p*float64(len(ds))))]) }
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return Stats{Name: name, N: len(ds), P50: q(0.5), P90: q(0.9), P99: q(0.99), Mean: ms(sum / time.Duration(len(ds)))}
}

func run(bin, runtime string, n, warmup int) (*Result, error) {
	dir, err := os.MkdirTemp("", "dsec-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	parent := fmt.Sprintf("dsec-bench-%d", os.Getpid())
	defer removeCgroupParent(parent)

	// The busybox root file system, for dsec as an EROFS image and for the
	// raw runtime as a directory owned by the same shifted ids.
	root := filepath.Join(dir, "rootfs")
	if out, err := exec.Command(filepath.Join(testenv.ModuleRoot(), "scripts", "busybox-rootfs.sh"), root).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("busybox rootfs: %v: %s", err, out)
	}
	raw, err := rawBundle(dir, root, parent)
	if err != nil {
		return nil, err
	}

	state := filepath.Join(dir, "state")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	up := exec.Command(bin, "up", "--state-dir", state, "--listen", addr, "--runtime", runtime,
		"--cgroup-parent", parent, "--node", "bench", "--log-level", "warn", "--sandboxfusion-listen=")
	up.Stderr = os.Stderr
	if err := up.Start(); err != nil {
		return nil, err
	}
	defer func() {
		_ = up.Process.Signal(syscall.SIGTERM)
		_ = up.Wait()
		// Stop the keeper and its sandboxes.
		kc := keeper.NewClient(state)
		_ = kc.Shutdown(context.Background(), true)
		kc.Close()
	}()
	if err := waitHealthy(addr); err != nil {
		return nil, err
	}
	key, err := os.ReadFile(filepath.Join(state, "admin.key"))
	if err != nil {
		return nil, err
	}
	c, err := dsec.New(dsec.Config{Addr: "http://" + addr, APIKey: strings.TrimSpace(string(key))})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	build := exec.Command(bin, "image", "build", "busybox", "--from-dir", root)
	build.Env = append(os.Environ(), "DSEC_ADDR=http://"+addr, "DSEC_STATE_DIR="+state)
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("image build: %v: %s", err, out)
	}

	helper, err := startRawHelper(runtime, raw)
	if err != nil {
		return nil, err
	}
	defer helper.close()

	ctx := context.Background()
	var dsecTimes, rawTimes, rtts []time.Duration
	for i := range warmup + n {
		// dsec: create, then the first exec done.
		t0 := time.Now()
		sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20})
		if err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		r, err := sb.Exec(ctx, []string{"true"})
		d := time.Since(t0)
		if err != nil || r.ExitCode != 0 {
			return nil, fmt.Errorf("first exec: %v %+v", err, r)
		}
		if i >= warmup {
			dsecTimes = append(dsecTimes, d)
			for range 3 {
				t1 := time.Now()
				if _, err := sb.Exec(ctx, []string{"true"}); err != nil {
					return nil, err
				}
				rtts = append(rtts, time.Since(t1))
			}
		}
		if err := sb.Delete(ctx); err != nil {
			return nil, fmt.Errorf("delete: %w", err)
		}
		// The raw runtime: run of the same bundle with `true`.
		rd, err := helper.run(fmt.Sprintf("raw-%d", i))
		if err != nil {
			return nil, err
		}
		if i >= warmup {
			rawTimes = append(rawTimes, rd)
		}
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	res := &Result{
		Runtime:             runtime,
		Kernel:              unix.ByteSliceToString(uts.Release[:]),
		CPUs:                numCPU(),
		DsecCreateFirstExec: summarize("dsec create → first exec done", dsecTimes),
		RawRun:              summarize("raw "+runtime+" run (true)", rawTimes),
		DsecExecRTT:         summarize("dsec exec true RTT (warm)", rtts),
	}
	res.RatioP50 = res.DsecCreateFirstExec.P50 / res.RawRun.P50
	return res, nil
}

func numCPU() int {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) == nil {
		return set.Count()
	}
	return 0
}

func waitHealthy(addr string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("dsec up did not become ready")
}

// rawBundle makes an OCI bundle for the raw runtime: the same spec dsec
// writes (namespaces, user namespace with the same id range, masks), with a
// copy of the busybox tree shifted to the range as its root, running true.
func rawBundle(dir, root, parent string) (string, error) {
	b := filepath.Join(dir, "raw")
	rfs := filepath.Join(b, "rootfs")
	if err := os.MkdirAll(b, 0o711); err != nil {
		return "", err
	}
	if out, err := exec.Command("cp", "-a", root, rfs).CombinedOutput(); err != nil {
		return "", fmt.Errorf("copy rootfs: %v: %s", err, out)
	}
	m := rootfs.Default
	err := filepath.Walk(rfs, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		return os.Lchown(p, int(m.HostID+st.Uid), int(m.HostID+st.Gid))
	})
	if err != nil {
		return "", err
	}
	spec := oci.New(oci.Options{
		Rootfs: rfs, Hostname: "raw", Args: []string{"/bin/true"}, Env: []string{"PATH=/bin"},
		HostUID: m.HostID, HostGID: m.HostID, Size: m.Size,
		CgroupsPath: "/" + parent + "/raw", Caps: nsexec.CapNames(nsexec.DefaultCaps),
	})
	return b, oci.WriteBundle(b, spec)
}

// rawClient talks to the helper that runs the raw runtime from a mount
// namespace where a hybrid host's cgroup2 mount is hidden (crun refuses
// hybrid hosts otherwise), exactly as dsec's keeper runs it.
type rawClient struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startRawHelper(runtime, bundle string) (*rawClient, error) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), rawHelperEnv+"=1", "RAW_RUNTIME="+runtime, "RAW_BUNDLE="+bundle)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &rawClient{cmd: cmd, in: in, out: bufio.NewReader(out)}, nil
}

func (r *rawClient) run(id string) (time.Duration, error) {
	if _, err := fmt.Fprintln(r.in, id); err != nil {
		return 0, err
	}
	line, err := r.out.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if strings.HasPrefix(line, "error") {
		return 0, fmt.Errorf("raw run: %s", line)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	return time.Duration(ns), err
}

func (r *rawClient) close() {
	r.in.Close()
	_ = r.cmd.Wait()
}

// rawHelper runs in its own mount namespace: it hides cgroup2 like the
// keeper does, then times `runtime run` of the bundle for each id read.
func rawHelper() {
	if err := unix.Unmount("/sys/fs/cgroup/unified", unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		fmt.Fprintln(os.Stderr, "hide cgroup2:", err)
	}
	rt, bundle := os.Getenv("RAW_RUNTIME"), os.Getenv("RAW_BUNDLE")
	rtPath, err := exec.LookPath(rt)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	stateRoot := filepath.Join(filepath.Dir(bundle), "rtstate")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		id := sc.Text()
		t0 := time.Now()
		out, err := exec.Command(rtPath, "--root", stateRoot, "run", "--bundle", bundle, id).CombinedOutput()
		d := time.Since(t0)
		if err != nil {
			fmt.Printf("error %v: %s\n", err, strings.ReplaceAll(string(out), "\n", " "))
			continue
		}
		fmt.Println(d.Nanoseconds())
	}
}

func removeCgroupParent(parent string) {
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range ents {
		p := filepath.Join("/sys/fs/cgroup", h.Name(), parent)
		subs, _ := os.ReadDir(p)
		for _, s := range subs {
			if s.IsDir() {
				_ = os.Remove(filepath.Join(p, s.Name()))
			}
		}
		_ = os.Remove(p)
	}
}
