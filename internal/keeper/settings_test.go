package keeper

import (
	"os/exec"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func normalized(t *testing.T, s Settings) Settings {
	t.Helper()
	if _, err := exec.LookPath("crun"); err != nil {
		if _, err := exec.LookPath("runc"); err != nil {
			t.Skip("no OCI runtime installed (crun or runc): settings name one")
		}
	}
	n, err := s.Normalize("/var/lib/dsec")
	if err != nil {
		t.Fatalf("Normalize(%+v) = %v", s, err)
	}
	return n
}

func TestSettingsNormalize(t *testing.T) {
	zero := normalized(t, Settings{})
	explicit := normalized(t, Settings{
		CgroupParent: "dsec", IDBase: 1_000_000_000, IDSize: 65536, IDRanges: DefaultUIDRanges,
		HostPidsReserve: "auto", DiskQuota: "auto", WarmPool: 2, ChunkCache: "/var/lib/dsec/chunks", ChunkSize: 1 << 20,
	})
	if diff := cmp.Diff(zero, explicit); diff != "" {
		t.Errorf("the defaults spelled out normalize to other settings than none (-none +spelled out):\n%s", diff)
	}
	if got := normalized(t, Settings{WarmPool: -5}).WarmPool; got != -1 {
		t.Errorf("Normalize(WarmPool: -5).WarmPool = %d, want -1 (none)", got)
	}
	if _, err := (Settings{IDBase: 1 << 31, IDSize: 1 << 30, IDRanges: 4}).Normalize("/x"); err == nil {
		t.Errorf("Normalize(4 ranges of 2^30 ids from 2^31) = nil error, want one: they do not fit 32 bits")
	}
}

func TestSettingsArgsRoundTrip(t *testing.T) {
	for _, s := range []Settings{
		{},
		{Runtime: "/usr/bin/runc", CgroupParent: "dsec-e2e", IDBase: 2_000_000_000, IDSize: 65536, IDRanges: 64,
			HostPidsReserve: "50%,4096", HostMemoryReserve: "2147483648", DiskQuota: "image", WarmPool: -1,
			BlobSource: "http://127.0.0.1:9000", ChunkCache: "/srv/chunks", ChunkCacheSize: 1 << 30, ChunkSize: 4 << 20,
			NetworkConfig: "/etc/dsec/network.toml"},
	} {
		got, err := SettingsFromArgs(s.Args())
		if err != nil {
			t.Fatalf("SettingsFromArgs(%q) = %v", s.Args(), err)
		}
		if diff := cmp.Diff(s, got); diff != "" {
			t.Errorf("SettingsFromArgs(%q) (-want +got):\n%s", s.Args(), diff)
		}
	}
}

// TestSettingsFromV2CommandLine reads the command line a protocol 2 edge
// (b56bd3e) started its keeper with, as /proc/PID/cmdline shows it.
func TestSettingsFromV2CommandLine(t *testing.T) {
	argv := []string{"--state-dir", "/tmp/dsec-e2e-2286493280", "--uid-base", "1000000000", "--uid-count", "65536",
		"--cgroup-parent", "dsec-e2e-585e7d49", "--disk-quota", "auto", "--warm-pool", "2", "--chunk-size", "1048576"}
	got, err := SettingsFromArgs(argv)
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{IDBase: 1_000_000_000, IDSize: 65536, CgroupParent: "dsec-e2e-585e7d49", DiskQuota: "auto", WarmPool: 2, ChunkSize: 1 << 20}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SettingsFromArgs(v2 command line) (-want +got):\n%s", diff)
	}
	for _, bad := range [][]string{{"--frobnicate", "1"}, {"--warm-pool"}, {"--warm-pool", "many"}, {"state-dir"}} {
		if _, err := SettingsFromArgs(bad); err == nil {
			t.Errorf("SettingsFromArgs(%q) = nil error, want one", bad)
		}
	}
}

func TestCompare(t *testing.T) {
	base := normalized(t, Settings{CgroupParent: "dsec-a", IDRanges: 100})
	tests := []struct {
		name   string
		change func(*Settings)
		want   ChangeClass
		flag   string
	}{
		{"warm pool", func(s *Settings) { s.WarmPool = 5 }, Live, "--warm-pool"},
		{"chunk size", func(s *Settings) { s.ChunkSize = 4 << 20 }, Restart, "--chunk-size"},
		{"chunk cache size", func(s *Settings) { s.ChunkCacheSize = 1 << 30 }, Restart, "--chunk-cache-size"},
		{"blob source", func(s *Settings) { s.BlobSource = "dir:/srv/blobs" }, Restart, "--blob-source"},
		{"network config", func(s *Settings) { s.NetworkConfig = "/etc/dsec/network.toml" }, Restart, "--network-config"},
		{"host pids reserve", func(s *Settings) { s.HostPidsReserve = "50%" }, Restart, "--host-pids-reserve"},
		{"more id ranges", func(s *Settings) { s.IDRanges = 200 }, Restart, "--uid-ranges"},
		{"fewer id ranges", func(s *Settings) { s.IDRanges = 50 }, Fixed, "--uid-ranges"},
		{"cgroup parent", func(s *Settings) { s.CgroupParent = "dsec-b" }, Fixed, "--cgroup-parent"},
		{"uid base", func(s *Settings) { s.IDBase += s.IDSize }, Fixed, "--uid-base"},
		{"disk quota", func(s *Settings) { s.DiskQuota = "off" }, Fixed, "--disk-quota"},
		{"runtime", func(s *Settings) { s.Runtime = "/opt/runsc" }, Fixed, "--runtime"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := base
			tt.change(&want)
			got := Compare(base, want)
			if len(got) != 1 || got[0].Flag != tt.flag || got[0].Class != tt.want {
				t.Errorf("Compare(%s changed) = %+v, want one %s change of class %v", tt.name, got, tt.flag, tt.want)
			}
		})
	}
	if got := Compare(base, base); len(got) != 0 {
		t.Errorf("Compare(same, same) = %+v, want none", got)
	}
}
