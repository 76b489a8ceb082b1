package swaptest

import (
	"os/exec"
)

// swapoff turns path off with util-linux's swapoff: the last resort of a
// cleanup, not the code under test.
func swapoff(path string) error { return exec.Command("swapoff", path).Run() }
