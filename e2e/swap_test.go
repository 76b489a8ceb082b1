package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/swap"
)

// swapOn reports whether the host swaps to path.
func swapOn(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/swaps")
	if err != nil {
		t.Fatal(err)
	}
	es, err := swap.ParseSwaps(string(b))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Path == path {
			return true
		}
	}
	return false
}

// TestUpSwap: dsec up --swap FILE:SIZE makes and turns on a swap file,
// and it is off and gone after dsec down; one a killed dsec up left on
// is turned off by the next dsec up that asks for none, and by dsec
// purge.
func TestUpSwap(t *testing.T) {
	dir, err := os.MkdirTemp("", "dsec-e2e-swap-")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "swapfile")
	var p *platform
	t.Cleanup(func() {
		// Whatever happened, no swap is left on.
		if p != nil {
			_, _ = swap.Disable(p.StateDir, nil)
		}
		if swapOn(t, path) {
			t.Errorf("swap file %s still on at the end", path)
			_ = exec.Command("swapoff", path).Run()
		}
		os.RemoveAll(dir)
	})
	p = newPlatform(t, func(p *platform) { p.Extra = append(p.Extra, "--swap", path+":64M") })
	if !swapOn(t, path) {
		t.Fatalf("dsec up --swap %s:64M: not in /proc/swaps", path)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 64<<20 {
		t.Errorf("swap file = %v, %v; want 64 MiB", fi, err)
	}
	out, errOut, code := p.CLI(t, "", "doctor")
	_ = code // other checks may fail on a test host
	if !strings.Contains(out+errOut, "dsec's swap file "+path) {
		t.Errorf("dsec doctor does not report the swap file: %s%s", out, errOut)
	}

	// dsec down: off and removed.
	if out, errOut, code := p.CLI(t, "", "down"); code != 0 {
		t.Fatalf("dsec down = %q, %q, exit %d", out, errOut, code)
	}
	if err := p.Wait(t, 5*time.Second); err != nil {
		t.Errorf("dsec up exited with %v", err)
	}
	if swapOn(t, path) {
		t.Errorf("swap file still on after dsec down")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("swap file after dsec down: %v, want it removed", err)
	}

	// Killed, it leaves the swap file on; the next dsec up without
	// --swap turns it off.
	p.Start(t)
	if !swapOn(t, path) {
		t.Fatalf("dsec up --swap again: not in /proc/swaps")
	}
	p.Kill9(t)
	if !swapOn(t, path) {
		t.Fatalf("the swap file went with a killed dsec up; want it left for the next start")
	}
	p.Extra = nil
	p.Start(t)
	if swapOn(t, path) {
		t.Errorf("a dsec up without --swap left the swap file a killed one made on")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("swap file after the next start: %v, want it removed", err)
	}

	// dsec purge turns off one a killed dsec up left.
	p.Extra = []string{"--swap", path + ":64M"}
	p.CLI(t, "", "down")
	_ = p.Wait(t, 5*time.Second)
	p.Start(t)
	p.Kill9(t)
	if out, errOut, code := p.CLI(t, "", "purge", "--yes", "--keep-images"); code != 0 || !strings.Contains(out, "swap file "+path) {
		t.Errorf("dsec purge = %q, %q, exit %d; want it to turn off the swap file", out, errOut, code)
	}
	if swapOn(t, path) {
		t.Errorf("swap file still on after dsec purge")
	}
}
