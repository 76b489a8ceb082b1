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

var updateV5 = flag.Bool("update-v5", false, "rewrite testdata/v5 (only while protocol 5 is not released)")

// v5Messages are the messages protocol 5 added or changed: sandbox
// networks. testdata/v5 pins them (api.go's policy).
var v5Messages = map[string]any{
	"network.request.json": NetworkRequest{Policy: json.RawMessage(`{"version":1,"mode":"rules","rules":[{"action":"allow","service":"pypi"},{"action":"deny","service":"npm"}]}`)},
	"network.reply.json": NetworkInfo{
		Policy:  json.RawMessage(`{"version":1,"mode":"rules","rules":[{"action":"allow","service":"pypi"}]}`),
		Address: "100.64.0.3", Router: "100.64.0.2",
		BytesOut: 1234, BytesIn: 567890, ConnsOut: 3, ConnsActive: 1, Denied: 2, DNSQueries: 9, DNSDenied: 1,
		Denials: []Denial{
			{Time: time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC), Dest: "registry.npmjs.org", Reason: "denied: the policy allows no connection to this name, so it does not resolve (NXDOMAIN)"},
			{Time: time.Date(2026, 12, 2, 1, 0, 1, 0, time.UTC), Dest: "151.101.0.223:443/tcp", Name: "registry.npmjs.org", Reason: "denied by rule 2 (deny npm)"},
		},
	},
	"sandboxinfo.network.json": SandboxInfo{ID: "n1-abc", State: StateRunning, Pid: 4242, StartTime: 99,
		Created: time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC), Network: json.RawMessage(`{"version":1,"mode":"open"}`)},
	"nodenetwork.reply.json": NodeNetwork{BytesOut: 10 << 20, BytesIn: 3 << 30, ConnsOut: 812, ConnsActive: 4, Denied: 37, DNSQueries: 2048, DNSDenied: 12,
		Links: 120, ProxySandboxes: 120, ResolverSandboxes: 95},
	"settings.network.json": Settings{Runtime: "/usr/bin/crun", CgroupParent: "dsec", NetworkConfig: "/etc/dsec/network.toml"},
}

func TestV5Golden(t *testing.T) {
	for name, v := range v5Messages {
		got, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "v5", name)
		if *updateV5 {
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
			t.Errorf("json.Marshal(%T) =\n%s\nwant (testdata/v5/%s)\n%s", v, got, name, want)
		}
	}
}

// TestV5UnsetFieldsAreV4: a sandbox and settings without a network
// marshal as protocol 4 did.
func TestV5UnsetFieldsAreV4(t *testing.T) {
	for _, v := range []any{SandboxInfo{ID: "n1-abc"}, Settings{Runtime: "/usr/bin/crun"}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("network")) {
			t.Errorf("json.Marshal(%T) = %s, want no network field", v, b)
		}
	}
}
