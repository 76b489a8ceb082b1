package keeper

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var updateV6Pause = flag.Bool("update-v6-pause", false, "rewrite testdata/v6 (only while protocol 6 is not released)")

// v6PauseMessages are the messages protocol 6 added or changed for pause and
// resume. testdata/v6 pins them (api.go's policy); exec step keys, also
// of protocol 6, are pinned beside them by their own test.
var v6PauseMessages = map[string]any{
	"pause.reply.json": PauseInfo{Paused: true, Resident: 3 << 20, Swapped: 253 << 20, Locked: 1 << 20, Moving: true},
	"pause.warning.reply.json": PauseInfo{Paused: true, Resident: 256 << 20,
		Warning: "256 MiB stay in RAM: the node has no swap (start dsec up with --swap FILE:SIZE)"},
	"resume.reply.json": PauseInfo{Resident: 40 << 20, Swapped: 216 << 20, Moving: true},
	"sandboxinfo.paused.json": SandboxInfo{ID: "n1-abc", State: StateRunning, Pid: 4242, StartTime: 99,
		Created: time.Date(2026, 12, 3, 1, 0, 0, 0, time.UTC), Paused: true},
	"stats.swapped.reply.json": Stats{MemoryBytes: 3 << 20, MemoryLimit: 512 << 20, CPUUsage: 1500 * time.Millisecond, Pids: 3, PidsLimit: 4096,
		DiskBytes: 1 << 20, DiskLimit: 10 << 30, OutputLimit: 256 << 20, SwappedBytes: 253 << 20},
}

func TestV6PauseGolden(t *testing.T) {
	for name, v := range v6PauseMessages {
		got, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "v6", name)
		if *updateV6Pause {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, bytes.TrimSpace(want)) {
			t.Errorf("json.Marshal(%T) =\n%s\nwant (testdata/v6/%s)\n%s", v, got, name, want)
		}
	}
}

// TestV6PauseUnsetFieldsAreV5: a sandbox that is not paused and stats without
// swap marshal as protocol 5 did, so an older client reads them.
func TestV6PauseUnsetFieldsAreV5(t *testing.T) {
	for _, v := range []any{SandboxInfo{ID: "n1-abc", State: StateRunning}, Stats{MemoryBytes: 1}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("paused")) || bytes.Contains(b, []byte("swapped")) {
			t.Errorf("json.Marshal(%T) = %s, want no pause field", v, b)
		}
	}
	// The v2 record of a sandbox reads as one that is not paused.
	var info SandboxInfo
	if err := json.Unmarshal(readFixture(t, "sandbox.keeper.json"), &info); err != nil {
		t.Fatal(err)
	}
	if info.Paused {
		t.Errorf("a protocol 2 record reads as paused")
	}
}
