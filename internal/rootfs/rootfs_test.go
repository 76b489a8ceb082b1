package rootfs

import "testing"

func TestIDMap(t *testing.T) {
	m := IDMap{HostID: 1_000_000_000, Size: 65536}
	if err := m.Validate(); err != nil {
		t.Fatalf("Validate(%v) = %v", m, err)
	}
	for _, tt := range []struct {
		in   uint32
		want uint32
		ok   bool
	}{{0, 1_000_000_000, true}, {1000, 1_000_001_000, true}, {65535, 1_000_065_535, true}, {65536, 0, false}} {
		if got, ok := m.ToHost(tt.in); got != tt.want || ok != tt.ok {
			t.Errorf("ToHost(%d) = %d, %v, want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
	if got := m.FromHost(1_000_000_005); got != 5 {
		t.Errorf("FromHost(inside) = %d, want 5", got)
	}
	if got := m.FromHost(0); got != 65534 {
		t.Errorf("FromHost(host root) = %d, want the overflow id 65534", got)
	}
	for _, bad := range []IDMap{{HostID: 0, Size: 10}, {HostID: 5, Size: 0}, {HostID: 1<<32 - 10, Size: 65536}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate(%v) = nil, want an error", bad)
		}
	}
}

func TestShortName(t *testing.T) {
	d := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if got, err := shortName(d); err != nil || got != "0123456789abcdef" {
		t.Errorf("shortName(%q) = %q, %v", d, got, err)
	}
	for _, bad := range []string{"", "sha256:abc", "sha512:" + d[7:], "sha256:" + "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef", "sha256:../../../../../../../../../../../../../../../../../../../../../"} {
		if _, err := shortName(bad); err == nil {
			t.Errorf("shortName(%q) = nil error", bad)
		}
	}
}
