//go:build linux && !dsec_client

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/uplock"
)

// startedHere counts only the dsec up recorded in the state dir, never
// another process that answers the address.
func TestStartedHere(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	if startedHere(dir, os.Getpid()) {
		t.Error("startedHere with nothing recorded = true")
	}
	l, err := uplock.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if err := l.Record("127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	if !startedHere(dir, os.Getpid()) {
		t.Error("startedHere of the recorded pid = false")
	}
	if startedHere(dir, os.Getpid()+1) {
		t.Error("startedHere of another pid = true")
	}
}

// down --all without --yes and without a terminal refuses (exit 2) before
// it looks for anything to stop.
func TestDownAllNeedsYes(t *testing.T) {
	root := newRootCmd()
	root.SetArgs([]string{"down", "--all", "--state-dir", t.TempDir()})
	r, w, _ := os.Pipe()
	defer r.Close()
	w.Close()
	old := os.Stdin
	os.Stdin = r
	defer func() { os.Stdin = old }()
	err := root.Execute()
	if err == nil || exitCodeOf(err) != 2 {
		t.Fatalf("down --all without --yes = %v; want a usage error", err)
	}
}

// A dsec up that ignores SIGTERM makes down fail within its timeout with
// an error naming the pid.
func TestStopUpTimeout(t *testing.T) {
	c := exec.Command("sh", "-c", `trap "" TERM; while :; do sleep 0.1; done`)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Process.Kill(); _ = c.Wait() }()
	time.Sleep(100 * time.Millisecond) // the trap is set
	st, err := uplock.StartTime(c.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	rec := uplock.Record{Pid: c.Process.Pid, StartTime: st}
	start := time.Now()
	err = stopUp(rec, 300*time.Millisecond, "/var/lib/dsec")
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", c.Process.Pid)) || !strings.Contains(err.Error(), "did not exit within") {
		t.Fatalf("stopUp of a process that ignores SIGTERM = %v; want an error naming its pid", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("stopUp took %v with a 300ms timeout", d)
	}
}
