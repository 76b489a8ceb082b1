package dsec

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"1", 1},
		{"4096", 4096},
		{"100B", 100},
		{"100b", 100},
		{"1K", 1 << 10},
		{"1k", 1 << 10},
		{"1KB", 1 << 10},
		{"1KiB", 1 << 10},
		{"1ki", 1 << 10},
		{"512M", 512 << 20},
		{"512m", 512 << 20},
		{"512MiB", 512 << 20},
		{"512mb", 512 << 20},
		{"2G", 2 << 30},
		{"2Gi", 2 << 30},
		{"2gib", 2 << 30},
		{"1.5G", 3 << 29},
		{"0.5M", 512 << 10},
		{"1.25K", 1280},
		{"0.1K", 102}, // 102.4, rounded down
		{"1T", 1 << 40},
		{"8388607T", 8388607 << 40},
		{" 10G ", 10 << 30},
		{"007M", 7 << 20},
		{"9223372036854775807", math.MaxInt64},
		{"9223372036854775807B", math.MaxInt64},
		{"8388607.99999999999999T", 8388607<<40 + (1<<40 - 1)},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v, want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestParseSizeErrors(t *testing.T) {
	for _, in := range []string{
		"", " ", "-1", "-1G", "+1G", "G", "1X", "1GG", "1 G", "1.G", ".5G", "1..5G", "1.2.3G",
		"1.5", "1.5B", "0x10", "1e3", "8388608T", "9223372036854775808", "99999999999999999999K",
		"1Gx", "1Kıb", strings.Repeat("9", 100), "NaN", "Inf",
	} {
		got, err := ParseSize(in)
		if err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseSize(%q) = %v, want ErrInvalidArgument", in, err)
		}
		if !strings.Contains(err.Error(), "512M") {
			t.Errorf("ParseSize(%q) = %q, want an example in the message", in, err)
		}
		if len(in) <= maxSizeLen && !strings.Contains(err.Error(), strings.TrimSpace(in)) {
			t.Errorf("ParseSize(%q) = %q, want the input quoted", in, err)
		}
	}
}

func TestFormatSize(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0B"},
		{1, "1B"},
		{1023, "1023B"},
		{1024, "1K"},
		{1536, "1.5K"},
		{512 << 20, "512M"},
		{2 << 30, "2G"},
		{3 << 29, "1.5G"},
		{1<<30 + 1, "1.0G"},
		{2<<30 - 1, "1.9G"},
		{10 << 40, "10T"},
		{-(2 << 30), "-2G"},
		{math.MaxInt64, "8388607.9T"},
		{math.MinInt64, "-9223372036854775808B"},
	}
	for _, tt := range tests {
		if got := FormatSize(tt.n); got != tt.want {
			t.Errorf("FormatSize(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512M", "2G", "1.5G", "0", "100B", "1KiB", "-1", "", "8388607.99T", "9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("ParseSize(%q) = %v, want ErrInvalidArgument", s, err)
			}
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d, want ≥ 0", s, n)
		}
		// What FormatSize prints parses back to at most n, and within
		// a tenth of the unit.
		f := FormatSize(n)
		back, err := ParseSize(f)
		if err != nil {
			t.Fatalf("ParseSize(FormatSize(%d) = %q) = %v", n, f, err)
		}
		if back > n || float64(n-back) > float64(n)/10+1 {
			t.Fatalf("ParseSize(FormatSize(%d) = %q) = %d, want ≤ n and within 10%%", n, f, back)
		}
	})
}
