package main

import (
	"testing"
	"time"
)

func TestParseDays(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"30d", 30 * 24 * time.Hour, true},
		{"7d", 7 * 24 * time.Hour, true},
		{"1d12h", 36 * time.Hour, true},
		{"12h", 12 * time.Hour, true},
		{"90m", 90 * time.Minute, true},
		{"2s", 2 * time.Second, true},
		{"", 0, true},
		{"d", 0, false},
		{"-1d", 0, false},
		{"1dx", 0, false},
		{"-5h", 0, false},
		{"30days", 0, false},
	} {
		got, err := parseDays(tt.in)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("parseDays(%q) = %v, %v, want %v (ok %v)", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestFormatDays(t *testing.T) {
	for d, want := range map[time.Duration]string{
		7 * 24 * time.Hour:    "7d",
		36 * time.Hour:        "1d12h0m0s",
		10 * time.Minute:      "10m0s",
		3650 * 24 * time.Hour: "3650d",
	} {
		if got := formatDays(d); got != want {
			t.Errorf("formatDays(%v) = %q, want %q", d, got, want)
		}
	}
}
