package ceiling

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestReadHost(t *testing.T) {
	h, err := ReadHost()
	if err != nil {
		t.Fatalf("ReadHost() = %v", err)
	}
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	pidMax, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if h.Tasks <= 0 || h.Tasks > pidMax {
		t.Errorf("ReadHost().Tasks = %d, want 1..pid_max (%d)", h.Tasks, pidMax)
	}
	if h.MemoryBytes < 64<<20 {
		t.Errorf("ReadHost().MemoryBytes = %d, want a host's memory", h.MemoryBytes)
	}
}

func TestDiskSpace(t *testing.T) {
	s, err := DiskSpace(t.TempDir())
	if err != nil {
		t.Fatalf("DiskSpace() = %v", err)
	}
	if s.Size <= 0 || s.Free < 0 || s.Free > s.Size {
		t.Errorf("DiskSpace() = %+v, want 0 <= Free <= Size, Size > 0", s)
	}
	if _, err := DiskSpace("/nonexistent/dsec"); err == nil {
		t.Error("DiskSpace(/nonexistent) = nil error, want one")
	}
}
