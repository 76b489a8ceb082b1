package codeeval

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/fusion"
	"github.com/dsecproject/dsec/internal/testenv"
)

func TestExtractCode(t *testing.T) {
	tests := []struct{ in, want string }{
		{"```python\ndef f():\n    return 1\n```", "def f():\n    return 1"},
		{"Here:\n```\nx = 1\n```\nand more\n```python\ny\n```", "x = 1"},
		{"no fence at all", "no fence at all"},
		{"```py\nunclosed", "unclosed"},
		{"  ```python  \nindented fence\n  ```  ", "indented fence"},
	}
	for _, tt := range tests {
		if got := ExtractCode(tt.in); got != tt.want {
			t.Errorf("ExtractCode(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestLoad(t *testing.T) {
	he := `{"task_id": "HumanEval/0", "prompt": "def f():\n    \"\"\"doc\"\"\"\n", "canonical_solution": "    return 1\n", "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f", "gpt_solution": "` + "```python\\ndef f():\\n    return 1\\n```" + `"}`
	mbpp := `{"id": 11, "content": "x", "canonical_solution": "def g(): return 2", "test_list": ["assert g() == 2", "assert g() != 3"], "labels": {}}`
	mbppStr := `{"id": 12, "canonical_solution": "def h(): return 3", "test_list": "[\"assert h() == 3\"]"}`
	in := he + "\n\n" + mbpp + "\n" + mbppStr + "\n"
	tests := []struct {
		sol  Solution
		want []Problem
	}{
		{Canonical, []Problem{
			{"HumanEval/0", "def f():\n    \"\"\"doc\"\"\"\n    return 1\ndef check(c):\n    assert c() == 1\n\ncheck(f)\n"},
			{"MBPP/11", "def g(): return 2\nassert g() == 2\nassert g() != 3\n"},
			{"MBPP/12", "def h(): return 3\nassert h() == 3\n"},
		}},
		{Empty, []Problem{
			{"HumanEval/0", "def f():\n    \"\"\"doc\"\"\"\ndef check(c):\n    assert c() == 1\n\ncheck(f)\n"},
			{"MBPP/11", "\nassert g() == 2\nassert g() != 3\n"},
			{"MBPP/12", "\nassert h() == 3\n"},
		}},
	}
	for _, tt := range tests {
		got, err := Load(strings.NewReader(in), tt.sol)
		if err != nil {
			t.Fatalf("Load(%s) = %v", tt.sol, err)
		}
		if d := cmp.Diff(tt.want, got); d != "" {
			t.Errorf("Load(%s) (-want +got):\n%s", tt.sol, d)
		}
	}
	got, err := Load(strings.NewReader(he), GPT)
	if err != nil || len(got) != 1 || !strings.Contains(got[0].Program, "\"\"\"doc\"\"\"\n\ndef f():\n    return 1\ndef check") {
		t.Errorf("Load(gpt) = %q, %v", got, err)
	}
	for name, bad := range map[string]string{
		"gpt of MBPP":   mbpp,
		"not JSON":      "{",
		"neither":       `{"foo": 1}`,
		"empty":         "\n\n",
		"bad test_list": `{"id": 1, "test_list": 5}`,
	} {
		if got, err := Load(strings.NewReader(bad), GPT); err == nil {
			t.Errorf("Load(%s) = %v, want an error", name, got)
		}
	}
}

// TestAcceptanceData checks the shared data composes: 164 HumanEval and 20
// MBPP problems, each program naming its entry point.
func TestAcceptanceData(t *testing.T) {
	dir := filepath.Join(testenv.AcceptanceDir(t), "humaneval")
	for _, c := range []struct {
		file string
		sol  Solution
		n    int
	}{{"humaneval_python.jsonl", Canonical, 164}, {"humaneval_python.jsonl", GPT, 164}, {"mbpp_python.jsonl", Canonical, 20}} {
		f, err := os.Open(filepath.Join(dir, c.file))
		if err != nil {
			t.Fatal(err)
		}
		ps, err := Load(f, c.sol)
		f.Close()
		if err != nil || len(ps) != c.n {
			t.Fatalf("Load(%s, %s) = %d problems, %v; want %d", c.file, c.sol, len(ps), err, c.n)
		}
		for _, p := range ps {
			if strings.Contains(p.Program, "```") {
				t.Errorf("%s: the program still has a markdown fence", p.ID)
			}
		}
	}
}

func TestRunner(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := fusion.ParseRequest(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		resp := fusion.RunCodeResponse{Status: fusion.StatusSuccess, Files: map[string]string{}}
		rc, stderr := 0, ""
		run := &fusion.CommandRunResult{Status: fusion.CommandFinished, ReturnCode: &rc, Stderr: &stderr}
		switch req.Code {
		case "fail":
			rc, stderr = 1, "Traceback\nAssertionError"
			resp.Status = fusion.StatusFailed
		case "slow":
			run = &fusion.CommandRunResult{Status: fusion.CommandTimeLimitExceeded}
			resp.Status = fusion.StatusFailed
		case "broken":
			resp.Status, resp.Message, run = fusion.StatusSandboxError, "no sandbox", nil
		case "500":
			http.Error(w, "oops", 500)
			return
		}
		resp.RunResult = run
		_ = json.NewEncoder(w).Encode(resp)
	}))
	defer srv.Close()
	problems := []Problem{{"a", "ok"}, {"b", "fail"}, {"c", "slow"}, {"d", "broken"}, {"e", "500"}, {"f", "ok"}}
	var calls int
	r := &Runner{URL: srv.URL + "/run_code", Concurrency: 3, Progress: func(int) { calls++ }}
	res, sum := r.Run(context.Background(), problems)
	if got := PassVector(res); got != "100001" {
		t.Errorf("PassVector = %s, want 100001", got)
	}
	wantStatus := map[string]int{"Failed": 1, "TimeLimitExceeded": 1, "SandboxError": 1, "HTTPError": 1}
	if sum.Total != 6 || sum.Passed != 2 || !cmp.Equal(sum.ByStatus, wantStatus) {
		t.Errorf("Summary = %+v, want 6 total, 2 passed, %v", sum, wantStatus)
	}
	if res[1].Message != "AssertionError" || res[3].Message != "no sandbox" {
		t.Errorf("messages = %q, %q", res[1].Message, res[3].Message)
	}
	if calls != 6 || sum.PerSecond <= 0 || sum.P50 <= 0 {
		t.Errorf("progress calls %d, summary %+v", calls, sum)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(101-i))
	}
	if p := Percentile(ds, 50); p != 50 {
		t.Errorf("p50 = %d", p)
	}
	if p := Percentile(ds, 99); p != 99 {
		t.Errorf("p99 = %d", p)
	}
	if p := Percentile(ds[:1], 99); p != 100 {
		t.Errorf("p99 of one = %d", p)
	}
	if p := Percentile(nil, 50); p != 0 {
		t.Errorf("p50 of none = %d", p)
	}
}
