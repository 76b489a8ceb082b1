package purge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/netns"
	"github.com/dsecproject/dsec/internal/swap"
)

// Run purges the node. It keeps going past errors and returns them joined.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Out, format+"\n", args...) }
	var errs []error
	var rc RunConfig
	if b, err := os.ReadFile(RunConfigPath(cfg.StateDir)); err == nil {
		_ = json.Unmarshal(b, &rc)
	}
	parent := cfg.CgroupParent
	if parent == "" {
		parent = rc.CgroupParent
	}
	if parent == "" {
		parent = "dsec"
	}

	// 1. dsec up, so nothing recreates what we remove: the one recorded,
	// and any dsec process (up, keeper) holding files of the state dir.
	if rc.UpPid > 0 && isDsec(rc.UpPid) {
		say("stopping dsec up (pid %d)", rc.UpPid)
		stopProcess(rc.UpPid, 15*time.Second)
	}
	for _, pid := range dsecUsing(cfg.StateDir) {
		if isKeeper(pid) {
			continue // stopped below, with its sandboxes
		}
		say("stopping dsec (pid %d) that uses %s", pid, cfg.StateDir)
		stopProcess(pid, 15*time.Second)
	}
	// 2. The keeper, with its sandboxes; its mount namespace goes with it.
	kc := keeper.NewClient(cfg.StateDir)
	defer kc.Close()
	if v, err := kc.Version(ctx); err == nil {
		say("stopping the node keeper (pid %d) and its sandboxes", v.Pid)
		if err := kc.Shutdown(ctx, true); err != nil {
			errs = append(errs, fmt.Errorf("keeper shutdown: %w", err))
		}
		waitGone(v.Pid, 15*time.Second)
		if isDsec(v.Pid) {
			stopProcess(v.Pid, 5*time.Second)
		}
	}
	// A keeper that does not answer is stopped all the same; its
	// sandboxes are killed with the cgroups below.
	for _, pid := range dsecUsing(cfg.StateDir) {
		say("stopping dsec (pid %d) that uses %s", pid, cfg.StateDir)
		stopProcess(pid, 5*time.Second)
	}
	// 3. Every process still in a sandbox cgroup, then the cgroups.
	n, err := killCgroupProcs(parent)
	if n > 0 {
		say("killed %d process(es) left in sandbox cgroups", n)
	}
	if err != nil {
		errs = append(errs, err)
	}
	removed, err := removeCgroups(parent)
	if removed > 0 {
		say("removed %d cgroup(s) under %s", removed, parent)
	}
	if err != nil {
		errs = append(errs, err)
	}
	// The sandboxes' router namespace, with every link and the firewall
	// table in it (a table lives and dies with its namespace). It is
	// mounted in the keeper's mount namespace and goes with it; one
	// mounted here (a keeper run in this namespace) is removed here.
	if err := netns.Remove(keeper.Layout{StateDir: cfg.StateDir}.NetworkDir()); err != nil {
		errs = append(errs, fmt.Errorf("remove the network router: %w", err))
	}
	// 4. The swap file of dsec up --swap, once no sandbox's memory is in
	// it; then mounts under the state dir in this namespace, and loop devices
	// backed by its files.
	if rec, err := swap.Disable(cfg.StateDir, nil); err != nil {
		errs = append(errs, fmt.Errorf("turn off the swap file: %w", err))
	} else if rec.Path != "" {
		say("turned off and removed the swap file %s", rec.Path)
	}
	for _, m := range mountsUnder(cfg.StateDir) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err == nil {
			say("unmounted %s", m)
		}
	}
	for _, dev := range loopsBackedBy(cfg.StateDir) {
		if err := detachLoop(dev); err == nil {
			say("detached %s", dev)
		} else {
			errs = append(errs, err)
		}
	}
	// 5. Files.
	if cfg.KeepImages {
		for _, d := range []string{"sandboxes", "run", "edge.db", "disk", "logs"} {
			p := filepath.Join(cfg.StateDir, d)
			if _, err := os.Lstat(p); err == nil {
				if err := os.RemoveAll(p); err != nil {
					errs = append(errs, err)
				}
			}
		}
		say("removed sandbox state from %s (kept images and keys)", cfg.StateDir)
	} else if _, err := os.Lstat(cfg.StateDir); err == nil {
		if err := os.RemoveAll(cfg.StateDir); err != nil {
			errs = append(errs, err)
		} else {
			say("removed %s", cfg.StateDir)
		}
	}
	return errors.Join(errs...)
}

// isDsec reports whether pid runs the platform binary, dsec-node (or the
// dsec of builds before the command line was a binary of its own), not a
// reused pid.
func isDsec(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	switch filepath.Base(strings.Split(string(b), "\x00")[0]) {
	case "dsec-node", "dsec":
		return true
	}
	return false
}

// dsecUsing lists dsec processes with a file open under dir.
func dsecUsing(dir string) []int {
	procs, _ := os.ReadDir("/proc")
	var out []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() || !isDsec(pid) {
			continue
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err == nil && (target == dir || strings.HasPrefix(target, dir+"/")) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

func isKeeper(pid int) bool {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	args := strings.Split(string(b), "\x00")
	return len(args) > 1 && args[1] == "keeper"
}

func stopProcess(pid int, grace time.Duration) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	if !waitGone(pid, grace) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid, 5*time.Second)
	}
}

func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		// A zombie child of ours counts as gone.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i+1:]), " Z") {
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// hierarchies lists the cgroup mount points.
func hierarchies() []string {
	var out []string
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		for i, x := range f {
			if x == "-" && i+1 < len(f) && (f[i+1] == "cgroup" || f[i+1] == "cgroup2") {
				out = append(out, f[4])
			}
		}
	}
	return out
}

// killCgroupProcs kills every process in a group under parent.
func killCgroupProcs(parent string) (int, error) {
	killed := 0
	for _, h := range hierarchies() {
		root := filepath.Join(h, parent)
		_ = filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
			if err != nil || !info.IsDir() {
				return nil
			}
			if _, err := os.Stat(filepath.Join(p, "cgroup.kill")); err == nil && p != root {
				_ = os.WriteFile(filepath.Join(p, "cgroup.kill"), []byte("1"), 0)
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, s := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(s); err == nil && pid > 1 {
					if syscall.Kill(pid, syscall.SIGKILL) == nil {
						killed++
					}
				}
			}
			return nil
		})
	}
	time.Sleep(100 * time.Millisecond)
	return killed, nil
}

// removeCgroups removes parent and every group below it, deepest first.
func removeCgroups(parent string) (int, error) {
	removed := 0
	var errs []error
	for _, h := range hierarchies() {
		root := filepath.Join(h, parent)
		var dirs []string
		_ = filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
			if err == nil && info.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for range 50 {
				if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			switch {
			case err == nil:
				removed++
			case !errors.Is(err, syscall.ENOENT):
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return removed, errors.Join(errs...)
}

func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	// Deepest first.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// loopsBackedBy lists loop devices whose backing file is under dir.
func loopsBackedBy(dir string) []string {
	ents, _ := os.ReadDir("/sys/block")
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err != nil {
			continue
		}
		if f := strings.TrimSpace(string(b)); strings.HasPrefix(f, dir+"/") {
			out = append(out, "/dev/"+e.Name())
		}
	}
	return out
}

func detachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	const loopClrFD = 0x4C01
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), loopClrFD, 0); errno != 0 {
		return fmt.Errorf("detach %s: %w", dev, errno)
	}
	return nil
}
