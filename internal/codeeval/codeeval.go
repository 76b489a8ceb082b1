// Package codeeval runs code-generation benchmarks (HumanEval and MBPP
// in SandboxFusion's jsonl format) through a SandboxFusion run_code API:
// it composes each problem's program from a solution and its tests, runs
// them concurrently, and reports passes, failures by status, throughput and
// latency.
//
// A HumanEval program is prompt + solution + test + "\ncheck(ENTRY)\n"; an
// MBPP program is the solution followed by each assert of test_list. A
// program passes when run_code says Success (it exited 0 in time).
package codeeval

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/fusion"
)

// Solution says which solution of a problem to run.
type Solution string

const (
	// Canonical runs the dataset's reference solution.
	Canonical Solution = "canonical"
	// GPT runs HumanEval's gpt_solution, a model's answer in a markdown
	// code block (the fence is stripped).
	GPT Solution = "gpt"
	// Empty runs no solution at all: the function has an empty body
	// (HumanEval) or does not exist (MBPP). Every problem should fail.
	Empty Solution = "empty"
)

// ParseSolution checks a solution name.
func ParseSolution(s string) (Solution, error) {
	switch Solution(s) {
	case Canonical, GPT, Empty:
		return Solution(s), nil
	}
	return "", fmt.Errorf("unknown solution %q: use canonical, gpt or empty", s)
}

// Problem is one composed program.
type Problem struct {
	ID      string
	Program string
}

// row holds the fields of both formats.
type row struct {
	// HumanEval.
	TaskID      string `json:"task_id"`
	Prompt      string `json:"prompt"`
	Test        string `json:"test"`
	EntryPoint  string `json:"entry_point"`
	GPTSolution string `json:"gpt_solution"`
	// MBPP.
	ID       json.RawMessage `json:"id"`
	TestList json.RawMessage `json:"test_list"`
	// Both.
	CanonicalSolution string `json:"canonical_solution"`
}

// Load reads a jsonl file of HumanEval or MBPP problems (each line is
// recognised by its fields) and composes their programs with the given
// solution.
func Load(r io.Reader, sol Solution) ([]Problem, error) {
	var out []Problem
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var rw row
		if err := json.Unmarshal(b, &rw); err != nil {
			return nil, fmt.Errorf("line %d: %v", line, err)
		}
		p, err := compose(rw, sol)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no problems in the file")
	}
	return out, nil
}

func compose(rw row, sol Solution) (Problem, error) {
	switch {
	case rw.TaskID != "" && rw.EntryPoint != "":
		var body string
		switch sol {
		case Canonical:
			body = rw.CanonicalSolution
		case GPT:
			if rw.GPTSolution == "" {
				return Problem{}, fmt.Errorf("%s has no gpt_solution", rw.TaskID)
			}
			// The answer usually repeats the whole function; after the
			// prompt (whose function then has only its docstring), its
			// definition wins, and the prompt's imports stay available.
			body = "\n" + ExtractCode(rw.GPTSolution) + "\n"
		case Empty:
		}
		return Problem{ID: rw.TaskID, Program: rw.Prompt + body + rw.Test + "\ncheck(" + rw.EntryPoint + ")\n"}, nil
	case len(rw.TestList) > 0:
		id := strings.Trim(string(rw.ID), `"`)
		if id == "" {
			return Problem{}, fmt.Errorf("an MBPP problem without an id")
		}
		tests, err := testList(rw.TestList)
		if err != nil {
			return Problem{}, fmt.Errorf("MBPP %s: test_list: %v", id, err)
		}
		var body string
		switch sol {
		case Canonical:
			body = rw.CanonicalSolution
		case GPT:
			return Problem{}, fmt.Errorf("MBPP %s: MBPP problems have no gpt_solution", id)
		case Empty:
		}
		return Problem{ID: "MBPP/" + id, Program: body + "\n" + strings.Join(tests, "\n") + "\n"}, nil
	}
	return Problem{}, fmt.Errorf("neither a HumanEval problem (task_id, prompt, test, entry_point) nor an MBPP one (id, test_list)")
}

// testList decodes MBPP's test_list: a JSON list, or a string holding one.
func testList(raw json.RawMessage) ([]string, error) {
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil {
		return list, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("want a list of asserts")
	}
	if err := json.Unmarshal([]byte(s), &list); err != nil {
		return nil, fmt.Errorf("want a list of asserts")
	}
	return list, nil
}

// ExtractCode returns the code of the first fenced markdown block of s
// (``` or ```python), or s itself when it has none.
func ExtractCode(s string) string {
	lines := strings.Split(s, "\n")
	start := -1
	for i, l := range lines {
		t := strings.TrimSpace(l)
		if start < 0 {
			if strings.HasPrefix(t, "```") {
				start = i + 1
			}
			continue
		}
		if t == "```" {
			return strings.Join(lines[start:i], "\n")
		}
	}
	if start >= 0 {
		return strings.Join(lines[start:], "\n") // an unclosed fence
	}
	return s
}

