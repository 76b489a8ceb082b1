package uplock

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/dsecproject/dsec/internal/keeper"
)

// Lock is held by the running `dsec up` for its whole life.
type Lock struct {
	f        *os.File
	stateDir string
}

// Acquire takes the state dir's lock, or returns a *RunningError naming
// the `dsec up` that holds it. The lock's file is close-on-exec, so the
// node keeper that up starts (and that outlives it) never holds it.
func Acquire(stateDir string) (*Lock, error) {
	f, err := os.OpenFile(lockPath(stateDir), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			rec, _ := readRecord(stateDir)
			return nil, &RunningError{Record: rec, StateDir: stateDir}
		}
		return nil, fmt.Errorf("lock %s: %w", lockPath(stateDir), err)
	}
	return &Lock{f: f, stateDir: stateDir}, nil
}

// Record writes who holds the lock: this process, serving the API on listen.
func (l *Lock) Record(listen string) error {
	st, err := StartTime(os.Getpid())
	if err != nil {
		return err
	}
	b, err := json.Marshal(Record{Pid: os.Getpid(), StartTime: st, Listen: listen})
	if err != nil {
		return err
	}
	tmp := recordPath(l.stateDir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, recordPath(l.stateDir))
}

// Release removes the record and drops the lock.
func (l *Lock) Release() {
	_ = os.Remove(recordPath(l.stateDir))
	_ = l.f.Close()
}

// Running reports the `dsec up` that holds stateDir's lock, checked to be
// the process the record names (same pid and start time). ok is false when
// none runs.
func Running(stateDir string) (rec Record, ok bool, err error) {
	f, err := os.Open(lockPath(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err == nil {
		return Record{}, false, nil // nobody holds it
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		return Record{}, false, fmt.Errorf("lock %s: %w", lockPath(stateDir), err)
	}
	rec, err = readRecord(stateDir)
	if err != nil || rec.Pid <= 0 {
		return Record{}, true, fmt.Errorf("dsec up holds %s but has not recorded its pid yet (starting up?): try again in a few seconds", lockPath(stateDir))
	}
	if !rec.Alive() {
		return Record{}, true, fmt.Errorf("the lock %s is held, but not by the process %s names (pid %d): see which process holds it with `fuser %s`",
			lockPath(stateDir), recordPath(stateDir), rec.Pid, lockPath(stateDir))
	}
	return rec, true, nil
}

// Alive reports whether the process the record names still runs (a reused
// pid has another start time).
func (r Record) Alive() bool {
	st, err := StartTime(r.Pid)
	return err == nil && st == r.StartTime
}

func readRecord(stateDir string) (Record, error) {
	var rec Record
	b, err := os.ReadFile(recordPath(stateDir))
	if err != nil {
		return rec, err
	}
	err = json.Unmarshal(b, &rec)
	return rec, err
}

// StartTime is pid's start time in clock ticks since boot; a zombie's is
// an error (it runs no more).
func StartTime(pid int) (uint64, error) {
	st, state, err := keeper.ProcStat(pid)
	if err != nil {
		return 0, err
	}
	if state == 'Z' {
		return 0, fmt.Errorf("pid %d is a zombie", pid)
	}
	return st, nil
}
