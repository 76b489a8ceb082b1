package ceiling

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ReadHost reads the host's limits: kernel.pid_max, kernel.threads-max and
// MemTotal.
func ReadHost() (Host, error) {
	pidMax, err := readSysctl("/proc/sys/kernel/pid_max")
	if err != nil {
		return Host{}, err
	}
	threadsMax, err := readSysctl("/proc/sys/kernel/threads-max")
	if err != nil {
		return Host{}, err
	}
	mem, err := memTotal()
	if err != nil {
		return Host{}, err
	}
	return Host{Tasks: min(pidMax, threadsMax), MemoryBytes: mem}, nil
}

func readSysctl(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("read host limit: %w", err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("read host limit %s: %q is not a positive number", file, b)
	}
	return v, nil
}

// memTotal reads MemTotal from /proc/meminfo, in bytes.
func memTotal() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read host memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil || kb <= 0 {
			return 0, fmt.Errorf("read host memory: MemTotal %q is not a size in kB", rest)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read host memory: %w", err)
	}
	return 0, fmt.Errorf("read host memory: /proc/meminfo has no MemTotal")
}

// DiskSpace measures the file system that holds path.
func DiskSpace(path string) (Space, error) {
	var st unix.Statfs_t
	for {
		err := unix.Statfs(path, &st)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return Space{}, fmt.Errorf("measure the file system of %s: %w", path, err)
		}
		break
	}
	bs := int64(st.Bsize)
	return Space{Free: int64(st.Bavail) * bs, Size: int64(st.Blocks) * bs}, nil
}
