package cgroup

import (
	"fmt"
	"os"
)

// DetectLayout reads this process's mount table (/proc/self/mountinfo) and
// the cgroup2 root's controllers.
func DetectLayout() (Layout, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return Layout{}, fmt.Errorf("detect cgroup layout: %w", classify(err))
	}
	defer f.Close()
	l, err := ParseMountinfo(f)
	if err != nil {
		return Layout{}, fmt.Errorf("detect cgroup layout: %w", err)
	}
	if err := l.readControllers(); err != nil {
		return Layout{}, fmt.Errorf("detect cgroup layout: %w", err)
	}
	return l, nil
}
