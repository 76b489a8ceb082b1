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

var updateV4 = flag.Bool("update-v4", false, "rewrite testdata/v4 (only while protocol 4 is not released)")

// v4Messages are the messages protocol 4 added or changed: shell sessions
// and sealed execs. testdata/v4 pins them (api.go's policy).
var v4Messages = map[string]any{
	"version.reply.json": Version{Protocol: 4, MinProtocol: 2, Version: "v0.4.0", Pid: 4242, Runtime: "crun", Drivers: []string{"container"}},
	"exec.session.request.json": ExecRequest{Sandbox: "n1-abc", Spec: ExecSpec{ID: "x1", Argv: []string{"cd /tmp && export FOO=bar"},
		Env: []string{"PATH=/usr/bin:/bin"}, Session: "main", SessionShell: "/bin/bash", Timeout: 30 * time.Second}},
	"exec.sealed.request.json": ExecRequest{Sandbox: "n1-abc", Spec: ExecSpec{ID: "x2", Argv: []string{"/bin/sh", "-c", "make test"}, Seal: 1}},
	"exit.session.json": ExitStatus{Code: 130, TimedOut: true, Sealed: false, SessionLost: true, SessionRestarted: true,
		Started: time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC), Ended: time.Date(2026, 12, 1, 20, 0, 30, 0, time.UTC)},
	"exit.sealed.json": ExitStatus{Code: 0, Sealed: true,
		Started: time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC), Ended: time.Date(2026, 12, 1, 20, 0, 1, 0, time.UTC)},
	"execinfo.json": ExecInfo{ID: "x1", Argv: []string{"pwd"}, Started: time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC), Session: "main", Sealed: false},
	"sessions.reply.json": struct {
		Sessions []SessionInfo `json:"sessions"`
	}{[]SessionInfo{{Name: "main", Shell: "/bin/bash", Created: time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC), Commands: 3, RunningExec: "x4"}}},
}

func TestV4Golden(t *testing.T) {
	for name, v := range v4Messages {
		got, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "v4", name)
		if *updateV4 {
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
			t.Errorf("json.Marshal(%T) =\n%s\nwant (testdata/v4/%s)\n%s", v, got, name, want)
		}
	}
}

// TestV4UnsetFieldsAreV3: an exec of protocol 4 that uses neither a
// session nor a seal marshals as protocol 3 did, so an older keeper reads
// exactly what it always read.
func TestV4UnsetFieldsAreV3(t *testing.T) {
	b, err := json.Marshal(ExecSpec{ID: "x", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"Session", "SessionShell", "Seal"} {
		if bytes.Contains(b, []byte(`"`+field+`"`)) {
			t.Errorf("ExecSpec without %s marshals it: %s", field, b)
		}
	}
	b, err = json.Marshal(ExitStatus{Code: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"Sealed", "SessionLost", "SessionRestarted"} {
		if bytes.Contains(b, []byte(`"`+field+`"`)) {
			t.Errorf("ExitStatus without %s marshals it: %s", field, b)
		}
	}
}
