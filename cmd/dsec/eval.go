//go:build !dsec_client

package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/codeeval"
)

// defaultFusionURL is where `dsec up` serves the SandboxFusion API.
const defaultFusionURL = "http://127.0.0.1:8080"

func newEvalCmd() *cobra.Command {
	var (
		url, solution, output, language string
		concurrency, limit              int
		runTimeout                      float64
	)
	cmd := &cobra.Command{
		Use:   "eval FILE",
		Short: verbShort("eval"),
		Long: `Run every problem of a HumanEval- or MBPP-format jsonl file (SandboxFusion's
dataset format) through run_code, and report how many passed, the failures by
status, throughput and latency.

A HumanEval program is prompt + solution + test + "check(ENTRY_POINT)"; an MBPP
program is the solution followed by each assert of test_list. A problem passes
when run_code answers Success (the program exited 0 within --run-timeout).
Failures are counted by status: Failed (an assert or another error),
TimeLimitExceeded, SandboxError (the platform could not run it) and HTTPError
(no answer from the API).

--solution picks the code under test: canonical (the dataset's reference
solution), gpt (HumanEval's gpt_solution, a model's answer whose markdown fence
is stripped) or empty (no solution: every problem should fail).`,
		Example: `  dsec eval ../shared/acceptance/humaneval/humaneval_python.jsonl --concurrency 4
  dsec eval mbpp_python.jsonl --solution empty
  dsec eval humaneval_python.jsonl --solution gpt -o json > results.json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sol, err := codeeval.ParseSolution(solution)
			if err != nil {
				return usageErrorf("--solution: %v", err)
			}
			if output != "" && output != "json" {
				return usageErrorf("-o %q: the only format is json", output)
			}
			if concurrency < 1 {
				return usageErrorf("--concurrency must be at least 1")
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			problems, err := codeeval.Load(f, sol)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if limit > 0 && limit < len(problems) {
				problems = problems[:limit]
			}
			if url == "" {
				url = os.Getenv("DSEC_SANDBOXFUSION_URL")
			}
			if url == "" {
				url = defaultFusionURL
			}
			endpoint := strings.TrimSuffix(url, "/")
			if !strings.HasSuffix(endpoint, "/run_code") {
				endpoint += "/run_code"
			}
			errw := cmd.ErrOrStderr()
			r := &codeeval.Runner{URL: endpoint, Concurrency: concurrency, Language: language, RunTimeout: runTimeout}
			last := time.Now()
			r.Progress = func(done int) {
				if time.Since(last) > time.Second || done == len(problems) {
					last = time.Now()
					fmt.Fprintf(errw, "\r%d/%d problems", done, len(problems))
					if done == len(problems) {
						fmt.Fprintln(errw)
					}
				}
			}
			results, sum := r.Run(cmd.Context(), problems)
			out := cmd.OutOrStdout()
			if output == "json" {
				return writeEvalJSON(out, args[0], sol, concurrency, results, sum)
			}
			fmt.Fprintf(out, "%s (%s solutions): %d/%d passed\n", args[0], sol, sum.Passed, sum.Total)
			if len(sum.ByStatus) > 0 {
				var keys []string
				for k := range sum.ByStatus {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "FAILED AS\tCOUNT\tPROBLEMS")
				for _, k := range keys {
					var ids []string
					for _, r := range results {
						if !r.Passed && r.Status == k {
							ids = append(ids, r.ID)
						}
					}
					shown := ids
					if len(shown) > 8 {
						shown = append(shown[:8:8], fmt.Sprintf("… %d more", len(ids)-8))
					}
					fmt.Fprintf(tw, "%s\t%d\t%s\n", k, sum.ByStatus[k], strings.Join(shown, " "))
				}
				_ = tw.Flush()
				for _, r := range results {
					if !r.Passed && (r.Status == "SandboxError" || r.Status == "HTTPError") {
						fmt.Fprintf(out, "first %s: %s: %s\n", r.Status, r.ID, r.Message)
						break
					}
				}
			}
			fmt.Fprintf(out, "%.2f problems/s at concurrency %d (%.1fs); latency per problem p50 %s, p99 %s\n",
				sum.PerSecond, concurrency, sum.Elapsed.Seconds(), sum.P50.Round(time.Millisecond), sum.P99.Round(time.Millisecond))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "url", "", "SandboxFusion API base URL or run_code URL (default $DSEC_SANDBOXFUSION_URL or "+defaultFusionURL+")")
	f.IntVarP(&concurrency, "concurrency", "c", 1, "problems run at once")
	f.StringVar(&solution, "solution", "canonical", "solution to run: canonical, gpt (fence stripped) or empty")
	f.StringVar(&language, "language", "python", "run_code language of the programs")
	f.Float64Var(&runTimeout, "run-timeout", 10, "seconds each program may run")
	f.IntVar(&limit, "limit", 0, "run only the first N problems (0: all)")
	f.StringVarP(&output, "output", "o", "", "json: print every problem's result and the summary as JSON (snake_case names, durations such as \"1.500s\")")
	return cmd
}
