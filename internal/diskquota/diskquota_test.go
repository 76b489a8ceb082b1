package diskquota

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestValidName(t *testing.T) {
	long := strings.Repeat("a", 129)
	tests := []struct {
		name string
		want bool
	}{
		{"a", true},
		{"vm-n74r46ur5aem", true},
		{"0.box_1", true},
		{long[:128], true},
		{"", false},
		{long, false},
		{".", false},
		{"..", false},
		{".ids", false},
		{".trash", false},
		{".images", false},
		{"-a", false},
		{"_a", false},
		{"lost+found", false},
		{"a/b", false},
		{"A", false},
		{"a b", false},
	}
	for _, tt := range tests {
		if got := ValidName(tt.name); got != tt.want {
			t.Errorf("ValidName(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestLimits(t *testing.T) {
	tests := []struct {
		bytes, inodes         int64
		wantBytes, wantInodes int64
		wantErr               error
	}{
		{0, 0, DefaultLimitBytes, DefaultLimitBytes / DefaultBytesPerInode, nil},
		{20 << 20, 0, 20 << 20, 20 << 20 / DefaultBytesPerInode, nil},
		{20 << 20, 100, 20 << 20, 100, nil},
		{MinLimitBytes, 0, MinLimitBytes, MinLimitBytes / DefaultBytesPerInode, nil},
		{MinLimitBytes - 1, 0, 0, 0, errdefs.ErrInvalidArgument},
		{-1, 0, 0, 0, errdefs.ErrInvalidArgument},
		{20 << 20, MinLimitInodes - 1, 0, 0, errdefs.ErrInvalidArgument},
		{20 << 20, -5, 0, 0, errdefs.ErrInvalidArgument},
		{20 << 20, 1 << 32, 0, 0, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		b, i, err := limits(tt.bytes, tt.inodes)
		if !errors.Is(err, tt.wantErr) || err == nil && tt.wantErr != nil {
			t.Errorf("limits(%d, %d) error = %v, want %v", tt.bytes, tt.inodes, err, tt.wantErr)
			continue
		}
		if err == nil && (b != tt.wantBytes || i != tt.wantInodes) {
			t.Errorf("limits(%d, %d) = %d, %d, want %d, %d", tt.bytes, tt.inodes, b, i, tt.wantBytes, tt.wantInodes)
		}
	}
}

func TestCheckConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr error
	}{
		{"zero", Config{}, errdefs.ErrInvalidArgument},
		{"mount point only", Config{MountPoint: "q"}, nil},
		{"project", Config{Mode: ModeProject, Image: "i", MountPoint: "q", Size: 1 << 30}, nil},
		{"unknown mode", Config{Mode: "zfs", MountPoint: "q"}, errdefs.ErrInvalidArgument},
		{"small", Config{MountPoint: "q", Size: 1 << 20}, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		got, err := checkConfig(tt.cfg)
		if !errors.Is(err, tt.wantErr) || err == nil && tt.wantErr != nil {
			t.Errorf("%s: checkConfig(%+v) error = %v, want %v", tt.name, tt.cfg, err, tt.wantErr)
		}
		if err == nil && got.Logger == nil {
			t.Errorf("%s: checkConfig(%+v).Logger = nil, want the default logger", tt.name, tt.cfg)
		}
	}
}
