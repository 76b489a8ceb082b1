//go:build linux

package harness

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupRoot is where the host mounts its cgroup hierarchies.
const cgroupRoot = "/sys/fs/cgroup"

// hierarchies returns the root of every cgroup hierarchy: the one mount of
// a cgroup2-only host, or each controller's (and the unified) directory of
// a v1 or hybrid host.
func hierarchies() []string {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		return []string{cgroupRoot}
	}
	ents, _ := os.ReadDir(cgroupRoot)
	var out []string
	for _, e := range ents {
		// Controllers mounted together appear once as a directory and
		// again as symbolic links ("cpu -> cpu,cpuacct"): skip the links.
		if e.IsDir() {
			out = append(out, filepath.Join(cgroupRoot, e.Name()))
		}
	}
	return out
}

// cgroupDirs returns every cgroup below name (and name itself when self)
// in every hierarchy, deepest first.
func cgroupDirs(name string, self bool) []string {
	var out []string
	for _, h := range hierarchies() {
		base := filepath.Join(h, name)
		_ = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == base {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() && (self || p != base) {
				out = append(out, p)
			}
			return nil
		})
	}
	slices.SortStableFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return out
}

// CountCgroups returns how many cgroups exist below the cgroup name (a path
// relative to each hierarchy's root), summed over the hierarchies.
func CountCgroups(name string) int { return len(cgroupDirs(name, false)) }

// CgroupProcs returns the processes in the cgroup name or below it, in any
// hierarchy.
func CgroupProcs(name string) []int {
	seen := map[int]bool{}
	var out []int
	for _, d := range cgroupDirs(name, true) {
		f, err := os.Open(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if pid, err := strconv.Atoi(sc.Text()); err == nil && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
		f.Close()
	}
	slices.Sort(out)
	return out
}

// RemoveCgroupTree kills whatever still runs in the cgroup name (relative
// to each hierarchy's root) and removes it and every cgroup below it, in
// every hierarchy. A cgroup that does not exist is not an error.
func RemoveCgroupTree(name string) error {
	if name == "" || strings.Contains(name, "..") {
		return fmt.Errorf("remove cgroup %q: not a cgroup under the root", name)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := CgroupProcs(name)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		var errs []error
		for _, d := range cgroupDirs(name, true) {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", name, errors.Join(errs...))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
