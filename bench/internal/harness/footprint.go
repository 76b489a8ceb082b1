//go:build linux

package harness

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Footprint is what sandboxes hold on the host, counted so that a
// benchmark can tell that deleting them gave everything back.
type Footprint struct {
	// Cgroups below the sandboxes' cgroup parent, over every hierarchy,
	// and the processes in them.
	Cgroups         int `json:"cgroups"`
	CgroupProcesses int `json:"cgroup_processes"`
	HostMounts      int `json:"host_mounts"`   // in the host's mount namespace, under the state dir
	KeeperMounts    int `json:"keeper_mounts"` // in the keeper's mount namespace, under the state dir
	LoopDevices     int `json:"loop_devices"`  // bound loop devices of the host
	// StateLoopDevices are those bound to files under the state dir.
	StateLoopDevices int `json:"state_loop_devices"`
	Processes        int `json:"processes"`      // every process of the host
	SandboxDirs      int `json:"sandbox_dirs"`   // entries of <state>/sandboxes
	KeeperFDs        int `json:"keeper_fds"`     // the keeper's open files
	KeeperThreads    int `json:"keeper_threads"` // and its threads
	UpFDs            int `json:"up_fds"`         // dsec up's open files
	UpThreads        int `json:"up_threads"`     // and its threads
}

// TakeFootprint counts what sandboxes of a dsec hold; keeperPid and upPid
// may be 0 when they do not run.
func TakeFootprint(cgroupParent, stateDir string, keeperPid, upPid int) Footprint {
	f := Footprint{
		Cgroups:         CountCgroups(cgroupParent),
		CgroupProcesses: len(CgroupProcs(cgroupParent)),
		HostMounts:      mountsUnder("self", stateDir),
	}
	f.LoopDevices, f.StateLoopDevices = loopDevices(stateDir)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			f.Processes++
		}
	}
	sb, _ := os.ReadDir(filepath.Join(stateDir, "sandboxes"))
	f.SandboxDirs = len(sb)
	if keeperPid > 0 {
		f.KeeperMounts = mountsUnder(strconv.Itoa(keeperPid), stateDir)
		f.KeeperFDs, _ = OpenFDs(keeperPid)
		if p, err := ReadProc(keeperPid); err == nil {
			f.KeeperThreads = p.Threads
		}
	}
	if upPid > 0 {
		f.UpFDs, _ = OpenFDs(upPid)
		if p, err := ReadProc(upPid); err == nil {
			f.UpThreads = p.Threads
		}
	}
	return f
}

// mountsUnder counts the mounts of a process's namespace below dir.
func mountsUnder(pid, dir string) int {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "mountinfo"))
	if err != nil {
		return 0
	}
	n := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			n++
		}
	}
	return n
}

// loopDevices counts the host's loop devices that are bound to a file, and
// those whose file is under dir.
func loopDevices(dir string) (all, under int) {
	m, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range m {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		all++
		if strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			under++
		}
	}
	return all, under
}
