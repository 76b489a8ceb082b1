package e2e

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestRunCountPartialFailure fills a node made small (memory overcommit so
// low that three 256 MiB sandboxes fit) with `dsec run -d --count 5`: the
// batch partly fails, dsec says how many and why, and leaves nothing
// behind; with --keep-partial it leaves exactly the ones it printed.
func TestRunCountPartialFailure(t *testing.T) {
	const fit = 3 // sandboxes of 256 MiB that fit in a capacity of 3.9 of them (the node may count 77% to 100% of MemTotal)
	overcommit := float64(fit*256+230) * (1 << 20) / float64(memTotal(t))
	p := newPlatform(t, func(p *platform) {
		p.FusionAddr = ""
		p.Extra = append(p.Extra, "--warm-pool", "0", "--memory-overcommit", strconv.FormatFloat(overcommit, 'g', -1, 64))
	})
	p.Busybox(t)
	run := []string{"run", "-d", "--count", "5", "--memory", "256M", "--label", "job=partial", "busybox"}

	out, errOut, code := p.CLI(t, "", run...)
	if code != 125 || out != "" {
		t.Errorf("dsec %s = %q, exit %d; want no IDs, exit 125", strings.Join(run, " "), out, code)
	}
	for _, want := range []string{"created 3 of 5 sandboxes; 2 failed:", "2 × ", "has no room for 256 MiB", "the 3 created were deleted (--keep-partial keeps them)"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("dsec %s stderr = %q, want it to say %q", strings.Join(run, " "), errOut, want)
		}
	}
	if n := strings.Count(errOut, "has no room"); n != 1 {
		t.Errorf("dsec %s stderr names the reason %d times, want once: %q", strings.Join(run, " "), n, errOut)
	}
	if left := psIDs(t, p); len(left) != 0 {
		t.Errorf("after a partly failed batch, dsec ps -q = %q, want nothing left", left)
	}

	// With an idempotency key, a retry of the batch gets the deleted
	// sandboxes back: dsec says so, and still leaves nothing.
	keyed := append([]string{"run", "--idempotency-key", "partial-1"}, run[1:]...)
	if _, errOut, _ := p.CLI(t, "", keyed...); !strings.Contains(errOut, "created 3 of 5") {
		t.Errorf("dsec %s = %q, want 3 of 5 created (and deleted)", strings.Join(keyed, " "), errOut)
	}
	out, errOut, code = p.CLI(t, "", keyed...)
	if code != 125 || out != "" || !strings.Contains(errOut, "× made by an earlier run with this --idempotency-key and deleted since: retry with a new key") {
		t.Errorf("dsec %s, twice = %q, %q, exit %d; want no IDs, exit 125, and the deleted ones named once", strings.Join(keyed, " "), out, errOut, code)
	}
	if left := psIDs(t, p); len(left) != 0 {
		t.Errorf("after a retried batch, dsec ps -q = %q, want nothing left", left)
	}
	// The same for one sandbox.
	single := []string{"run", "-d", "--idempotency-key", "single-1", "--memory", "256M", "busybox"}
	// Placement sees the room the deletes made at once (issue 13).
	id, errOut, _ := p.CLI(t, "", single...)
	if id == "" {
		t.Fatalf("dsec %s right after the deletes = %q: want a sandbox", strings.Join(single, " "), errOut)
	}
	if _, errOut, code := p.CLI(t, "", "rm", strings.TrimSpace(id)); code != 0 {
		t.Fatalf("dsec rm %s = exit %d: %s", id, code, errOut)
	}
	if out, errOut, code := p.CLI(t, "", single...); code != 125 || out != "" || !strings.Contains(errOut, "earlier run with this --idempotency-key and deleted since") {
		t.Errorf("dsec %s after its sandbox was deleted = %q, %q, exit %d; want exit 125 saying it was deleted", strings.Join(single, " "), out, errOut, code)
	}

	out, errOut, code = p.CLI(t, "", append([]string{"run", "--keep-partial"}, run[1:]...)...)
	made := strings.Fields(out)
	slices.Sort(made)
	if code != 125 || len(made) != fit || !strings.Contains(errOut, "created 3 of 5 sandboxes; 2 failed:") {
		t.Errorf("dsec run --keep-partial ... = %q, %q, exit %d; want the %d IDs created, exit 125", out, errOut, code, fit)
	}
	if left := psIDs(t, p); !slices.Equal(left, made) {
		t.Errorf("after --keep-partial, dsec ps -q = %q, want exactly the IDs printed %q", left, made)
	}
	if _, errOut, code := p.CLI(t, "", "rm", "-l", "job=partial"); code != 0 {
		t.Errorf("dsec rm -l job=partial = exit %d: %s", code, errOut)
	}
}

// psIDs returns the IDs `dsec ps -q` lists, sorted.
func psIDs(t *testing.T, p *platform) []string {
	t.Helper()
	out, errOut, code := p.CLI(t, "", "ps", "-q")
	if code != 0 {
		t.Fatalf("dsec ps -q = exit %d: %s", code, errOut)
	}
	ids := strings.Fields(out)
	slices.Sort(ids)
	return ids
}

// memTotal is the machine's memory, as the edge measures it.
func memTotal(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}
