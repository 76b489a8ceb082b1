package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/codeeval"
	"github.com/dsecproject/dsec/internal/fusion"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/testenv"
)

// TestFusion runs the SandboxFusion API of a real dsec up, with its three
// language images built from Debian packages by `dsec image build
// --debian` (scripts/sandboxfusion-images.sh), through SandboxFusion's
// behaviours and the HumanEval and MBPP acceptance sets.
func TestFusion(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mmdebstrap")
	testenv.Require(t, err == nil, "mmdebstrap not installed (apt-get install mmdebstrap)")
	p := newPlatform(t, func(p *platform) { p.FusionAddr = freePort(t) })
	start := time.Now()
	cmd := exec.Command(filepath.Join(testenv.ModuleRoot(), "scripts", "sandboxfusion-images.sh"))
	cmd.Env = append(os.Environ(), "DSEC="+p.Bin, "DSEC_ADDR=http://"+p.Addr, "DSEC_STATE_DIR="+p.StateDir, "DSEC_API_KEY=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build the SandboxFusion images: %v\n%s", err, out)
	}
	t.Logf("images built in %.0fs:\n%s", time.Since(start).Seconds(), out)
	f := &fusionClient{url: "http://" + p.FusionAddr}

	t.Run("Behaviours", func(t *testing.T) { testFusionBehaviours(t, p, f) })
	t.Run("Isolation", func(t *testing.T) { testFusionIsolation(t, p, f) })
	t.Run("Acceptance", func(t *testing.T) { testFusionAcceptance(t, p, f) })
	t.Run("StartUp", func(t *testing.T) { testFusionStartUp(t, p) })
	t.Run("Burst", func(t *testing.T) { testFusionBurst(t, p, f) })
	// Nothing above needs more than a few GiB of the node's limits at once:
	// no call and no pool refill may have been turned away for room (the
	// wait was 5 s a time, and HumanEval's p99 showed it).
	if log := p.Log(); strings.Contains(log, "room") || strings.Contains(log, "short of memory") {
		var lines []string
		for line := range strings.Lines(log) {
			if strings.Contains(line, "room") || strings.Contains(line, "short of memory") {
				lines = append(lines, strings.TrimSpace(line))
			}
		}
		t.Errorf("the node refused sandboxes for room during the calls:\n%s\nnode now: %s", strings.Join(lines, "\n"), nodeLoad(t, p))
	}
}

