//go:build linux

package main

import (
	"os"
	"path/filepath"
	"testing"

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
