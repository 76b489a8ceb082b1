package ceiling

import (
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestParseReserve(t *testing.T) {
	tests := []struct {
		in    string
		sizes bool
		want  Reserve
	}{
		{"", false, Reserve{}},
		{"auto", true, Reserve{}},
		{"25%", false, Reserve{Fraction: 0.25}},
		{"4096", false, Reserve{Min: 4096}},
		{"25%,4096", false, Reserve{Fraction: 0.25, Min: 4096}},
		{"4096, 25%", false, Reserve{Fraction: 0.25, Min: 4096}},
		{"1G", true, Reserve{Min: 1 << 30}},
		{"10%,1.5G", true, Reserve{Fraction: 0.10, Min: 3 << 29}},
		{"0.5%", true, Reserve{Fraction: 0.005}},
	}
	for _, tt := range tests {
		got, err := ParseReserve(tt.in, tt.sizes)
		if err != nil || got != tt.want {
			t.Errorf("ParseReserve(%q, %v) = %+v, %v; want %+v", tt.in, tt.sizes, got, err, tt.want)
		}
		if !got.IsZero() {
			back, err := ParseReserve(got.String(), tt.sizes)
			if err != nil || back != got {
				t.Errorf("ParseReserve(%q) = %+v, %v; want %+v (String round trip)", got.String(), back, err, got)
			}
		}
	}
	for _, bad := range []string{"0", "0%", "100%", "-5", "1G", "x", "10%,20%", "1,2", "1,2,3", "NaN%", "%"} {
		if _, err := ParseReserve(bad, false); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseReserve(%q, false) = %v, want InvalidArgument", bad, err)
		}
	}
	if _, err := ParseReserve("1Q", true); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ParseReserve(1Q, true) = %v, want InvalidArgument", err)
	}
}

func TestForSandboxes(t *testing.T) {
	tests := []struct {
		name      string
		h         Host
		pids, mem Reserve
		want      Sandboxes
	}{
		// pid_max 32,768: 25% (8,192) is above 4,096; 24 GiB: 10% is above 1 GiB.
		{"defaults, this machine", Host{Tasks: 32768, MemoryBytes: 24 << 30}, Reserve{}, Reserve{},
			Sandboxes{Pids: 24576, MemoryBytes: 24<<30 - (24<<30)/10 - 1}},
		// A small host: the minimums win.
		{"defaults, small host", Host{Tasks: 8192, MemoryBytes: 4 << 30}, Reserve{}, Reserve{},
			Sandboxes{Pids: 4096, MemoryBytes: 3 << 30}},
		{"absolute", Host{Tasks: 4194304, MemoryBytes: 256 << 30}, Reserve{Min: 10000}, Reserve{Min: 8 << 30},
			Sandboxes{Pids: 4184304, MemoryBytes: 248 << 30}},
	}
	for _, tt := range tests {
		got, err := ForSandboxes(tt.h, tt.pids, tt.mem)
		// MemoryBytes of 10% rounds up to a whole byte.
		if err != nil || got.Pids != tt.want.Pids || abs(got.MemoryBytes-tt.want.MemoryBytes) > 1 {
			t.Errorf("%s: ForSandboxes(%+v) = %+v, %v; want %+v", tt.name, tt.h, got, err, tt.want)
		}
		if got.Pids >= tt.h.Tasks || got.MemoryBytes >= tt.h.MemoryBytes {
			t.Errorf("%s: ForSandboxes(%+v) = %+v, want ceilings below the host's totals", tt.name, tt.h, got)
		}
	}
	if _, err := ForSandboxes(Host{Tasks: 4096, MemoryBytes: 8 << 30}, Reserve{}, Reserve{}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ForSandboxes(4096 tasks, default reserve) = %v, want InvalidArgument (nothing left)", err)
	}
	if _, err := ForSandboxes(Host{Tasks: 32768, MemoryBytes: 1 << 30}, Reserve{}, Reserve{}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ForSandboxes(1 GiB, default reserve) = %v, want InvalidArgument (nothing left)", err)
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 100: "100 B", 512 << 20: "512 MiB", 10 << 30: "10 GiB",
		3435973836: "3.1 GiB", 3 << 39: "1.5 TiB", -(2 << 30): "-2 GiB",
	} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
