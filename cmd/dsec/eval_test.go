package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestEvalJSON runs dsec eval -o json against a run_code server that
// passes one problem and fails the other, and checks the JSON's names and
// that its durations are strings such as "0.120s", not nanoseconds.
func TestEvalJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Code string }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		status := "Success"
		if strings.Contains(req.Code, "fails") {
			status = "Failed"
		}
		time.Sleep(20 * time.Millisecond)
		_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "message": "", "run_result": map[string]any{"status": "Finished"}})
	}))
	t.Cleanup(srv.Close)
	file := filepath.Join(t.TempDir(), "he.jsonl")
	data := `{"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n", "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}
{"task_id": "HumanEval/1", "prompt": "def g():\n", "canonical_solution": "    return 'fails'\n", "test": "def check(c):\n    assert c() == 1\n", "entry_point": "g"}
`
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := dsecRun(t, "http://127.0.0.1:1", "", "eval", file, "--url", srv.URL, "-o", "json")
	if code != 0 {
		t.Fatalf("dsec eval -o json = exit %d: %s", code, errOut)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("dsec eval -o json printed %q: %v", out, err)
	}
	sum, _ := got["summary"].(map[string]any)
	results, _ := got["results"].([]any)
	if len(results) != 2 {
		t.Fatalf("dsec eval -o json = %s, want 2 results", out)
	}
	// Durations vary; their form does not.
	isDuration := func(v any) bool {
		s, ok := v.(string)
		d, err := time.ParseDuration(s)
		return ok && err == nil && d > 0 && strings.HasSuffix(s, "s") && !strings.Contains(s, "ms")
	}
	for _, k := range []string{"elapsed", "p50_latency", "p99_latency"} {
		if !isDuration(sum[k]) {
			t.Errorf("summary.%s = %#v, want a duration string such as \"0.120s\"", k, sum[k])
		}
		delete(sum, k)
	}
	delete(sum, "problems_per_second")
	for _, r := range results {
		r := r.(map[string]any)
		if !isDuration(r["latency"]) {
			t.Errorf("latency of %v = %#v, want a duration string such as \"0.020s\"", r["id"], r["latency"])
		}
		delete(r, "latency")
	}
	want := map[string]any{
		"file": file, "solution": "canonical", "concurrency": 1.0,
		"summary": map[string]any{"total": 2.0, "passed": 1.0, "failures_by_status": map[string]any{"Failed": 1.0}},
		"results": []any{
			map[string]any{"id": "HumanEval/0", "passed": true, "status": "Success"},
			map[string]any{"id": "HumanEval/1", "passed": false, "status": "Failed"},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dsec eval -o json (-want +got):\n%s\n%s", diff, out)
	}
}
