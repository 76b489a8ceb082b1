package cgroup

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/swap/swaptest"
)

// TestAllowSwapWrites checks the files AllowSwap writes on each kind of
// host; never the root's memory.swappiness (the host's vm.swappiness).
func TestAllowSwapWrites(t *testing.T) {
	for _, tt := range []struct {
		mode Mode
		want []string
	}{
		{V1, []string{"write memory/dsec/sb/memory.swappiness 100", "write memory/dsec/sb/memory.swappiness 0"}},
		{Hybrid, []string{"write memory/dsec/sb/memory.swappiness 100", "write memory/dsec/sb/memory.swappiness 0"}},
		{Unified, []string{"write unified/dsec/sb/memory.swap.max max", "write unified/dsec/sb/memory.swap.max 0"}},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			m, k := newFake(t, fakeOptions{mode: tt.mode})
			if err := m.Create("sb", limits); err != nil {
				t.Fatal(err)
			}
			k.log = nil
			if err := m.AllowSwap("sb", true); err != nil {
				t.Fatalf("AllowSwap(sb, true) = %v", err)
			}
			if err := m.AllowSwap("sb", false); err != nil {
				t.Fatalf("AllowSwap(sb, false) = %v", err)
			}
			if diff := cmp.Diff(tt.want, k.log); diff != "" {
				t.Errorf("AllowSwap writes (-want +got):\n%s", diff)
			}
			if err := m.AllowSwap("nosuch", true); err == nil {
				t.Errorf("AllowSwap(nosuch) = nil, want NotFound")
			}
			if err := m.AllowSwap("", true); err == nil {
				t.Errorf("AllowSwap(\"\") = nil, want an invalid name: the root is the host's")
			}
		})
	}
}

// TestReclaimWrites checks the file Reclaim writes: v1's force_empty,
// cgroup2's memory.reclaim of what the group holds.
func TestReclaimWrites(t *testing.T) {
	for _, tt := range []struct {
		mode Mode
		want []string
	}{
		{V1, []string{"write memory/dsec/sb/memory.force_empty 0"}},
		{Unified, []string{"write unified/dsec/sb/memory.reclaim 12345"}},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			m, k := newFake(t, fakeOptions{mode: tt.mode})
			if err := m.Create("sb", limits); err != nil {
				t.Fatal(err)
			}
			if tt.mode == Unified {
				if err := os.WriteFile(filepath.Join(k.base, "unified/dsec/sb/memory.current"), []byte("12345\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			k.log = nil
			if err := m.Reclaim(context.Background(), "sb"); err != nil {
				t.Fatalf("Reclaim(sb) = %v", err)
			}
			if diff := cmp.Diff(tt.want, k.log); diff != "" {
				t.Errorf("Reclaim writes (-want +got):\n%s", diff)
			}
			k.busyWrite = filepath.Base(strings.Fields(tt.want[0])[1])
			if err := m.Reclaim(context.Background(), "sb"); err != nil {
				t.Errorf("Reclaim that frees less than asked = %v, want nil", err)
			}
		})
	}
}

// TestRealReclaim holds 96 MiB in a group and reclaims it with and
// without swap allowed: a running group's (swappiness 0) stays in RAM,
// a paused one's goes to swap, and Memory says where it is.
func TestRealReclaim(t *testing.T) {
	m := newReal(t)
	swaptest.Enable(t, 256<<20)
	const mib = 96
	if err := m.Create("sb", Resources{MemoryBytes: 256 << 20}); err != nil {
		t.Fatalf("Create() = %v", err)
	}
	startHold(t, m, "sb", mib)
	before, err := m.Memory("sb")
	if err != nil {
		t.Fatalf("Memory(sb) = %v", err)
	}
	if before.Anon < mib<<20 || before.Resident < mib<<20 || before.Swapped != 0 {
		t.Fatalf("Memory(sb) holding %d MiB = %+v", mib, before)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := m.Reclaim(ctx, "sb"); err != nil {
		t.Fatalf("Reclaim(sb) = %v", err)
	}
	kept, err := m.Memory("sb")
	if err != nil {
		t.Fatal(err)
	}
	if kept.Swapped > 1<<20 || kept.Anon < mib<<20 {
		t.Errorf("Reclaim of a group not allowed to swap: Memory = %+v, want its %d MiB anonymous memory in RAM", kept, mib)
	}
	if err := m.AllowSwap("sb", true); err != nil {
		t.Fatalf("AllowSwap(sb, true) = %v", err)
	}
	if err := m.Reclaim(ctx, "sb"); err != nil {
		t.Fatalf("Reclaim(sb) = %v", err)
	}
	out, err := m.Memory("sb")
	if err != nil {
		t.Fatal(err)
	}
	if out.Swapped < mib<<20*9/10 || out.Anon > mib<<20/10 {
		t.Errorf("Reclaim of a group allowed to swap: Memory = %+v, want >= 90%% of %d MiB in swap", out, mib)
	}
	if err := m.AllowSwap("sb", false); err != nil {
		t.Fatalf("AllowSwap(sb, false) = %v", err)
	}
}

// startHold starts a child in group name that holds mib MiB and returns
// once it does.
func startHold(t *testing.T, m *Manager, name string, mib int) *child {
	t.Helper()
	t.Setenv("DSEC_CGROUP_TEST_MIB", strconv.Itoa(mib))
	c := start(t, "hold")
	if err := m.Add(name, c.cmd.Process.Pid); err != nil {
		t.Fatalf("Add() = %v", err)
	}
	if _, err := c.stdin.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c.stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("child holding %d MiB said %q, %v", mib, line, err)
	}
	return c
}

// TestMemoryReads checks Memory reads each host's files: v1's usage and
// hierarchical totals, cgroup2's current, swap.current and memory.stat.
func TestMemoryReads(t *testing.T) {
	for _, tt := range []struct {
		mode  Mode
		files map[string]string
		want  Memory
	}{
		{V1, map[string]string{
			"memory/dsec/sb/memory.usage_in_bytes": "1000\n",
			"memory/dsec/sb/memory.stat":           "cache 1\nrss 2\nswap 3\ntotal_cache 40\ntotal_rss 50\ntotal_swap 60\ntotal_unevictable 7\ntotal_writeback 8\n",
		}, Memory{Resident: 1000, Swapped: 60, Anon: 50, File: 40, Unevictable: 7, Writeback: 8}},
		{Unified, map[string]string{
			"unified/dsec/sb/memory.current":      "2000\n",
			"unified/dsec/sb/memory.swap.current": "300\n",
			"unified/dsec/sb/memory.stat":         "anon 11\nfile 12\nunevictable 13\nfile_writeback 14\n",
		}, Memory{Resident: 2000, Swapped: 300, Anon: 11, File: 12, Unevictable: 13, Writeback: 14}},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			m, k := newFake(t, fakeOptions{mode: tt.mode})
			if err := m.Create("sb", limits); err != nil {
				t.Fatal(err)
			}
			for f, data := range tt.files {
				if err := os.WriteFile(filepath.Join(k.base, f), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := m.Memory("sb")
			if err != nil {
				t.Fatalf("Memory(sb) = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Memory(sb) (-want +got):\n%s", diff)
			}
			if _, err := m.Memory("nosuch"); err == nil {
				t.Errorf("Memory(nosuch) = nil error, want NotFound")
			}
		})
	}
}
