//go:build linux

// Command network measures what issue 14's sandbox network costs, in one
// run, the systems compared taking turns so that the machine's noise hits
// them alike:
//
//   - create → first exec (`true`) of a sandbox with network (allow= an
//     operator service of the benchmark's --network-config) against one
//     without; target: with ≤ 1.2× without at p50;
//   - one 1 GiB download from a sandbox through the egress proxy against
//     the same client and server on the host (a local address, so the
//     kernel's loopback: no veth, no proxy, the best the machine does; a namespace of our own reaching
//     the host directly would need a link in the host's namespace, which
//     dsec never makes); target: ≥ 0.8× at the median;
//   - the connection rate through the proxy (one sandbox, and several at
//     once) against the same clients on the host.
//
// The client is this program (built static, copied into the busybox image as
// /bin/dsec-bench-net); the server runs in this process on an address of
// the host (eth0's, say: 127.0.0.1 in a sandbox is its own loopback),
// which the sandboxes reach only through the operator entry "bench"
// (cidrs that address/32, the server's port). It starts a private `dsec up`
// on a temporary state dir, a free port and its own cgroup parent, and
// removes everything at the end. It prints a table and JSON (also written
// to -json), with the host's load average before and after. Run it as
// root: `make bench-network`.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Issue 14's targets.
const (
	TargetCreate   = 1.2 // with network over without, p50
	TargetTransfer = 0.8 // through the proxy over direct, median
)

// clientPath is where the client is in the image.
const clientPath = "/bin/dsec-bench-net"

// Report is the benchmark's JSON.
type Report struct {
	Date time.Time `json:"date"`
	CPUs int       `json:"host_cpus"`
	// LoadBefore and LoadAfter are /proc/loadavg's three averages.
	LoadBefore []string `json:"load_before"`
	LoadAfter  []string `json:"load_after"`
	Version    string   `json:"dsec_version"`

	// Create: create → first exec, with network and without.
	Create      []harness.Summary `json:"create"`
	CreateRatio float64           `json:"create_with_over_without_p50"`
	CreateMet   bool              `json:"create_met"`

	// Transfer: one download, through the proxy and direct.
	Transfer      []Rate  `json:"transfer"`
	TransferRatio float64 `json:"transfer_proxy_over_direct_median"`
	TransferMet   bool    `json:"transfer_met"`
	// Direct says what the direct transfer and connections are.
	Direct string `json:"direct"`

	// Connect: connections a second, through the proxy and direct.
	Connect []Rate `json:"connect"`
}

// Rate is a throughput measured in rounds.
type Rate struct {
	Name string `json:"name"`
	Unit string `json:"unit"` // "MB/s" (10^6 bytes) or "conn/s"
	// Samples are every round's rate, sorted.
	Samples []float64 `json:"samples"`
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
}

func newRate(name, unit string, s []float64) Rate {
	s = slices.Clone(s)
	slices.Sort(s)
	r := Rate{Name: name, Unit: unit, Samples: s}
	if len(s) > 0 {
		r.Median, r.Min, r.Max = s[len(s)/2], s[0], s[len(s)-1]
		if len(s)%2 == 0 {
			r.Median = (s[len(s)/2-1] + s[len(s)/2]) / 2
		}
	}
	return r
}

