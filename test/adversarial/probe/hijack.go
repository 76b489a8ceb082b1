package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// hijackCmd is an agent's leftover that forges a grader's result: it
// watches /proc for new processes whose command line holds args[0] and,
// for each, attaches with ptrace and turns its next system call into
// exit_group(0), so that the command "passes" whatever it would have
// done. It prints "hijack:PID ok" (or the errno) per attempt, for
// args[1] seconds (default 30).
func hijackCmd(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("usage: probe hijack MARKER [SECONDS]")
	}
	marker := []byte(args[0])
	secs := 30
	if len(args) > 1 {
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		secs = n
	}
	self := os.Getpid()
	done := map[int]bool{}
	for end := time.Now().Add(time.Duration(secs) * time.Second); time.Now().Before(end); {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self || done[pid] {
				continue
			}
			cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err != nil || !bytes.Contains(cmd, marker) {
				continue
			}
			done[pid] = true
			report("hijack:"+e.Name(), forceExit0(pid))
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}
