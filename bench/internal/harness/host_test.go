//go:build linux

package harness

import (
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseMeminfo(t *testing.T) {
	in := []byte("MemTotal:       24608808 kB\nMemFree:        17000000 kB\nMemAvailable:   23000000 kB\nHugePages_Total:       0\n")
	tests := []struct {
		key     string
		want    int64
		wantErr bool
	}{
		{"MemTotal", 24608808 << 10, false},
		{"MemAvailable", 23000000 << 10, false},
		{"HugePages_Total", 0, false},
		{"Mem", 0, true},
		{"SwapTotal", 0, true},
	}
	for _, tt := range tests {
		got, err := parseMeminfo(in, tt.key)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("parseMeminfo(%q) = %d, %v, want %d, error %v", tt.key, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseCPUTimes(t *testing.T) {
	tests := []struct {
		in      string
		want    CPUTimes
		wantErr bool
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"cpu  10 1 5 100 7 2 3 4 9 9\ncpu0 1 1 1 1 1 1 1 1 1 1\n", CPUTimes{Busy: 10 + 1 + 5 + 2 + 3 + 4, Total: 132}, false},
		{"cpu  10 1 5 100\n", CPUTimes{Busy: 16, Total: 116}, false},
		{"cpu0 1 2 3 4 5\n", CPUTimes{}, true},
		{"cpu  1 x 3 4 5\n", CPUTimes{}, true},
		{"", CPUTimes{}, true},
	}
	for _, tt := range tests {
		got, err := parseCPUTimes([]byte(tt.in))
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("parseCPUTimes(%q) = %+v, %v, want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	// Fields 3 … 24 after the name; utime 14, stime 15, cutime 16,
	// cstime 17, num_threads 20, rss 24.
	rest := " S 1 42 42 0 -1 4194560 100 0 0 0 30 20 5 5 20 0 7 0 1000 123456 50"
	page := int64(os.Getpagesize())
	tests := []struct {
		in      string
		want    Proc
		wantErr bool
	}{
		{"1234 (dockerd)" + rest, Proc{Pid: 1234, PPid: 1, State: "S", CPU: 60 * ClockTick, Threads: 7, RSS: 50 * page}, false},
		{"99 (a) (b) c)" + rest, Proc{Pid: 99, PPid: 1, State: "S", CPU: 60 * ClockTick, Threads: 7, RSS: 50 * page}, false},
		{"99 a" + rest, Proc{}, true},
		{"99 (a) S 1 2", Proc{}, true},
		{"x (a)" + rest, Proc{}, true},
	}
	for _, tt := range tests {
		got, err := parseProcStat([]byte(tt.in))
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("parseProcStat(%q) = %+v, %v, want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte("1234 (dockerd) S 1 42 42 0 -1 4194560 100 0 0 0 30 20 5 5 20 0 7 0 1000 123456 50"))
	f.Add([]byte("1 ()) ("))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseProcStat(b)
		if err == nil && p.Pid == 0 && p.State == "" {
			t.Errorf("parseProcStat(%q) = %+v with no error and no state", b, p)
		}
	})
}

func TestParseNofile(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"Limit                     Soft Limit           Hard Limit           Units\nMax open files            20000                20000                files\n", 20000, false},
		{"Max open files            unlimited            unlimited            files\n", -1, false},
		{"Max processes 10 10 processes\n", 0, true},
	}
	for _, tt := range tests {
		got, err := parseNofile([]byte(tt.in))
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("parseNofile(%q) = %d, %v, want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestTreeCPU(t *testing.T) {
	s := time.Second
	procs := []Proc{
		{Pid: 1, PPid: 0, CPU: 100 * s},
		{Pid: 10, PPid: 1, CPU: 1 * s}, // a root
		{Pid: 11, PPid: 10, CPU: 2 * s},
		{Pid: 12, PPid: 11, CPU: 4 * s},
		{Pid: 20, PPid: 1, CPU: 8 * s}, // another root
		{Pid: 30, PPid: 1, CPU: 16 * s},
	}
	tests := []struct {
		roots []int
		want  time.Duration
	}{
		{[]int{10}, 7 * s},
		{[]int{10, 20}, 15 * s},
		{[]int{11, 10}, 7 * s}, // counted once
		{[]int{99}, 0},
		{[]int{0}, 0},
		{nil, 0},
	}
	for _, tt := range tests {
		if got := treeCPU(procs, tt.roots); got != tt.want {
			t.Errorf("treeCPU(%v) = %v, want %v", tt.roots, got, tt.want)
		}
	}
}

func TestReadSelf(t *testing.T) {
	p, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatalf("ReadProc(self) = %v", err)
	}
	if diff := cmp.Diff([]int{os.Getpid(), os.Getppid()}, []int{p.Pid, p.PPid}); diff != "" || p.Threads < 1 || p.RSS <= 0 {
		t.Errorf("ReadProc(self) = %+v, want our pid and parent, threads and RSS (%s)", p, diff)
	}
	if n, err := OpenFDs(os.Getpid()); err != nil || n < 3 {
		t.Errorf("OpenFDs(self) = %d, %v, want at least 3", n, err)
	}
	if v, err := MemAvailable(); err != nil || v <= 0 {
		t.Errorf("MemAvailable() = %d, %v, want > 0", v, err)
	}
	if c, err := ReadCPUTimes(); err != nil || c.Total == 0 || c.Busy > c.Total {
		t.Errorf("ReadCPUTimes() = %+v, %v, want busy ≤ total, total > 0", c, err)
	}
}
