package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A reader child reads a file (or stats a tree) in a mounted layer, so that
// the fault tests can watch it block, look at its state and kill it
// without risking the parent.

type readerResult struct {
	Bytes  int64   `json:"bytes"`
	SHA256 string  `json:"sha256,omitempty"`
	Err    string  `json:"err,omitempty"`
	Millis float64 `json:"ms"`
}

// readerMain is the -read PATH / -walk DIR child.
func readerMain(mode, p string) error {
	start := time.Now()
	var r readerResult
	var err error
	if mode == "walk" {
		err = filepath.WalkDir(p, func(q string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			var st unix.Stat_t
			r.Bytes++
			return unix.Lstat(q, &st)
		})
	} else {
		var f *os.File
		if f, err = os.Open(p); err == nil {
			h := sha256.New()
			r.Bytes, err = io.CopyBuffer(h, f, make([]byte, 1<<20))
			r.SHA256 = hex.EncodeToString(h.Sum(nil))
			f.Close()
		}
	}
	if err != nil {
		r.Err = err.Error()
	}
	r.Millis = msSince(start)
	return json.NewEncoder(os.Stdout).Encode(r)
}

type readerProc struct {
	cmd   *exec.Cmd
	start time.Time
	done  chan readerResult
}

func (k *keeper) startReader(mode, p string) (*readerProc, error) {
	cmd := exec.Command(k.self, "-"+mode, p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	r := &readerProc{cmd: cmd, start: time.Now(), done: make(chan readerResult, 1)}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		var res readerResult
		if err := json.NewDecoder(out).Decode(&res); err != nil {
			res.Err = "reader died: " + err.Error()
		}
		_ = cmd.Wait()
		res.Millis = msSince(r.start)
		r.done <- res
	}()
	k.clean.push(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL) // our own child, by pid
	})
	return r, nil
}

// wait returns the reader's result, or ok=false after d.
func (r *readerProc) wait(d time.Duration) (readerResult, bool) {
	select {
	case res := <-r.done:
		return res, true
	case <-time.After(d):
		return readerResult{}, false
	}
}

func (r *readerProc) state() string { return taskStates(r.cmd.Process.Pid) }

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

func jsonUnmarshal(s string, v any) error {
	if err := json.Unmarshal([]byte(s), v); err != nil {
		return fmt.Errorf("decode %q: %w", s, err)
	}
	return nil
}
