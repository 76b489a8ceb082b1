//go:build linux

// Command pause measures pausing and resuming sandboxes (issue 15): for
// sandboxes holding 64, 256 and 1,024 MiB of dirty anonymous memory, the
// pause (the freeze), the time until 90% of the memory is out of RAM,
// resume to the first exec done and the time until the memory is back,
// each beside, in the same run, a raw cgroup freeze and thaw of the same
// sandbox, an exec round trip, and the raw swap-out and swap-in of the
// same amount of memory by the same mechanism, for a process in a plain
// cgroup of the benchmark's own; then pausing and resuming 500
// sandboxes by label; and, with -mechs, the mechanisms compared
// (docs/pause.md).
//
// It starts a private `dsec up --swap` with a busybox image and fills the
// sandboxes' memory with the adversarial suite's probe (memhold). The
// per-size rounds pause, resume and exec through the node keeper's
// client, as the container backend does (the node's figures), then once
// more through the API (the SDK), as users see it; the 500 are paused and
// resumed by label through the API. Run it as root: `make bench-pause`.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
)

// Config is what to measure.
type Config struct {
	Bin    string
	Sizes  []int // MiB held
	Rounds int   // per size
	Many   int   // sandboxes paused and resumed at once (0: none)
	Conc   int   // concurrent calls for Many
	Mechs  []int // MiB at which to compare the mechanisms (none: skip)
	Swap   int64 // swap file size
}

// SizeResult is one memory size: medians over the rounds (ms), and
// throughputs (MiB/s).
type SizeResult struct {
	MiB    int `json:"mib"`
	Rounds int `json:"rounds"`
	// The sandbox through dsec.
	PauseMs       float64 `json:"pause_ms"`        // Pause call (the freeze) returned
	Out90Ms       float64 `json:"out90_ms"`        // from the Pause call until 90% of the memory left RAM
	MovedMs       float64 `json:"moved_ms"`        // until the move out ended
	OutPct        float64 `json:"out_pct"`         // share of the memory in swap after it
	ResumeExecMs  float64 `json:"resume_exec_ms"`  // Resume call until an exec of `true` is done
	ResumeCallMs  float64 `json:"resume_call_ms"`  // the Resume call alone
	ResidentMs    float64 `json:"resident_ms"`     // Resume call until the memory is back in RAM
	ReclaimMiBps  float64 `json:"reclaim_mib_s"`   // 90% of the memory / Out90Ms
	PageInMiBps   float64 `json:"pagein_mib_s"`    // the memory / ResidentMs
	Intact        bool    `json:"intact"`          // memhold's checksum after every round
	RawFreezeMs   float64 `json:"raw_freeze_ms"`   // cgroup.freeze of the same sandbox, until frozen
	RawThawMs     float64 `json:"raw_thaw_ms"`     // its thaw
	ExecMs        float64 `json:"exec_ms"`         // exec round trip of `true` in it, running
	RPCMs         float64 `json:"rpc_ms"`          // an empty call to the keeper (GET /v1/sandbox/pause)
	RawOut90Ms    float64 `json:"raw_out90_ms"`    // a plain cgroup's process, same memory, same mechanism
	RawOutMiBps   float64 `json:"raw_out_mib_s"`   // 90% of the memory / RawOut90Ms
	RawResidentMs float64 `json:"raw_resident_ms"` // its read-back (willneed, thaw) until in RAM
	RawInMiBps    float64 `json:"raw_in_mib_s"`    // the memory / RawResidentMs
	PauseRatio    float64 `json:"pause_ratio"`     // PauseMs / RawFreezeMs: target <= 2
	StoppedMs     float64 `json:"stopped_ms"`      // the keeper's own time to stop it (PauseInfo.Stopped): the pause without the call
	StoppedRatio  float64 `json:"stopped_ratio"`   // StoppedMs / RawFreezeMs
	ResumeBoundMs float64 `json:"resume_bound_ms"` // 2 × (RawThawMs + ExecMs)
	ReclaimRatio  float64 `json:"reclaim_ratio"`   // ReclaimMiBps / RawOutMiBps: target >= 0.8
	SwapGrowMiB   float64 `json:"swap_grow_mib"`   // /proc/meminfo swap in use grew by this at the pause
	// Through the API (the SDK), in a second pause of the same sandbox.
	APIGetMs        float64   `json:"api_get_ms"`         // an empty call (Get)
	APIExecMs       float64   `json:"api_exec_ms"`        // exec of `true`, running
	APIPauseMs      float64   `json:"api_pause_ms"`       // the Pause call
	APIResumeExecMs float64   `json:"api_resume_exec_ms"` // exec of `true` on the paused sandbox: resume, then the exec
	ResumeExecSpans []float64 `json:"resume_exec_ms_all"`
}