// options are the benchmark's flags.
type options struct {
	bin              string
	n, warmup        int
	size             int64
	rounds           int
	sandboxes, conns int
	host             string
	keep             bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "client" {
		clientMain(os.Args[2:])
		return
	}
	var o options
	flag.StringVar(&o.bin, "bin", os.Getenv("DSEC_BIN"), "static dsec binary (default $DSEC_BIN)")
	flag.IntVar(&o.n, "n", 30, "measured creates of each kind")
	flag.IntVar(&o.warmup, "warmup", 3, "unmeasured creates of each kind before them")
	flag.Int64Var(&o.size, "size", 1<<30, "bytes of one download")
	flag.IntVar(&o.rounds, "rounds", 5, "rounds of the download and of the connection rates")
	flag.IntVar(&o.sandboxes, "sandboxes", 4, "sandboxes connecting at once in the \"several\" rows")
	flag.IntVar(&o.conns, "conns", 150, "connections of one client in a round (a sandbox may open 200 at once, then 100 a second)")
	flag.StringVar(&o.host, "host", "", "the host's IPv4 address the server listens on (default: the first of an interface that is up, not loopback)")
	jsonOut := flag.String("json", "", "also write the JSON here")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (logs, state) for a post-mortem")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("bench: ")
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the benchmark creates real sandboxes")
	}
	if o.bin == "" {
		log.Fatal("no dsec binary: pass -bin or set DSEC_BIN (make bench-network does)")
	}
	if o.n < 1 || o.warmup < 0 || o.rounds < 1 || o.sandboxes < 1 || o.conns < 1 || o.conns > 200 || o.size < 1 {
		log.Fatal("-n, -rounds, -sandboxes, -size must be at least 1, -warmup at least 0, -conns 1 to 200")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, o)
	if err != nil {
		log.Fatal(err)
	}
	printTable(os.Stdout, rep)
	b, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Println(string(b))
	if *jsonOut != "" {
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

func run(ctx context.Context, o options) (rep *Report, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if static, err := isStatic(self); err != nil || !static {
		return nil, fmt.Errorf("%s is not a static binary (%v): build it as make bench-network does", self, err)
	}
	dir, err := os.MkdirTemp("", "dsec-bench-network-")
	if err != nil {
		return nil, err
	}
	if o.keep {
		log.Printf("keeping %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	// The sandboxes' (unprivileged) roots must traverse it to their roots.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	tree := filepath.Join(dir, "busybox")
	if err := harness.Busybox(ctx, tree); err != nil {
		return nil, err
	}
	if err := copyFile(self, filepath.Join(tree, clientPath)); err != nil {
		return nil, err
	}

	host := o.host
	if host == "" {
		if host, err = hostAddr(); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	go serve(ln)
	addr := ln.Addr().String()
	port := ln.Addr().(*net.TCPAddr).Port
	config := filepath.Join(dir, "network.toml")
	toml := fmt.Sprintf("version = 1\n\n[services.bench]\ncidrs = [\"%s/32\"]\nports = [%d]\n", host, port)
	if err := os.WriteFile(config, []byte(toml), 0o644); err != nil {
		return nil, err
	}

	up, err := harness.StartDsec(ctx, harness.DsecConfig{
		Bin: o.bin, StateDir: filepath.Join(dir, "state"),
		CgroupParent: fmt.Sprintf("dsec-bench-network-%d", os.Getpid()),
		Args:         []string{"--network-config", config},
	})
	if up != nil {
		defer func() {
			if serr := up.Stop(context.WithoutCancel(ctx)); serr != nil {
				err = errors.Join(err, fmt.Errorf("stop dsec: %w", serr))
			}
		}()
	}
	if err != nil {
		return nil, err
	}
	if err := up.BuildImage(ctx, "busybox", tree); err != nil {
		return nil, err
	}

	rep = &Report{Date: time.Now().UTC(), CPUs: runtime.NumCPU(), LoadBefore: harness.LoadAvg(),
		Direct: "the same client on the host, to the same server at the host's own address (loopback: no veth, no proxy)"}
	if out, err := exec.Command(o.bin, "--version").Output(); err == nil {
		rep.Version = strings.TrimSpace(string(out))
	}
	b := &bench{up: up, addr: addr, self: self, o: o}
	if err := b.create(ctx, rep); err != nil {
		return nil, err
	}
	if err := b.network(ctx, rep); err != nil {
		return nil, err
	}
	rep.LoadAfter = harness.LoadAvg()
	return rep, nil
}

// bench is one run's dsec, server and options.
type bench struct {
	up   *harness.Dsec
	addr string // the server's
	self string // the client, on the host
	o    options
}

// Row names.
const (
	rowWith    = "create → first exec, network allow=bench"
	rowWithout = "create → first exec, no network"
)

// create measures create → first exec with network and without, taking
// turns; each sandbox is deleted (untimed) before the next.
func (b *bench) create(ctx context.Context, rep *Report) error {
	kinds := []*dsec.NetworkPolicy{dsec.NetworkFlag("allow=bench"), nil}
	samples := make([][]time.Duration, len(kinds))
	log.Printf("create → first exec: %d of each (after %d unmeasured), taking turns", b.o.n, b.o.warmup)
	for i := range b.o.warmup + b.o.n {
		for j := range kinds {
			k := (i + j) % len(kinds)
			t0 := time.Now()
			sb, err := b.up.Client.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Network: kinds[k]})
			if err != nil {
				return fmt.Errorf("create a sandbox: %w", err)
			}
			r, err := sb.Exec(ctx, []string{"true"})
			d := time.Since(t0)
			if err == nil && r.Code() != 0 {
				err = fmt.Errorf("exit %d: %s", r.Code(), r.Stderr)
			}
			if derr := sb.Delete(context.WithoutCancel(ctx)); derr != nil {
				err = errors.Join(err, fmt.Errorf("delete %s: %w", sb.ID, derr))
			}
			if err != nil {
				return fmt.Errorf("exec true in %s: %w", sb.ID, err)
			}
			if i >= b.o.warmup {
				samples[k] = append(samples[k], d)
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	rep.Create = []harness.Summary{harness.Summarize(rowWith, "dsec", samples[0]), harness.Summarize(rowWithout, "dsec", samples[1])}
	if w := rep.Create[1].P50; w > 0 {
		rep.CreateRatio = rep.Create[0].P50 / w
		rep.CreateMet = rep.CreateRatio <= TargetCreate
	}
	return nil
}

// network measures the download and the connection rates, taking turns.
func (b *bench) network(ctx context.Context, rep *Report) (err error) {
	sbs := make([]*dsec.Sandbox, b.o.sandboxes)
	defer func() {
		for _, sb := range sbs {
			if sb == nil {
				continue
			}
			if derr := sb.Delete(context.WithoutCancel(ctx)); derr != nil {
				err = errors.Join(err, fmt.Errorf("delete %s: %w", sb.ID, derr))
			}
		}
	}()
	for i := range sbs {
		sbs[i], err = b.up.Client.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 256 << 20, Network: dsec.NetworkFlag("allow=bench")})
		if err != nil {
			return fmt.Errorf("create a sandbox: %w", err)
		}
	}
	size := strconv.FormatInt(b.o.size, 10)
	conns := strconv.Itoa(b.o.conns)
	several := strconv.Itoa(b.o.sandboxes)
	type op struct {
		name, unit string
		run        func(context.Context) (float64, error)
		budget     bool // spends the sandboxes' connection budgets
	}
	mbps := func(rs []clientResult) float64 { return float64(rs[0].Bytes) / rs[0].Seconds / 1e6 }
	ops := []op{
		{"1 download, through the proxy (sandbox)", "MB/s", b.inSandboxes(sbs[:1], mbps, "get", b.addr, size), false},
		{"1 download, direct (host loopback)", "MB/s", b.onHost(1, mbps, "get", b.addr, size), false},
		{"connections, 1 sandbox, through the proxy", "conn/s", b.inSandboxes(sbs[:1], connRate, "conns", b.addr, conns), true},
		{"connections, 1 client, direct (host)", "conn/s", b.onHost(1, connRate, "conns", b.addr, conns), false},
		{"connections, " + several + " sandboxes at once, through the proxy", "conn/s", b.inSandboxes(sbs, connRate, "conns", b.addr, conns), true},
		{"connections, " + several + " clients at once, direct (host)", "conn/s", b.onHost(len(sbs), connRate, "conns", b.addr, conns), false},
	}
	log.Printf("download of %d bytes and %d connections a client: %d rounds, taking turns", b.o.size, b.o.conns, b.o.rounds)
	samples := make([][]float64, len(ops))
	for i := range b.o.rounds {
		for pair := 0; pair < len(ops); pair += 2 {
			for k := range 2 {
				y := pair + (i+k)%2 // rotate the order
				v, err := ops[y].run(ctx)
				if err != nil {
					return fmt.Errorf("%s: %w", ops[y].name, err)
				}
				samples[y] = append(samples[y], v)
				if ops[y].budget {
					// Let the sandboxes' connection budgets refill (100 a
					// second, bursts of 200).
					time.Sleep(time.Duration(b.o.conns)*10*time.Millisecond + 200*time.Millisecond)
				}
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	for k, o := range ops {
		r := newRate(o.name, o.unit, samples[k])
		if k < 2 {
			rep.Transfer = append(rep.Transfer, r)
		} else {
			rep.Connect = append(rep.Connect, r)
		}
	}
	if d := rep.Transfer[1].Median; d > 0 {
		rep.TransferRatio = rep.Transfer[0].Median / d
		rep.TransferMet = rep.TransferRatio >= TargetTransfer
	}
	return nil
}

// connRate is the connections a second of clients run at once: all their
// connections over the longest client's time.
func connRate(rs []clientResult) float64 {
	var n int
	var longest float64
	for _, r := range rs {
		n += r.Conns
		longest = max(longest, r.Seconds)
	}
	return float64(n) / longest
}

// inSandboxes runs the client with args in every sandbox of sbs at once.
func (b *bench) inSandboxes(sbs []*dsec.Sandbox, rate func([]clientResult) float64, args ...string) func(context.Context) (float64, error) {
	return func(ctx context.Context) (float64, error) {
		return together(len(sbs), rate, func(i int) ([]byte, error) {
			r, err := sbs[i].Exec(ctx, append([]string{clientPath, "client"}, args...))
			if err != nil {
				return nil, err
			}
			if r.Code() != 0 {
				return nil, fmt.Errorf("in %s: exit %d: %s", sbs[i].ID, r.Code(), r.Stderr)
			}
			return r.Stdout, nil
		})
	}
}

// onHost runs n clients with args on the host at once.
func (b *bench) onHost(n int, rate func([]clientResult) float64, args ...string) func(context.Context) (float64, error) {
	return func(ctx context.Context) (float64, error) {
		return together(n, rate, func(int) ([]byte, error) {
			cmd := exec.CommandContext(ctx, b.self, append([]string{"client"}, args...)...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				return nil, fmt.Errorf("%w: %s", err, stderr.String())
			}
			return out, nil
		})
	}
}

// together runs n clients at once and computes rate from their results.
func together(n int, rate func([]clientResult) float64, client func(int) ([]byte, error)) (float64, error) {
	rs := make([]clientResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			out, err := client(i)
			if err == nil {
				err = json.Unmarshal(out, &rs[i])
			}
			if err == nil && rs[i].Seconds <= 0 {
				err = fmt.Errorf("client printed %q", out)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return rate(rs), nil
}

// hostAddr is the first IPv4 address of an interface that is up and not
// loopback: an address of the host that a sandbox reaches through the
// proxy (127.0.0.1 in a sandbox is its own loopback).
func hostAddr() (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		as, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String(), nil
			}
		}
	}
	return "", errors.New("no IPv4 address on an interface that is up: give one with -host")
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func printTable(w io.Writer, rep *Report) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "operation\tn\tp50 ms\tp90 ms\tp99 ms\tmin ms\t\n")
	for _, r := range rep.Create {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t\n", r.Name, r.N, r.P50, r.P90, r.P99, r.Min)
	}
	fmt.Fprintf(tw, "\t\t\t\t\t\t\n")
	fmt.Fprintf(tw, "throughput\trounds\tmedian\tmin\tmax\tunit\t\n")
	for _, r := range append(slices.Clone(rep.Transfer), rep.Connect...) {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.0f\t%s\t\n", r.Name, len(r.Samples), r.Median, r.Min, r.Max, r.Unit)
	}
	_ = tw.Flush()
	verdict := func(met bool) string {
		if met {
			return "met"
		}
		return "NOT met"
	}
	fmt.Fprintf(w, "create with network p50 / without = %.2f (target ≤ %.1f: %s)\n", rep.CreateRatio, TargetCreate, verdict(rep.CreateMet))
	fmt.Fprintf(w, "download through the proxy / direct = %.2f (target ≥ %.1f: %s); direct is %s\n",
		rep.TransferRatio, TargetTransfer, verdict(rep.TransferMet), rep.Direct)
	fmt.Fprintf(w, "%d CPUs, load %s before, %s after\n", rep.CPUs, strings.Join(rep.LoadBefore, " "), strings.Join(rep.LoadAfter, " "))
}
