//go:build linux

package harness

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/dsecproject/dsec/internal/testenv"
)

func TestRemoveCgroupTree(t *testing.T) {
	testenv.RequireRoot(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "dsec-bench-test-" + hex.EncodeToString(b)
	t.Cleanup(func() { _ = RemoveCgroupTree(name) })
	hs := hierarchies()
	if len(hs) == 0 {
		t.Skip("no cgroup hierarchies")
	}
	var made int
	for _, h := range hs {
		if err := os.MkdirAll(filepath.Join(h, name, "a", "b"), 0o755); err == nil {
			made += 2
		}
	}
	if made == 0 {
		t.Skip("cannot make cgroups here")
	}
	if got := CountCgroups(name); got != made {
		t.Errorf("CountCgroups(%s) = %d, want %d", name, got, made)
	}
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- sleep.Wait() }()
	procs := filepath.Join(hs[0], name, "a", "b", "cgroup.procs")
	if err := os.WriteFile(procs, []byte(strconv.Itoa(sleep.Process.Pid)), 0o644); err != nil {
		_ = sleep.Process.Kill()
		<-waited
		t.Fatalf("move sleep into %s: %v", procs, err)
	}
	if got := CgroupProcs(name); len(got) != 1 || got[0] != sleep.Process.Pid {
		t.Errorf("CgroupProcs(%s) = %v, want [%d]", name, got, sleep.Process.Pid)
	}
	if err := RemoveCgroupTree(name); err != nil {
		t.Fatalf("RemoveCgroupTree(%s) = %v", name, err)
	}
	if err := <-waited; err == nil {
		t.Errorf("sleep in the cgroup exited cleanly, want it killed")
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h, name)); !os.IsNotExist(err) {
			t.Errorf("%s still exists (%v)", filepath.Join(h, name), err)
		}
	}
	if err := RemoveCgroupTree(name); err != nil {
		t.Errorf("RemoveCgroupTree(%s) again = %v, want nil", name, err)
	}
	if err := RemoveCgroupTree("../x"); err == nil {
		t.Errorf("RemoveCgroupTree(../x) = nil, want an error")
	}
}
