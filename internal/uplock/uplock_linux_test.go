package uplock

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func stateDir(t *testing.T) string {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestAcquireOnce(t *testing.T) {
	dir := stateDir(t)
	if _, ok, err := Running(dir); ok || err != nil {
		t.Fatalf("Running on a fresh dir = %v, %v; want not running", ok, err)
	}
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Held but not yet recorded: said, not guessed.
	if _, ok, err := Running(dir); !ok || err == nil {
		t.Errorf("Running before Record = %v, %v; want running with an error", ok, err)
	}
	if err := l.Record("127.0.0.1:7420"); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := Running(dir)
	if !ok || err != nil || rec.Pid != os.Getpid() || rec.Listen != "127.0.0.1:7420" {
		t.Fatalf("Running = %+v, %v, %v", rec, ok, err)
	}
	_, err = Acquire(dir)
	var re *RunningError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "already running (pid ") || !strings.Contains(err.Error(), "API at 127.0.0.1:7420") {
		t.Fatalf("second Acquire = %v; want a RunningError naming the pid and API", err)
	}
	l.Release()
	if _, ok, err := Running(dir); ok || err != nil {
		t.Errorf("Running after Release = %v, %v; want not running", ok, err)
	}
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	l2.Release()
}

// A record naming another process (a reused pid: same pid, other start
// time) is never taken for the holder.
func TestRunningReusedPid(t *testing.T) {
	dir := stateDir(t)
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if err := l.Record("127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(recordPath(dir))
	st, _ := StartTime(os.Getpid())
	forged := strings.Replace(string(b), `"start_time":`+strconv.FormatUint(st, 10), `"start_time":1`, 1)
	if forged == string(b) {
		t.Fatalf("could not forge %s", b)
	}
	if err := os.WriteFile(recordPath(dir), []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := Running(dir); !ok || err == nil {
		t.Errorf("Running with a reused pid = %v, %v; want an error", ok, err)
	}
}

func TestStartTime(t *testing.T) {
	// Our own pid parses; a pid that does not exist is an error.
	if _, err := StartTime(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if _, err := StartTime(1 << 30); err == nil {
		t.Error("StartTime of a pid that does not exist succeeded")
	}
}
