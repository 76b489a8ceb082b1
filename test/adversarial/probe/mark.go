package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// markCmd tries to set the attribute NAME on every cgroup directory the
// sandbox can reach: under /sys/fs/cgroup and under cgroup file systems
// it mounts itself (cgroup2, and each v1 hierarchy named in ARGS). It
// reports each mount ("mount:TYPE") and one line per directory where the
// attribute was set ("set:DIR ok"), then "tried N".
func markCmd(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("usage: probe mark ATTR [V1CONTROLLER...]")
	}
	attr := args[0]
	roots := []string{"/sys/fs/cgroup"}
	mnt := func(fstype, opts string) {
		dir, err := os.MkdirTemp("", "cg")
		if err != nil {
			report("mount:"+fstype+opts, err)
			return
		}
		err = unix.Mount("none", dir, fstype, 0, opts)
		report("mount:"+fstype+opts, err)
		if err == nil {
			roots = append(roots, dir)
		}
	}
	mnt("cgroup2", "")
	for _, c := range args[1:] {
		mnt("cgroup", c)
	}
	tried := 0
	for _, root := range roots {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			tried++
			if unix.Setxattr(p, attr, []byte("1"), 0) == nil {
				report("set:"+p, nil)
			}
			return nil
		})
	}
	fmt.Println("tried", tried)
	return nil
}