// nodeLoad is what /metrics says of the node's memory and sandboxes.
func nodeLoad(t *testing.T, p *platform) string {
	var out []string
	for k, v := range scrapeAll(t, p) {
		if strings.HasPrefix(k, "dsec_node_memory") || strings.HasPrefix(k, "dsec_sandboxes{") && v != 0 {
			out = append(out, fmt.Sprintf("%s %g", k, v))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// testFusionBurst runs calls at concurrency 4, as an RL reward loop does:
// none waits for room (placement once counted the pool's creates twice,
// and 5-20% of such calls took 5 s on a faster machine), and /metrics
// shows the calls, their queue wait and the pools (issue 13). On a 2-core
// machine the calls run at about 4/s, too slow to fill the node's 4×
// overcommitted memory even counted twice: the placement itself is checked
// at 15/s by internal/apiserver's TestBurstOnANodeWithRoom.
func testFusionBurst(t *testing.T, p *platform, f *fusionClient) {
	before := scrapeAll(t, p)
	const calls, conc = 32, 4
	var mu sync.Mutex
	var slow []time.Duration // guarded by mu
	var wg sync.WaitGroup
	sem := make(chan struct{}, conc)
	for range calls {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			start := time.Now()
			r := f.run(t, map[string]any{"code": "echo hi", "language": "bash"})
			d := time.Since(start)
			if r.Status != fusion.StatusSuccess {
				t.Errorf("bash call = %s %q", r.Status, r.Message)
			}
			// A wait for room takes 5 s (the API's retry hint).
			if d > 4500*time.Millisecond {
				mu.Lock()
				slow = append(slow, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(slow) > 0 {
		t.Errorf("%d of %d calls at concurrency %d took more than 4.5 s (%v): they waited for room; node: %s", len(slow), calls, conc, slow, nodeLoad(t, p))
	}
	after := scrapeAll(t, p)
	key := `dsec_sandboxfusion_calls_total{language="bash",status="Success"}`
	if got := after[key] - before[key]; got != calls {
		t.Errorf("%s rose by %g, want %d", key, got, calls)
	}
	if got := after[`dsec_sandboxfusion_queue_wait_seconds_count{language="bash"}`] - before[`dsec_sandboxfusion_queue_wait_seconds_count{language="bash"}`]; got != calls {
		t.Errorf("queue wait observations of bash rose by %g, want %d", got, calls)
	}
	if got := after[`dsec_sandboxfusion_pool_size{image="`+fusion.DefaultBashImage+`",memory_mib="1024"}`]; got != 4 {
		t.Errorf("dsec_sandboxfusion_pool_size of the bash pool = %g, want 4", got)
	}
}

// scrapeAll reads dsec up's /metrics into series (the name, with its
// labels as printed) → value.
func scrapeAll(t *testing.T, p *platform) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		series, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || strings.HasPrefix(series, "#") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[series] = f
		}
	}
	return out
}

type fusionClient struct{ url string }

// run posts a run_code request and decodes the answer.
func (f *fusionClient) run(t *testing.T, req map[string]any) *fusion.RunCodeResponse {
	t.Helper()
	code, body := f.post(t, "/run_code", req)
	if code != http.StatusOK {
		t.Fatalf("POST /run_code %v = HTTP %d %s", req, code, body)
	}
	var resp fusion.RunCodeResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatalf("run_code answer %s: %v", body, err)
	}
	return &resp
}

func (f *fusionClient) post(t *testing.T, path string, req any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(req)
	resp, err := http.Post(f.url+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func testFusionBehaviours(t *testing.T, p *platform, f *fusionClient) {
	_, apiPort, _ := net.SplitHostPort(p.Addr)
	type check func(t *testing.T, r *fusion.RunCodeResponse)
	stdoutIs := func(want string) check {
		return func(t *testing.T, r *fusion.RunCodeResponse) {
			if r.RunResult == nil || str(r.RunResult.Stdout) != want {
				t.Errorf("stdout = %q, want %q (response %+v)", str(r.RunResult.Stdout), want, r)
			}
		}
	}
	stderrHas := func(want string) check {
		return func(t *testing.T, r *fusion.RunCodeResponse) {
			if r.RunResult == nil || !strings.Contains(str(r.RunResult.Stderr), want) {
				t.Errorf("stderr = %q, want it to contain %q", str(r.RunResult.Stderr), want)
			}
		}
	}
	returnCode := func(want int) check {
		return func(t *testing.T, r *fusion.RunCodeResponse) {
			if r.RunResult == nil || r.RunResult.ReturnCode == nil || *r.RunResult.ReturnCode != want {
				t.Errorf("run_result = %+v, want return_code %d", r.RunResult, want)
			}
		}
	}
	messageHas := func(want string) check {
		return func(t *testing.T, r *fusion.RunCodeResponse) {
			if !strings.Contains(r.Message, want) {
				t.Errorf("message = %q, want it to contain %q", r.Message, want)
			}
		}
	}
	tests := []struct {
		name   string
		req    map[string]any
		status fusion.RunStatus
		run    fusion.CommandStatus // "" when there is no run_result
		checks []check
	}{
		{
			name: "python print", req: map[string]any{"language": "python", "code": "print('hello')\nimport sys; print('err', file=sys.stderr)"},
			status: fusion.StatusSuccess, run: fusion.CommandFinished,
			checks: []check{stdoutIs("hello\n"), stderrHas("err\n"), returnCode(0), func(t *testing.T, r *fusion.RunCodeResponse) {
				if r.CompileResult != nil || r.RunResult.ExecutionTime == nil || *r.RunResult.ExecutionTime <= 0 {
					t.Errorf("compile_result = %+v, execution_time = %v; want no compile and a positive time", r.CompileResult, r.RunResult.ExecutionTime)
				}
			}},
		},
		{
			name: "bash tools", req: map[string]any{"language": "bash", "code": "echo '2^10' | bc\necho 'a b c' | gawk '{print $2}' | sed s/b/B/ | grep B\nseq 3 | tr '\\n' ,"},
			status: fusion.StatusSuccess, run: fusion.CommandFinished, checks: []check{stdoutIs("1024\nB\n1,2,3,")},
		},
		{
			name: "bash exit code", req: map[string]any{"language": "bash", "code": "echo out; exit 3"},
			status: fusion.StatusFailed, run: fusion.CommandFinished, checks: []check{stdoutIs("out\n"), returnCode(3)},
		},
		{
			name: "go compile and run with stdin", req: map[string]any{"language": "go", "stdin": "21\n",
				"code": "package main\nimport (\"fmt\"; \"strings\")\nfunc main() { var n int; fmt.Scan(&n); fmt.Println(strings.Repeat(\"x\", 2), n*2) }"},
			status: fusion.StatusSuccess, run: fusion.CommandFinished,
			checks: []check{stdoutIs("xx 42\n"), func(t *testing.T, r *fusion.RunCodeResponse) {
				c := r.CompileResult
				if c == nil || c.Status != fusion.CommandFinished || c.ReturnCode == nil || *c.ReturnCode != 0 {
					t.Errorf("compile_result = %+v, want Finished with 0", c)
				}
			}},
		},
		{
			name: "go compile error", req: map[string]any{"language": "go", "code": "package main\nfunc main() { undefined() }"},
			status: fusion.StatusFailed, run: "",
			checks: []check{func(t *testing.T, r *fusion.RunCodeResponse) {
				c := r.CompileResult
				if c == nil || c.ReturnCode == nil || *c.ReturnCode == 0 || !strings.Contains(str(c.Stderr), "undefined") {
					t.Errorf("compile_result = %+v (stderr %q), want a failure naming undefined", c, str(c.Stderr))
				}
			}},
		},
		{
			name: "timeout", req: map[string]any{"language": "python", "code": "import time\nprint('start', flush=True)\nwhile True: time.sleep(0.01)", "run_timeout": 1},
			status: fusion.StatusFailed, run: fusion.CommandTimeLimitExceeded,
			checks: []check{stdoutIs("start\n"), func(t *testing.T, r *fusion.RunCodeResponse) {
				if r.RunResult.ReturnCode != nil || r.RunResult.ExecutionTime == nil || *r.RunResult.ExecutionTime < 0.9 || *r.RunResult.ExecutionTime > 3 {
					t.Errorf("run_result = %+v (time %v), want no return code and about 1 s", r.RunResult, *r.RunResult.ExecutionTime)
				}
			}},
		},
		{
			name: "assertion error", req: map[string]any{"language": "python", "code": "assert 1 + 1 == 3, 'math is broken'"},
			status: fusion.StatusFailed, run: fusion.CommandFinished, checks: []check{returnCode(1), stderrHas("AssertionError: math is broken")},
		},
		{
			name: "syntax error", req: map[string]any{"language": "python", "code": "def f(:\n    pass"},
			status: fusion.StatusFailed, run: fusion.CommandFinished, checks: []check{returnCode(1), stderrHas("SyntaxError")},
		},
		{
			name: "stdin", req: map[string]any{"language": "python", "code": "import sys\nprint(sys.stdin.read()[::-1])", "stdin": "abc"},
			status: fusion.StatusSuccess, run: fusion.CommandFinished, checks: []check{stdoutIs("cba\n")},
		},
		{
			name: "files in", req: map[string]any{"language": "python", "code": "print(open('data/in.txt').read() + open('b.bin','rb').read().hex())",
				"files": map[string]any{"data/in.txt": b64("forty-two "), "b.bin": b64("\x00\xff"), "skipped.txt": nil}},
			status: fusion.StatusSuccess, run: fusion.CommandFinished, checks: []check{stdoutIs("forty-two 00ff\n")},
		},
		{
			name: "fetch files out", req: map[string]any{"language": "bash", "code": "mkdir -p out && printf 'result' > out/r.txt && echo hi > x.txt",
				"fetch_files": []string{"out/r.txt", "x.txt", "missing.txt"}},
			status: fusion.StatusSuccess, run: fusion.CommandFinished,
			checks: []check{func(t *testing.T, r *fusion.RunCodeResponse) {
				want := map[string]string{"out/r.txt": b64("result"), "x.txt": b64("hi\n")}
				if fmt.Sprint(r.Files) != fmt.Sprint(want) {
					t.Errorf("files = %v, want %v (a missing file is left out)", r.Files, want)
				}
			}},
		},
		{
			name: "no network", req: map[string]any{"language": "python", "code": "" +
				"import socket\n" +
				"ifs = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]\n" +
				"routes = open('/proc/net/route').read().splitlines()[1:]\n" +
				"print('interfaces', ifs, 'routes', len(routes))\n" +
				// The host's API port, on the sandbox's own loopback.
				"try:\n    socket.create_connection(('127.0.0.1', " + apiPort + "), timeout=2)\n    print('reached the host')\n" +
				"except OSError as e:\n    print('refused:', e.errno)\n"},
			status: fusion.StatusSuccess, run: fusion.CommandFinished,
			checks: []check{stdoutIs("interfaces ['lo'] routes 0\nrefused: 111\n")},
		},
		{
			name: "unknown language", req: map[string]any{"language": "cobol", "code": "DISPLAY 'HI'."},
			status: fusion.StatusSandboxError, checks: []check{messageHas(`unknown language "cobol"`), messageHas("python")},
		},
		{
			name: "huge output", req: map[string]any{"language": "python", "code": "import sys\nsys.stdout.write('y' * (5 << 20))\nprint('done', file=sys.stderr)"},
			status: fusion.StatusSuccess, run: fusion.CommandFinished,
			checks: []check{stderrHas("done"), func(t *testing.T, r *fusion.RunCodeResponse) {
				if n := len(str(r.RunResult.Stdout)); n != 1<<20 || !r.RunResult.StdoutTruncated || r.RunResult.StderrTruncated {
					t.Errorf("stdout of 5 MiB: got %d bytes, truncated %v/%v; want 1 MiB and flagged", n, r.RunResult.StdoutTruncated, r.RunResult.StderrTruncated)
				}
			}},
		},
		{
			name: "file path outside", req: map[string]any{"language": "python", "code": "print(1)", "files": map[string]any{"../../etc/cron.d/x": b64("x")}},
			status: fusion.StatusSandboxError, checks: []check{messageHas("outside the working directory")},
		},
		{
			name: "absolute file path", req: map[string]any{"language": "python", "code": "print(1)", "files": map[string]any{"/usr/bin/python3": b64("x")}},
			status: fusion.StatusSandboxError, checks: []check{messageHas("absolute")},
		},
		{
			name: "fetch path outside", req: map[string]any{"language": "python", "code": "print(1)", "fetch_files": []string{"../../etc/shadow"}},
			status: fusion.StatusSandboxError, checks: []check{messageHas("outside the working directory")},
		},
		{
			name: "memory limit", req: map[string]any{"language": "python", "memory_limit_MB": 64, "code": "x = bytearray(256 << 20)\nprint('allocated')"},
			status: fusion.StatusFailed, run: fusion.CommandFinished,
			checks: []check{func(t *testing.T, r *fusion.RunCodeResponse) {
				if strings.Contains(str(r.RunResult.Stdout), "allocated") {
					t.Errorf("256 MiB allocated under a 64 MiB limit: %+v", r.RunResult)
				}
			}},
		},
	}
	for _, tt := range tests {
		t.Run(strings.ReplaceAll(tt.name, " ", "_"), func(t *testing.T) {
			r := f.run(t, tt.req)
			if r.Status != tt.status {
				t.Errorf("status = %s (message %q), want %s; run_result %+v", r.Status, r.Message, tt.status, r.RunResult)
			}
			switch {
			case tt.run == "" && r.RunResult != nil:
				t.Errorf("run_result = %+v, want none", r.RunResult)
			case tt.run != "" && (r.RunResult == nil || r.RunResult.Status != tt.run):
				t.Fatalf("run_result = %+v, want status %s", r.RunResult, tt.run)
			}
			for _, c := range tt.checks {
				c(t, r)
			}
		})
	}
	t.Run("malformed", func(t *testing.T) {
		if code, body := f.post(t, "/run_code", map[string]any{"language": "python"}); code != http.StatusUnprocessableEntity || !strings.Contains(string(body), "code") {
			t.Errorf("run_code without code = %d %s, want 422 naming the field", code, body)
		}
	})
}

// testFusionIsolation checks that calls see nothing of each other and that
// their sandboxes are deleted.
func testFusionIsolation(t *testing.T, p *platform, f *fusionClient) {
	ctx := ctxT(t)
	admin := p.Client(t, p.AdminKey(t))
	marker := "leak-" + randHex(4)
	r := f.run(t, map[string]any{"language": "bash", "code": "echo " + marker + " > /tmp/leak; echo " + marker + " > leak.txt; (sleep 600 &); hostname"})
	first := str(r.RunResult.Stdout)
	for range 3 {
		r = f.run(t, map[string]any{"language": "bash", "code": "cat /tmp/leak leak.txt 2>/dev/null; cat /proc/[0-9]*/comm | grep -c '^sleep$'; hostname"})
		if out := str(r.RunResult.Stdout); strings.Contains(out, marker) || out == first || !strings.HasPrefix(out, "0\n") {
			t.Errorf("a later call sees %q (first call's host %q): want no files, no processes, another sandbox", out, first)
		}
	}
	// The used sandboxes go; what stays is the pools' (at most 4 per
	// language image and per memory limit used: 3 + 1 here), and no key,
	// not even the admin's, sees them (the reserved project
	// dsec-sandboxfusion); the node's keeper does.
	if sbs, err := admin.List(ctx, map[string]string{fusion.LabelKey: "e2e"}); err != nil || len(sbs) != 0 {
		t.Errorf("the admin key lists %d SandboxFusion sandboxes (%v), want none: they are in a reserved project", len(sbs), err)
	}
	kc := keeper.NewClient(p.StateDir)
	defer kc.Close()
	var ids []string
	for range 100 {
		infos, err := kc.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids = ids[:0]
		for _, in := range infos {
			ids = append(ids, in.ID)
		}
		if len(ids) <= 4*4 && !slices.Contains(ids, strings.TrimSpace(first)) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("sandboxes on the node after the calls: %v; want at most the pools' 16, without the first call's %s", ids, strings.TrimSpace(first))
}

func testFusionAcceptance(t *testing.T, p *platform, f *fusionClient) {
	dir := filepath.Join(testenv.AcceptanceDir(t), "humaneval")
	load := func(t *testing.T, file string, sol codeeval.Solution) []codeeval.Problem {
		fh, err := os.Open(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		ps, err := codeeval.Load(fh, sol)
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	runner := &codeeval.Runner{URL: f.url + "/run_code", Concurrency: 4}
	run := func(t *testing.T, ps []codeeval.Problem) ([]codeeval.Result, codeeval.Summary) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		res, sum := runner.Run(ctx, ps)
		t.Logf("%d problems: %d passed, failed %v, %.2f/s, p50 %v p99 %v", sum.Total, sum.Passed, sum.ByStatus, sum.PerSecond, sum.P50, sum.P99)
		return res, sum
	}
	for _, c := range []struct{ name, file string }{{"HumanEval", "humaneval_python.jsonl"}, {"MBPP", "mbpp_python.jsonl"}} {
		t.Run(c.name+"Canonical", func(t *testing.T) {
			ps := load(t, c.file, codeeval.Canonical)
			res, sum := run(t, ps)
			if sum.Passed != len(ps) {
				for _, r := range res {
					if !r.Passed {
						t.Errorf("%s: %s %s", r.ID, r.Status, r.Message)
					}
				}
				t.Fatalf("%d/%d canonical solutions passed, want all", sum.Passed, len(ps))
			}
		})
		t.Run(c.name+"Empty", func(t *testing.T) {
			ps := load(t, c.file, codeeval.Empty)
			res, sum := run(t, ps)
			for _, r := range res {
				if r.Passed || r.Status != string(fusion.StatusFailed) {
					t.Errorf("%s with an empty body: %s, want Failed", r.ID, r.Status)
				}
			}
			if sum.Passed != 0 {
				t.Errorf("%d problems passed with empty bodies, want none", sum.Passed)
			}
		})
	}
	t.Run("HumanEvalGPTStable", func(t *testing.T) {
		ps := load(t, "humaneval_python.jsonl", codeeval.GPT)
		var vectors []string
		for i := range 3 {
			res, sum := run(t, ps)
			if n := sum.ByStatus["SandboxError"] + sum.ByStatus["HTTPError"]; n > 0 {
				t.Errorf("run %d: %d problems did not run: %v", i+1, n, sum.ByStatus)
			}
			vectors = append(vectors, passLines(ps, res))
		}
		if vectors[0] != vectors[1] || vectors[1] != vectors[2] {
			t.Errorf("the gpt_solution pass vector changed between runs:\n%s", lineDiff(vectors[0], vectors[1]+lineDiff(vectors[1], vectors[2])))
		}
		golden := filepath.Join("testdata", "humaneval_gpt_pass.txt")
		if os.Getenv("DSEC_UPDATE_GOLDEN") == "1" {
			if err := os.WriteFile(golden, []byte(vectors[0]), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (DSEC_UPDATE_GOLDEN=1 writes it)", err)
		}
		if string(want) != vectors[0] {
			t.Errorf("the gpt_solution pass vector differs from %s (-want +got):\n%s", golden, lineDiff(string(want), vectors[0]))
		}
	})
	t.Run("CLI", func(t *testing.T) {
		out, errOut, code := p.CLI(t, "", "eval", filepath.Join(dir, "mbpp_python.jsonl"), "--url", f.url, "--concurrency", "2", "--limit", "5")
		if code != 0 || !strings.Contains(out, "5/5 passed") || !strings.Contains(out, "problems/s at concurrency 2") {
			t.Errorf("dsec eval = %q, %q, exit %d", out, errOut, code)
		}
		out, _, code = p.CLI(t, "", "eval", filepath.Join(dir, "mbpp_python.jsonl"), "--url", f.url+"/run_code", "--solution", "empty", "--limit", "3", "-o", "json")
		var rep struct {
			Summary codeeval.Summary
			Results []codeeval.Result
		}
		if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil || rep.Summary.Passed != 0 || rep.Summary.ByStatus["Failed"] != 3 || len(rep.Results) != 3 {
			t.Errorf("dsec eval --solution empty -o json = %q (%v), exit %d", out, err, code)
		}
	})
}

// passLines is one line per problem: its ID and pass or fail.
func passLines(ps []codeeval.Problem, res []codeeval.Result) string {
	var b strings.Builder
	for i, r := range res {
		v := "fail"
		if r.Passed {
			v = "pass"
		}
		fmt.Fprintf(&b, "%s %s\n", ps[i].ID, v)
	}
	return b.String()
}

func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out strings.Builder
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			fmt.Fprintf(&out, "-%s\n+%s\n", x, y)
		}
	}
	return out.String()
}

// testFusionStartUp checks the listener's start-up failures name the
// flag: a busy port, a key file that does not exist, and the admin key as
// the clients' key beyond loopback (where clients may send it in URLs).
func testFusionStartUp(t *testing.T, p *platform) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, c := range []struct {
		listen, want string
		keyFile      string // "admin": the new state dir's admin key
	}{
		{busy.Addr().String(), "--sandboxfusion-listen", ""},
		{"127.0.0.1:0", "--sandboxfusion-key-file", "/nonexistent/key"},
		{"0.0.0.0:0", "--sandboxfusion-key-file", "admin"},
	} {
		dir := t.TempDir()
		args := []string{"up", "--state-dir", dir, "--listen", freePort(t), "--cgroup-parent", p.CgroupParent + "x", "--sandboxfusion-listen", c.listen}
		switch c.keyFile {
		case "":
		case "admin":
			key := filepath.Join(dir, "admin.key")
			if err := os.WriteFile(key, []byte("dsk_"+strings.Repeat("a", 40)+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			args = append(args, "--sandboxfusion-key-file", key)
		default:
			args = append(args, "--sandboxfusion-key-file", c.keyFile)
		}
		cmd := exec.Command(p.Bin, args...)
		done := make(chan struct{})
		var out []byte
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("dsec up --sandboxfusion-listen %s did not fail at start-up", c.listen)
		}
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("dsec up --sandboxfusion-listen %s = %v, %q; want a failure naming %s", c.listen, err, out, c.want)
		}
	}
}