// MechResult is one mechanism of the comparison, on a plain cgroup's
// process: medians (ms).
type MechResult struct {
	Kind   string  `json:"kind"` // "out" or "back"
	Name   string  `json:"name"`
	MiB    int     `json:"mib"`
	Rounds int     `json:"rounds"`
	Out90  float64 `json:"out90_ms,omitempty"`   // until 90% left RAM (-1: never, within the cap)
	Done   float64 `json:"done_ms,omitempty"`    // until the mechanism returned
	OutPct float64 `json:"out_pct,omitempty"`    // share in swap after it
	Touch  float64 `json:"touched_ms,omitempty"` // back: until the process read all of its memory
	Back   float64 `json:"back_ms,omitempty"`    // back: until the memory is in RAM
}

// ManyResult is pausing and resuming many sandboxes at once, by label
// through the API (one call each way; Pause and Resume are the per-sandbox
// times the calls' results report).
type ManyResult struct {
	N           int             `json:"n"`
	Conc        int             `json:"concurrency"`   // of the keeper calls that measure and exec
	PauseAllMs  float64         `json:"pause_all_ms"`  // the Pause by label returned
	MovedAllMs  float64         `json:"moved_all_ms"`  // every move out ended
	ResumeAllMs float64         `json:"resume_all_ms"` // the Resume by label returned
	ExecAllMs   float64         `json:"exec_all_ms"`   // then an exec in each, done
	Pause       harness.Summary `json:"pause"`
	Resume      harness.Summary `json:"resume"`
	ResidentMiB float64         `json:"resident_mib_before"` // all of them, before
	PausedMiB   float64         `json:"resident_mib_paused"` // all of them, paused and moved
	Failed      int             `json:"failed"`
}

// Report is the benchmark's JSON.
type Report struct {
	Date      time.Time    `json:"date"`
	CPUs      int          `json:"host_cpus"`
	MemTotal  int64        `json:"host_mem_bytes"`
	LoadStart []string     `json:"load_start"`
	LoadEnd   []string     `json:"load_end"`
	Mechanism string       `json:"mechanism"`
	Sizes     []SizeResult `json:"sizes"`
	Mechs     []MechResult `json:"mechanisms,omitempty"`
	Many      *ManyResult  `json:"many,omitempty"`
}

func main() {
	var cfg Config
	flag.StringVar(&cfg.Bin, "bin", os.Getenv("DSEC_BIN"), "static dsec binary (default $DSEC_BIN)")
	sizes := flag.String("sizes", "64,256,1024", "MiB held by each sandbox measured, comma-separated")
	flag.IntVar(&cfg.Rounds, "n", 3, "rounds per size (and per mechanism)")
	flag.IntVar(&cfg.Many, "many", 500, "sandboxes paused and resumed at once (0: none)")
	flag.IntVar(&cfg.Conc, "conc", 16, "concurrent calls when pausing and resuming many")
	mechs := flag.String("mechs", "256,1024", "MiB at which to compare the mechanisms of moving memory out and back, comma-separated (empty: none)")
	swapSize := flag.Int64("swap-mib", 3072, "MiB of the swap file dsec up makes")
	jsonOut := flag.String("json", "", "also write the JSON here")
	flag.Parse()
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the benchmark creates real sandboxes and a swap file")
	}
	if cfg.Bin == "" {
		log.Fatal("no dsec binary: pass -bin or set DSEC_BIN (make bench-pause does)")
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 8 {
			log.Fatalf("-sizes %q: want MiB of at least 8", s)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	for _, s := range strings.Split(*mechs, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 8 {
			log.Fatalf("-mechs %q: want MiB of at least 8", s)
		}
		cfg.Mechs = append(cfg.Mechs, n)
	}
	if cfg.Rounds < 1 || cfg.Conc < 1 {
		log.Fatal("-n and -conc must be at least 1")
	}
	cfg.Swap = *swapSize << 20
	rep, err := run(cfg)
	if rep != nil {
		printReport(rep)
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Println(string(b))
		if *jsonOut != "" {
			if werr := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); werr != nil {
				log.Print(werr)
			}
		}
	}
	if err != nil {
		log.Fatal(err)
	}
}