// Result is one problem's outcome.
type Result struct {
	ID     string `json:"id"`
	Passed bool   `json:"passed"`
	// Status is Success, Failed, TimeLimitExceeded, SandboxError, or
	// HTTPError when the API did not answer.
	Status  string        `json:"status"`
	Message string        `json:"message,omitempty"`
	Latency time.Duration `json:"latency_ns"`
}

// Summary sums up a run.
type Summary struct {
	Total    int            `json:"total"`
	Passed   int            `json:"passed"`
	ByStatus map[string]int `json:"failures_by_status"`
	Elapsed  time.Duration  `json:"elapsed_ns"`
	// PerSecond is problems per second over the run.
	PerSecond float64       `json:"problems_per_second"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
}

// Runner sends problems to a run_code API.
type Runner struct {
	// URL of run_code (e.g. http://127.0.0.1:8080/run_code).
	URL string
	// Concurrency is the number of calls in flight (default 1).
	Concurrency int
	// Language of the programs (default python); RunTimeout in seconds
	// (default SandboxFusion's 10).
	Language   string
	RunTimeout float64
	// Client defaults to one with a connection per worker.
	Client *http.Client
	// Progress, when set, is called after each problem with the number
	// done, one call at a time.
	Progress func(done int)
}

// Run runs every problem and returns the results in the problems' order.
func (r *Runner) Run(ctx context.Context, problems []Problem) ([]Result, Summary) {
	n := max(r.Concurrency, 1)
	client := r.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
		defer client.CloseIdleConnections()
	}
	results := make([]Result, len(problems))
	next := make(chan int)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done int
	)
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				results[i] = r.one(ctx, client, problems[i])
				mu.Lock()
				done++
				if r.Progress != nil {
					r.Progress(done)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range problems {
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			for j := i; j < len(problems); j++ {
				if results[j].ID == "" {
					results[j] = Result{ID: problems[j].ID, Status: "HTTPError", Message: ctx.Err().Error()}
				}
			}
			break
		}
	}
	close(next)
	wg.Wait()
	return results, Summarize(results, time.Since(start))
}

func (r *Runner) one(ctx context.Context, client *http.Client, p Problem) Result {
	lang := r.Language
	if lang == "" {
		lang = "python"
	}
	timeout := r.RunTimeout
	if timeout <= 0 {
		timeout = fusion.DefaultRunTimeout
	}
	body, _ := json.Marshal(map[string]any{"code": p.Program, "language": lang, "run_timeout": timeout})
	start := time.Now()
	res := Result{ID: p.ID}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(body))
	if err != nil {
		res.Status, res.Message = "HTTPError", err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		res.Status, res.Message, res.Latency = "HTTPError", err.Error(), time.Since(start)
		return res
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	res.Latency = time.Since(start)
	if err != nil || resp.StatusCode != http.StatusOK {
		res.Status, res.Message = "HTTPError", fmt.Sprintf("HTTP %d: %s %v", resp.StatusCode, bytes.TrimSpace(b), err)
		return res
	}
	var out fusion.RunCodeResponse
	if err := json.Unmarshal(b, &out); err != nil {
		res.Status, res.Message = "HTTPError", "the answer is not a run_code response: "+err.Error()
		return res
	}
	res.Status, res.Message = string(out.Status), out.Message
	switch {
	case out.Status == fusion.StatusSuccess:
		res.Passed = true
	case out.RunResult != nil && out.RunResult.Status == fusion.CommandTimeLimitExceeded:
		res.Status = string(fusion.CommandTimeLimitExceeded)
	case out.Status == fusion.StatusFailed && out.RunResult != nil && out.RunResult.Stderr != nil:
		res.Message = lastLine(*out.RunResult.Stderr)
	}
	return res
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// Summarize sums results up.
func Summarize(results []Result, elapsed time.Duration) Summary {
	s := Summary{Total: len(results), ByStatus: map[string]int{}, Elapsed: elapsed}
	var lat []time.Duration
	for _, r := range results {
		if r.Passed {
			s.Passed++
		} else {
			s.ByStatus[r.Status]++
		}
		if r.Latency > 0 {
			lat = append(lat, r.Latency)
		}
	}
	if elapsed > 0 {
		s.PerSecond = float64(len(results)) / elapsed.Seconds()
	}
	s.P50, s.P99 = Percentile(lat, 50), Percentile(lat, 99)
	return s
}

// Percentile returns the p-th percentile (nearest rank) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	k := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(k, 0), len(s)-1)]
}

// PassVector is a line of one character per problem, in order: 1 passed,
// 0 failed.
func PassVector(results []Result) string {
	var b strings.Builder
	for _, r := range results {
		if r.Passed {
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
	}
	return b.String()
}
