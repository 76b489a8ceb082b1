package doctor

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// parseKernelRelease reads the major and minor version of a kernel release
// as uname(2) gives it ("6.18.44-fc-v782", "6.12-rc1").
func parseKernelRelease(s string) (major, minor int, ok bool) {
	majorText, rest, found := strings.Cut(s, ".")
	if !found {
		return 0, 0, false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if len(majorText) > 6 || n == 0 || n > 6 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(majorText)
	minor, err2 := strconv.Atoi(rest[:n])
	if err1 != nil || err2 != nil || major < 0 || strings.HasPrefix(majorText, "+") {
		return 0, 0, false
	}
	return major, minor, true
}

// parseFilesystems reads /proc/filesystems ("nodev\tproc", "\text4").
func parseFilesystems(b []byte) map[string]bool {
	fs := map[string]bool{}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 {
			fs[f[len(f)-1]] = true
		}
	}
	return fs
}

// subIDRange is one line of /etc/subuid or /etc/subgid.
type subIDRange struct {
	Owner        string
	Start, Count uint64
}

func (r subIDRange) String() string { return fmt.Sprintf("%s:%d:%d", r.Owner, r.Start, r.Count) }

// parseSubIDs reads /etc/subuid or /etc/subgid ("owner:start:count" per
// line). Blank lines, comments and malformed lines are skipped, as
// shadow's tools skip them.
func parseSubIDs(b []byte) []subIDRange {
	var rs []subIDRange
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) != 3 || f[0] == "" {
			continue
		}
		start, err1 := strconv.ParseUint(f[1], 10, 32)
		count, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil || count == 0 {
			continue
		}
		rs = append(rs, subIDRange{Owner: f[0], Start: start, Count: count})
	}
	return rs
}

// overlapping returns the ranges of rs that share an id with
// [base, base+count).
func overlapping(base, count uint64, rs []subIDRange) []subIDRange {
	var out []subIDRange
	for _, r := range rs {
		if r.Start < base+count && base < r.Start+r.Count {
			out = append(out, r)
		}
	}
	return out
}

// freeBase returns the lowest base at or above base, aligned to count
// (rounded up to 65536), whose range [b, b+count) meets none of rs and fits
// in 32-bit ids; ok is false when there is none.
func freeBase(base, count uint64, rs []subIDRange) (b uint64, ok bool) {
	const align = 65536
	step := (count + align - 1) / align * align
	if step == 0 {
		return 0, false
	}
	b = (base + step - 1) / step * step
	for b+count <= 1<<32-1 {
		o := overlapping(b, count, rs)
		if len(o) == 0 {
			return b, true
		}
		end := uint64(0)
		for _, r := range o {
			end = max(end, r.Start+r.Count)
		}
		b = (end + step - 1) / step * step
	}
	return 0, false
}

// parseMeminfo reads /proc/meminfo into bytes per key ("MemTotal").
func parseMeminfo(b []byte) map[string]uint64 {
	m := map[string]uint64{}
	for line := range strings.SplitSeq(string(b), "\n") {
		key, rest, found := strings.Cut(line, ":")
		if !found {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			if v > (1<<64-1)/1024 {
				continue
			}
			v *= 1024
		}
		m[strings.TrimSpace(key)] = v
	}
	return m
}

// parseRuntimeVersion picks the version out of `crun --version` or
// `runc --version` ("crun version 1.8.1\ncommit: …" → "1.8.1").
func parseRuntimeVersion(out []byte) string {
	first, _, _ := strings.Cut(string(out), "\n")
	f := strings.Fields(first)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "version" {
			return f[i+1]
		}
	}
	return strings.TrimSpace(first)
}

// formatBytes writes n in binary units ("23.5 GiB").
func formatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 5 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[i])
}
