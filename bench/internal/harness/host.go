//go:build linux

package harness

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ClockTick is the unit of the CPU times in /proc (USER_HZ), which Linux
// fixes at 100 per second on every architecture it exposes to user space.
const ClockTick = 10 * time.Millisecond

// MemAvailable returns the kernel's estimate of the memory available for
// new work without swapping (MemAvailable in /proc/meminfo), in bytes.
func MemAvailable() (int64, error) {
	return meminfo("MemAvailable")
}

// MemTotal returns the host's memory (MemTotal in /proc/meminfo), in bytes.
func MemTotal() (int64, error) {
	return meminfo("MemTotal")
}

func meminfo(key string) (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read meminfo: %w", err)
	}
	return parseMeminfo(b, key)
}

// parseMeminfo returns the value of key ("MemAvailable:  123 kB") in bytes.
func parseMeminfo(b []byte, key string) (int64, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || name != key {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("meminfo %s: %w", key, err)
		}
		if len(f) > 1 && f[1] == "kB" {
			v <<= 10
		}
		return v, nil
	}
	return 0, fmt.Errorf("meminfo: no %s", key)
}

// CPUTimes are the host's CPU times summed over every CPU (the first line
// of /proc/stat), in clock ticks.
type CPUTimes struct {
	// Busy is every state but idle and iowait; Total includes them.
	Busy, Total uint64
}

// Sub returns the times spent between o and t (t later).
func (t CPUTimes) Sub(o CPUTimes) CPUTimes {
	return CPUTimes{Busy: t.Busy - o.Busy, Total: t.Total - o.Total}
}

// BusyTime is Busy as a duration.
func (t CPUTimes) BusyTime() time.Duration { return time.Duration(t.Busy) * ClockTick }

// ReadCPUTimes reads the host's CPU times.
func ReadCPUTimes() (CPUTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPUTimes{}, fmt.Errorf("read /proc/stat: %w", err)
	}
	return parseCPUTimes(b)
}

// parseCPUTimes parses the "cpu  user nice system idle iowait irq softirq
// steal guest guest_nice" line; guest time is already counted in user.
func parseCPUTimes(b []byte) (CPUTimes, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return CPUTimes{}, fmt.Errorf("/proc/stat: no cpu line")
	}
	var t CPUTimes
	for i, s := range f[1:min(len(f), 9)] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return CPUTimes{}, fmt.Errorf("/proc/stat: field %d: %w", i+1, err)
		}
		t.Total += v
		if i != 3 && i != 4 { // idle, iowait
			t.Busy += v
		}
	}
	return t, nil
}

// Proc is what the benchmarks read of one process.
type Proc struct {
	Pid, PPid int
	// State is the one-letter state ("R", "S", "Z" …).
	State string
	// CPU is its user and system time plus that of the children it has
	// waited for.
	CPU time.Duration
	// RSS is its resident memory in bytes; Threads its thread count.
	RSS     int64
	Threads int
}

// ReadProc reads /proc/<pid>/stat.
func ReadProc(pid int) (Proc, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Proc{}, fmt.Errorf("process %d: %w", pid, err)
	}
	return parseProcStat(b)
}

// parseProcStat parses /proc/<pid>/stat; the command name, in parentheses,
// may hold spaces and parentheses itself, so fields count from the last ')'.
func parseProcStat(b []byte) (Proc, error) {
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return Proc{}, fmt.Errorf("proc stat: no command name")
	}
	pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
	if err != nil {
		return Proc{}, fmt.Errorf("proc stat: pid: %w", err)
	}
	// f[0] is field 3 (state).
	f := strings.Fields(s[end+1:])
	if len(f) < 22 {
		return Proc{}, fmt.Errorf("proc stat: %d fields after the name, want at least 22", len(f))
	}
	num := func(i int) (int64, error) {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("proc stat: field %d: %w", i+3, err)
		}
		return v, nil
	}
	p := Proc{Pid: pid, State: f[0]}
	var vals [7]int64
	// ppid (4), utime (14), stime (15), cutime (16), cstime (17),
	// num_threads (20), rss in pages (24).
	for j, field := range []int{4, 14, 15, 16, 17, 20, 24} {
		if vals[j], err = num(field - 3); err != nil {
			return Proc{}, err
		}
	}
	p.PPid = int(vals[0])
	p.CPU = time.Duration(vals[1]+vals[2]+vals[3]+vals[4]) * ClockTick
	p.Threads = int(vals[5])
	p.RSS = vals[6] * int64(os.Getpagesize())
	return p, nil
}

// Procs reads every process of the host; processes that end meanwhile are
// left out.
func Procs() []Proc {
	ents, _ := os.ReadDir("/proc")
	out := make([]Proc, 0, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := ReadProc(pid); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// TreeCPU returns the CPU time of the processes rooted at roots (them and
// every descendant alive), each counted with the children it has reaped.
func TreeCPU(roots ...int) time.Duration {
	return treeCPU(Procs(), roots)
}

func treeCPU(procs []Proc, roots []int) time.Duration {
	children := map[int][]int{}
	byPid := map[int]Proc{}
	for _, p := range procs {
		children[p.PPid] = append(children[p.PPid], p.Pid)
		byPid[p.Pid] = p
	}
	var total time.Duration
	seen := map[int]bool{}
	stack := append([]int(nil), roots...)
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[pid] || pid <= 0 {
			continue
		}
		seen[pid] = true
		if p, ok := byPid[pid]; ok {
			total += p.CPU
		}
		stack = append(stack, children[pid]...)
	}
	return total
}

// OpenFDs counts the open file descriptors of a process.
func OpenFDs(pid int) (int, error) {
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return 0, fmt.Errorf("process %d fds: %w", pid, err)
	}
	return len(ents), nil
}

// NofileLimit returns a process's soft limit of open files ("Max open
// files" in /proc/<pid>/limits).
func NofileLimit(pid int) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "limits"))
	if err != nil {
		return 0, fmt.Errorf("process %d limits: %w", pid, err)
	}
	return parseNofile(b)
}

func parseNofile(b []byte) (int64, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Max open files")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		if f[0] == "unlimited" {
			return -1, nil
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, fmt.Errorf("limits: no Max open files")
}
