//go:build !dsec_client

package main

import (
	"encoding/json"
	"io"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dsecproject/dsec/internal/codeeval"
)

// evalReport is `dsec eval -o json`: snake_case names, like the run_code
// API the results come from, and durations as strings in the API's style
// ("1.500s", protobuf's JSON mapping of a Duration), never nanoseconds.
type evalReport struct {
	File        string       `json:"file"`
	Solution    string       `json:"solution"`
	Concurrency int          `json:"concurrency"`
	Summary     evalSummary  `json:"summary"`
	Results     []evalResult `json:"results"`
}

type evalSummary struct {
	Total             int            `json:"total"`
	Passed            int            `json:"passed"`
	FailuresByStatus  map[string]int `json:"failures_by_status"`
	Elapsed           jsonDuration   `json:"elapsed"`
	ProblemsPerSecond float64        `json:"problems_per_second"`
	P50               jsonDuration   `json:"p50_latency"`
	P99               jsonDuration   `json:"p99_latency"`
}

type evalResult struct {
	ID      string       `json:"id"`
	Passed  bool         `json:"passed"`
	Status  string       `json:"status"`
	Message string       `json:"message,omitempty"`
	Latency jsonDuration `json:"latency"`
}

// jsonDuration is a duration in JSON as the API writes one: "900s",
// "1.500s".
type jsonDuration time.Duration

func (d jsonDuration) MarshalJSON() ([]byte, error) {
	return protojson.Marshal(durationpb.New(time.Duration(d)))
}

// writeEvalJSON writes a run's results and summary as indented JSON.
func writeEvalJSON(w io.Writer, file string, sol codeeval.Solution, concurrency int, results []codeeval.Result, sum codeeval.Summary) error {
	rep := evalReport{
		File: file, Solution: string(sol), Concurrency: concurrency,
		Summary: evalSummary{
			Total: sum.Total, Passed: sum.Passed, FailuresByStatus: sum.ByStatus,
			Elapsed: jsonDuration(sum.Elapsed), ProblemsPerSecond: sum.PerSecond,
			P50: jsonDuration(sum.P50), P99: jsonDuration(sum.P99),
		},
		Results: make([]evalResult, 0, len(results)),
	}
	if rep.Summary.FailuresByStatus == nil {
		rep.Summary.FailuresByStatus = map[string]int{}
	}
	for _, r := range results {
		rep.Results = append(rep.Results, evalResult{ID: r.ID, Passed: r.Passed, Status: r.Status, Message: r.Message, Latency: jsonDuration(r.Latency)})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}
