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

var updateV6Steps = flag.Bool("update-v6-steps", false, "rewrite testdata/v6/*.stepkey.json (only while protocol 6 is not released)")

// v6StepMessages are the messages protocol 6 changed for exec step keys:
// ExecSpec.StepKey, ExecInfo.StepKey and the journal's spec.json.
// testdata/v6 pins them (api.go's policy); the pause endpoints of the
// same protocol are pinned in files of their own.
var v6StepMessages = map[string]any{
	"exec.start.stepkey.json": ExecRequest{Sandbox: "n1-abc", Spec: ExecSpec{
		ID: "xq2m7tkk4dhvqzrd", Argv: []string{"/bin/sh", "-c", "echo 1 >> /workspace/effects"},
		Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/workspace", StepKey: "rollout-7/step-3",
	}},
	"execinfo.stepkey.json": ExecInfo{ID: "xq2m7tkk4dhvqzrd", Argv: []string{"/bin/sh", "-c", "echo 1 >> /workspace/effects"},
		Started:     time.Date(2026, 12, 3, 1, 0, 0, 0, time.UTC),
		Exit:        &ExitStatus{Code: 0, Started: time.Date(2026, 12, 3, 1, 0, 0, 0, time.UTC), Ended: time.Date(2026, 12, 3, 1, 0, 1, 0, time.UTC)},
		StdoutBytes: 0, StderrBytes: 0, StepKey: "rollout-7/step-3"},
	"exec.spec.stepkey.json": journalEntry{ID: "xq2m7tkk4dhvqzrd", Argv: []string{"/bin/sh", "-c", "echo 1 >> /workspace/effects"},
		Started: time.Date(2026, 12, 3, 1, 0, 0, 0, time.UTC), StepKey: "rollout-7/step-3"},
}

func TestV6StepKeysGolden(t *testing.T) {
	for name, v := range v6StepMessages {
		got, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "v6", name)
		if *updateV6Steps {
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
		// And back: today's types read the pinned message.
		back := decodeLike(t, v, want)
		if again, _ := json.Marshal(back); !bytes.Equal(again, got) {
			t.Errorf("testdata/v6/%s read back = %s, want %s", name, again, got)
		}
	}
}

// decodeLike decodes b into a new value of v's type.
func decodeLike(t *testing.T, v any, b []byte) any {
	t.Helper()
	var err error
	var out any
	switch v.(type) {
	case ExecRequest:
		var m ExecRequest
		err = json.Unmarshal(b, &m)
		out = m
	case ExecInfo:
		var m ExecInfo
		err = json.Unmarshal(b, &m)
		out = m
	case journalEntry:
		var m journalEntry
		err = json.Unmarshal(b, &m)
		out = m
	default:
		t.Fatalf("no decoder for %T", v)
	}
	if err != nil {
		t.Fatalf("decode %T: %v", v, err)
	}
	return out
}

// TestV6StepKeyUnsetIsV5: an exec without a step key is the message
// protocol 5 sent and recorded, so an older keeper reads it as before.
func TestV6StepKeyUnsetIsV5(t *testing.T) {
	for _, v := range []any{ExecSpec{ID: "x1", Argv: []string{"true"}}, ExecInfo{ID: "x1"}, journalEntry{ID: "x1"}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(bytes.ToLower(b), []byte("step")) {
			t.Errorf("json.Marshal(%T) = %s, want no step key field", v, b)
		}
	}
}
