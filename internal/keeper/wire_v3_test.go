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

var updateV3 = flag.Bool("update-v3", false, "rewrite testdata/v3 (only while protocol 3 is not released)")

// v3Messages are the messages protocol 3 added or changed, as this
// package marshals them. testdata/v3 pins them: a change that makes one
// marshal otherwise is a change of the protocol (api.go's policy).
var v3Messages = map[string]any{
	"version.reply.json": Version{Protocol: 3, MinProtocol: 2, Version: "v0.3.0", Pid: 4242, Runtime: "crun", Drivers: []string{"container"},
		Settings: &Settings{Runtime: "/usr/bin/crun", CgroupParent: "dsec", IDBase: 1_000_000_000, IDSize: 65536, IDRanges: 16384,
			HostPidsReserve: "50%,4096", DiskQuota: "auto", WarmPool: 2, ChunkCache: "/var/lib/dsec/chunks", ChunkSize: 1 << 20}},
	"settings.request.json": Settings{Runtime: "/usr/bin/crun", CgroupParent: "dsec", IDBase: 1_000_000_000, IDSize: 65536, IDRanges: 16384,
		DiskQuota: "auto", WarmPool: 8, BlobSource: "http://10.0.0.2:7430", ChunkCache: "/var/lib/dsec/chunks", ChunkCacheSize: 20 << 30, ChunkSize: 1 << 20},
	"create.request.json": CreateRequest{ID: "n1-abc", Driver: "container", Layers: []Layer{{Digest: "sha256:aa", Path: "/l/aa.erofs"}},
		Resources: Resources{MemoryBytes: 512 << 20, CPUs: 1, Pids: 4096, DiskBytes: 10 << 30}},
	"sandbox.keeper.json": SandboxInfo{ID: "n1-abc", State: StateRunning, Pid: 77, StartTime: 12345, Created: time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC),
		Driver: "container", Lazy: true, IDBase: 1_000_065_536, IDSize: 65536, NS: map[string]NSID{"mnt": {4, 4026532388}}},
}

func TestV3Golden(t *testing.T) {
	for name, v := range v3Messages {
		got, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "v3", name)
		if *updateV3 {
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
			t.Errorf("json.Marshal(%T) =\n%s\nwant (testdata/v3/%s)\n%s", v, got, name, want)
		}
	}
}

// TestV3RecordReadByV2: a record a keeper of protocol 3 wrote is adopted
// by one of protocol 2 (a downgrade), which ignores what it does not know.
func TestV3RecordReadByV2(t *testing.T) {
	var old v2SandboxInfo
	b, err := os.ReadFile(filepath.Join("testdata", "v3", "sandbox.keeper.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &old); err != nil || old.ID != "n1-abc" || old.Pid != 77 || old.IDBase != 1_000_065_536 {
		t.Errorf("protocol 2 reads testdata/v3/sandbox.keeper.json as %+v, %v", old, err)
	}
}
