package doctor

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseKernelRelease(t *testing.T) {
	for _, tc := range []struct {
		in           string
		major, minor int
		ok           bool
	}{
		{"6.18.44-fc-v782", 6, 18, true},
		{"6.12-rc1", 6, 12, true},
		{"5.10.0-28-amd64", 5, 10, true},
		{"6.1.0", 6, 1, true},
		{"6", 0, 0, false},
		{"", 0, 0, false},
		{"x.1", 0, 0, false},
		{"6.x", 0, 0, false},
		{"+6.1", 0, 0, false},
		{"-6.1", 0, 0, false},
		{"6.1234567", 0, 0, false},
	} {
		major, minor, ok := parseKernelRelease(tc.in)
		if major != tc.major || minor != tc.minor || ok != tc.ok {
			t.Errorf("parseKernelRelease(%q) = %d, %d, %v, want %d, %d, %v", tc.in, major, minor, ok, tc.major, tc.minor, tc.ok)
		}
	}
}

func TestParseFilesystems(t *testing.T) {
	in := "nodev\tsysfs\nnodev\tproc\n\text4\n\txfs\nnodev\toverlay\n\terofs\n\n"
	want := map[string]bool{"sysfs": true, "proc": true, "ext4": true, "xfs": true, "overlay": true, "erofs": true}
	if diff := cmp.Diff(want, parseFilesystems([]byte(in))); diff != "" {
		t.Errorf("parseFilesystems() mismatch (-want +got):\n%s", diff)
	}
}

func TestParseSubIDs(t *testing.T) {
	in := `# comment
alice:100000:65536
bob:165536:65536

broken line
carol:x:10
dave:10:0
erin:4294967296:1
:5:5
  frank:200000:10  
`
	want := []subIDRange{{"alice", 100000, 65536}, {"bob", 165536, 65536}, {"frank", 200000, 10}}
	if diff := cmp.Diff(want, parseSubIDs([]byte(in))); diff != "" {
		t.Errorf("parseSubIDs() mismatch (-want +got):\n%s", diff)
	}
}

func TestOverlappingAndFreeBase(t *testing.T) {
	rs := []subIDRange{{"a", 1_000_000_000, 65536}, {"b", 1_000_065_536, 10}, {"c", 100000, 65536}}
	for _, tc := range []struct {
		base, count uint64
		overlaps    []string
		free        uint64
		freeOK      bool
	}{
		{1_000_000_000, 65536, []string{"a"}, 1_000_079_360, true}, // the first multiple of 65536 past a
		{1_000_032_768, 65536, []string{"a", "b"}, 1_000_079_360, true},
		{2_000_000_000, 65536, nil, 2_000_027_648, true}, // rounded up to a multiple of 65536
		{165536, 65536, nil, 196608, true},
		{100000 + 65535, 1, []string{"c"}, 196608, true},
		{4_294_900_000, 65536, nil, 0, false},
	} {
		var got []string
		for _, r := range overlapping(tc.base, tc.count, rs) {
			got = append(got, r.Owner)
		}
		if diff := cmp.Diff(tc.overlaps, got); diff != "" {
			t.Errorf("overlapping(%d, %d) mismatch (-want +got):\n%s", tc.base, tc.count, diff)
		}
		free, ok := freeBase(tc.base, tc.count, rs)
		if free != tc.free || ok != tc.freeOK {
			t.Errorf("freeBase(%d, %d) = %d, %v, want %d, %v", tc.base, tc.count, free, ok, tc.free, tc.freeOK)
		}
		if ok && len(overlapping(free, tc.count, rs)) > 0 {
			t.Errorf("freeBase(%d, %d) = %d, which overlaps", tc.base, tc.count, free)
		}
	}
}

func TestParseMeminfo(t *testing.T) {
	in := "MemTotal:       24683620 kB\nMemAvailable:    1000 kB\nHugePages_Total:       0\nbad line\nSwapTotal: x kB\n"
	want := map[string]uint64{"MemTotal": 24683620 * 1024, "MemAvailable": 1000 * 1024, "HugePages_Total": 0}
	if diff := cmp.Diff(want, parseMeminfo([]byte(in))); diff != "" {
		t.Errorf("parseMeminfo() mismatch (-want +got):\n%s", diff)
	}
}

func TestParseRuntimeVersion(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"crun version 1.8.1\ncommit: f8a096be\nrundir: /run/crun\n", "1.8.1"},
		{"runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\n", "1.1.5+ds1"},
		{"youki 0.3.0\n", "youki 0.3.0"},
		{"", ""},
	} {
		if got := parseRuntimeVersion([]byte(tc.in)); got != tc.want {
			t.Errorf("parseRuntimeVersion(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		in   uint64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1536, "1.5 KiB"},
		{10 << 30, "10.0 GiB"},
		{24683620 * 1024, "23.5 GiB"},
		{1<<64 - 1, "16.0 EiB"},
	} {
		if got := formatBytes(tc.in); got != tc.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The files these parse are the system's, not a user's, but a broken
// line must never stop doctor.
func FuzzParseSubIDs(f *testing.F) {
	f.Add([]byte("alice:100000:65536\n# c\nbob:1:2\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, r := range parseSubIDs(b) {
			if r.Owner == "" || r.Count == 0 || r.Start > 1<<32-1 || r.Count > 1<<32-1 {
				t.Errorf("parseSubIDs(%q) returned %+v", b, r)
			}
		}
	})
}

func FuzzParseKernelRelease(f *testing.F) {
	f.Add("6.18.44-fc-v782")
	f.Fuzz(func(t *testing.T, s string) {
		major, minor, ok := parseKernelRelease(s)
		if ok && (major < 0 || minor < 0) {
			t.Errorf("parseKernelRelease(%q) = %d, %d, true", s, major, minor)
		}
	})
}

func FuzzParseMeminfo(f *testing.F) {
	f.Add([]byte("MemTotal: 1 kB\nSwapTotal: 0 kB\n"))
	f.Fuzz(func(t *testing.T, b []byte) { _ = parseMeminfo(b) })
}