func printReport(rep *Report) {
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "MiB\tpause ms\tkeeper call ms\tin the keeper ms\traw freeze ms\tratio\t90% out ms\tout %\tMiB/s\traw MiB/s\tratio\tresume ms\tresume→exec ms\t2×(thaw+exec) ms\tresident ms\tpage-in MiB/s\traw in MiB/s\tintact\t")
	for _, s := range rep.Sizes {
		fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%.1f\t%.0f\t%.0f\t%.2f\t%.1f\t%.1f\t%.1f\t%.0f\t%.0f\t%.0f\t%v\t\n",
			s.MiB, s.PauseMs, s.RPCMs, s.StoppedMs, s.RawFreezeMs, s.PauseRatio, s.Out90Ms, s.OutPct, s.ReclaimMiBps, s.RawOutMiBps, s.ReclaimRatio,
			s.ResumeCallMs, s.ResumeExecMs, s.ResumeBoundMs, s.ResidentMs, s.PageInMiBps, s.RawInMiBps, s.Intact)
	}
	_ = tw.Flush()
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "MiB\tAPI: Get ms\texec ms\tPause ms\texec on paused (resume+exec) ms\t")
	for _, s := range rep.Sizes {
		fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%.2f\t%.1f\t\n", s.MiB, s.APIGetMs, s.APIExecMs, s.APIPauseMs, s.APIResumeExecMs)
	}
	_ = tw.Flush()
	if len(rep.Mechs) > 0 {
		fmt.Println()
		tw = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "mechanism\tMiB\t90% out ms\treturned ms\tout %\ttouched ms\tback ms\t")
		for _, m := range rep.Mechs {
			if m.Kind == "out" {
				out90 := fmt.Sprintf("%.0f", m.Out90)
				if m.Out90 < 0 {
					out90 = "never"
				}
				fmt.Fprintf(tw, "out: %s\t%d\t%s\t%.0f\t%.1f\t\t\t\n", m.Name, m.MiB, out90, m.Done, m.OutPct)
			} else {
				fmt.Fprintf(tw, "back: %s\t%d\t\t\t\t%.0f\t%.0f\t\n", m.Name, m.MiB, m.Touch, m.Back)
			}
		}
		_ = tw.Flush()
	}
	if m := rep.Many; m != nil {
		fmt.Printf("\n%d sandboxes by label through the API (%d keeper calls at a time to measure): pause all %.0f ms (p50 %.1f ms, p99 %.1f ms), moved out %.0f ms, %.0f MiB -> %.0f MiB resident; resume all %.0f ms (p50 %.1f ms, p99 %.1f ms), an exec in each %.0f ms; %d failed\n",
			m.N, m.Conc, m.PauseAllMs, m.Pause.P50, m.Pause.P99, m.MovedAllMs, m.ResidentMiB, m.PausedMiB, m.ResumeAllMs, m.Resume.P50, m.Resume.P99, m.ExecAllMs, m.Failed)
	}
	fmt.Printf("\ntargets (issue 15), from this run:\n")
	for _, s := range rep.Sizes {
		fmt.Printf("  %4d MiB: pause %.2f× raw freeze (≤ 2: %s; the keeper's own part %.2f×); resume→exec %.1f ms vs 2×(thaw+exec) %.1f ms (%s); out %.1f%% (≥ 90: %s); reclaim %.2f× raw swap-out (≥ 0.8: %s)\n",
			s.MiB, s.PauseRatio, okIf(s.PauseRatio <= 2), s.StoppedRatio, s.ResumeExecMs, s.ResumeBoundMs, okIf(s.ResumeExecMs <= s.ResumeBoundMs),
			s.OutPct, okIf(s.OutPct >= 90), s.ReclaimRatio, okIf(s.ReclaimRatio >= 0.8))
	}
	fmt.Printf("(%d CPUs, load %v at start, %v at end; mechanism: %s)\n", rep.CPUs, rep.LoadStart, rep.LoadEnd, rep.Mechanism)
}

func okIf(b bool) string {
	if b {
		return "met"
	}
	return "NOT met"
}
