package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// netSbID is the fake's sandbox with a network.
const netSbID = "node1-nnnnnnnnnnnn"

// TestStatsNetwork: dsec stats shows the network columns when a sandbox
// has a network, "-" in them for one without, and none at all when no
// sandbox shown has one; -o json carries the counters.
func TestStatsNetwork(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	out, errOut, code := dsecRun(t, addr, "", "stats", "--sample", "0", netSbID, sbID)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 {
		t.Fatalf("stats with and without network = %q, %q, exit %d; want a header and two rows", out, errOut, code)
	}
	if f := strings.Fields(lines[0]); !strings.Contains(lines[0], "NET IN / OUT") || f[len(f)-2] != "CONNS" || f[len(f)-1] != "DENIED" {
		t.Errorf("stats header = %q, want NET IN / OUT, CONNS and DENIED", lines[0])
	}
	if f := strings.Fields(lines[1]); f[0] != netSbID || strings.Join(f[len(f)-5:], " ") != "2M / 512K 9 4" {
		t.Errorf("stats row of the sandbox with network = %q, want 2M in, 512K out, 9 connections, 4 denied", lines[1])
	}
	if f := strings.Fields(lines[2]); f[0] != sbID || strings.Join(f[len(f)-3:], " ") != "- - -" {
		t.Errorf("stats row of the sandbox without network = %q, want - in the network columns", lines[2])
	}

	out, _, code = dsecRun(t, addr, "", "stats", "--sample", "0", sbID)
	if code != 0 || strings.Contains(out, "NET") {
		t.Errorf("stats of a sandbox without network = %q, exit %d; want no network columns", out, code)
	}

	out, _, code = dsecRun(t, addr, "", "stats", "--sample", "0", "-o", "json", netSbID)
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil || code != 0 || len(rows) != 1 ||
		rows[0]["netBytesIn"] != "2097152" || rows[0]["netBytesOut"] != "524288" || rows[0]["netConnectionsOut"] != "9" || rows[0]["netDenied"] != "4" {
		t.Errorf("stats -o json of a sandbox with network = %s, exit %d (%v); want its network counters", out, code, err)
	}
}
