//go:build linux

package harness

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/testenv"
)

func startRunner(t *testing.T, cfg RunnerConfig) *Runner {
	t.Helper()
	r, err := StartRunner(cfg)
	if err != nil {
		t.Fatalf("StartRunner(%+v) = %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := r.Close(10 * time.Second); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	return r
}

func TestRunnerRun(t *testing.T) {
	r := startRunner(t, RunnerConfig{})
	ctx := context.Background()
	tests := []struct {
		argv    []string
		out     string
		wantErr string
	}{
		{[]string{"true"}, "", ""},
		{[]string{"sh", "-c", "echo out; echo err >&2"}, "out\nerr\n", ""},
		{[]string{"sh", "-c", "echo why; exit 3"}, "why\n", "exit status 3: why"},
		{[]string{"sh", "-c", "kill -9 $$"}, "", "killed by killed"},
		{[]string{"no-such-program-dsec-bench"}, "", "executable file not found"},
		// Stdin is a pipe at its end, not the host's /dev/null, which an
		// OCI runtime would chown to its container's root.
		{[]string{"sh", "-c", "readlink /proc/self/fd/0 | cut -d: -f1; cat"}, "pipe\n", ""},
	}
	for _, tt := range tests {
		res, err := r.Run(ctx, tt.argv...)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("Run(%q) error = %v, want %q", tt.argv, err, tt.wantErr)
		}
		if res.Output != tt.out {
			t.Errorf("Run(%q) output = %q, want %q", tt.argv, res.Output, tt.out)
		}
		if tt.wantErr == "" && (res.Elapsed <= 0 || res.Pid <= 0) {
			t.Errorf("Run(%q) = %+v, want an elapsed time and a pid", tt.argv, res)
		}
	}
}

// An orphan of a command becomes the runner's child and is reaped: no
// zombie is left under the runner.
func TestRunnerReapsOrphans(t *testing.T) {
	r := startRunner(t, RunnerConfig{})
	res, err := r.Run(context.Background(), "sh", "-c", "sleep 0.2 & echo $!")
	if err != nil {
		t.Fatalf("Run() = %v", err)
	}
	orphan := strings.TrimSpace(res.Output)
	deadline := time.Now().Add(5 * time.Second)
	for {
		var zombies, orphans []int
		for _, p := range Procs() {
			if p.PPid == r.Pid() && p.State == "Z" {
				zombies = append(zombies, p.Pid)
			}
			if p.PPid == r.Pid() && orphan == strconv.Itoa(p.Pid) {
				orphans = append(orphans, p.Pid)
			}
		}
		if len(zombies) == 0 && len(orphans) == 0 {
			if _, err := os.Stat("/proc/" + orphan); err == nil {
				t.Fatalf("orphan %s still exists but is not the runner's child", orphan)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("runner children %v (zombies %v) after 5s, want the orphan %s reaped", orphans, zombies, orphan)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunnerCancel(t *testing.T) {
	r := startRunner(t, RunnerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := r.Run(ctx, "sleep", "30")
	if err == nil || time.Since(t0) > 10*time.Second {
		t.Fatalf("Run(sleep 30) with a 100ms context = %v after %v, want an error within 10s", err, time.Since(t0))
	}
	// RunDaemon ends with SIGTERM: a shell that traps it exits 0.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	res, err := r.RunDaemon(ctx2, 10*time.Second, "sh", "-c", "trap 'echo term; exit 0' TERM; while :; do sleep 0.05; done")
	if err != nil || !strings.Contains(res.Output, "term") {
		t.Errorf("RunDaemon() = %+v, %v, want a clean exit on SIGTERM", res, err)
	}
}

func TestRunnerConcurrent(t *testing.T) {
	r := startRunner(t, RunnerConfig{})
	errs := make(chan error, 16)
	t0 := time.Now()
	for range 16 {
		go func() {
			_, err := r.Run(context.Background(), "sleep", "0.3")
			errs <- err
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Errorf("Run(sleep) = %v", err)
		}
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("16 concurrent sleeps of 0.3s took %v, want them to overlap", d)
	}
}

func TestRunnerHidesCgroup2(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := os.Stat(hybridCgroup2 + "/cgroup.procs"); err != nil {
		t.Skip("not a hybrid cgroup host")
	}
	r := startRunner(t, RunnerConfig{HideCgroup2: true})
	res, err := r.Run(context.Background(), "cat", "/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("Run(cat mountinfo) = %v", err)
	}
	if strings.Contains(res.Output, " "+hybridCgroup2+" ") {
		t.Errorf("runner's mount namespace still has %s", hybridCgroup2)
	}
	host, _ := os.ReadFile("/proc/self/mountinfo")
	if !strings.Contains(string(host), " "+hybridCgroup2+" ") {
		t.Errorf("the host lost %s: the runner unmounted it outside its namespace", hybridCgroup2)
	}
}
