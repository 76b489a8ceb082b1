//go:build dsec_crashhook

package container

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// crashIDs is the id range of the crash test's sandboxes: its own, so that
// processes left with its ids are its sandboxes', and few, so that a range
// a crash leaks makes the last creates fail.
var crashIDs = rootfs.IDMap{HostID: 3_000_000_000, Size: 65536}

const crashRanges = 3

// TestKeeperCrashLeavesNothing kills the keeper (SIGKILL, through the
// crash points of a -tags dsec_crashhook build) at the end of each step of
// a create and of a delete. A new keeper adopts what is left, the edge's
// retry of the delete finds it, and then nothing of the sandbox is left:
// no process, mount, cgroup, directory, runtime state, disk or id range.
//
// Run it with a dsec binary built with the tag:
//
//	go build -tags netgo,osusergo,dsec_crashhook -ldflags '-linkmode external -extldflags -static' -o /tmp/dsec-crash ./cmd/dsec
//	DSEC_BIN=/tmp/dsec-crash go test -tags dsec_crashhook -run TestKeeperCrash ./internal/edge/backend/container/
func TestKeeperCrashLeavesNothing(t *testing.T) {
	n := newNode(t)
	open := func(t *testing.T) *Backend {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b, err := New(ctx, Config{
			StateDir: n.stateDir, Self: n.self, CgroupParent: n.cgroupParent, WarmPool: -1,
			IDMap: crashIDs, UIDRanges: crashRanges,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatalf("New = %v\nkeeper log:\n%s", err, keeperLog(n))
		}
		return b
	}
	spec := func(id string) sandbox.Spec {
		return sandbox.Spec{ID: id, Layers: n.layers, Resources: sandbox.Resources{MemoryBytes: 64 << 20, CPUs: 1, Pids: 64, DiskBytes: 64 << 20}}
	}
	stopKeeper := func(t *testing.T) {
		t.Helper()
		c := keeper.NewClient(n.stateDir)
		defer c.Close()
		ctx := context.Background()
		if v, err := c.Version(ctx); err == nil {
			if err := c.Shutdown(ctx, false); err != nil {
				t.Fatalf("keeper shutdown = %v", err)
			}
			waitGone(t, v.Pid)
		}
	}
	// Processes of the dead keeper that ended (killed by the new one, or
	// helpers that lost their parent) are zombies of the host's init
	// until it reaps them: not the keeper's to reap, but they must go.
	zombies := map[int]string{}
	defer func() {
		deadline := time.Now().Add(30 * time.Second)
		for len(zombies) > 0 && time.Now().Before(deadline) {
			for pid := range zombies {
				if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || !strings.Contains(string(st), ") Z ") {
					delete(zombies, pid)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		for pid, point := range zombies {
			t.Errorf("process %d of the keeper killed at %s is a zombie the host's init did not reap in 30s", pid, point)
		}
	}()
	for i, point := range keeper.CrashPoints {
		t.Run(point, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			id := fmt.Sprintf("crash-%d", i)
			stopKeeper(t)
			t.Setenv(keeper.CrashEnv, "keeper:"+point)
			b := open(t)
			v, err := b.Keeper().Version(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(point, "create:") {
				if _, err := b.Create(ctx, spec(id)); err == nil {
					t.Fatalf("Create passed crash point keeper:%s: is DSEC_BIN built with -tags dsec_crashhook?", point)
				}
			} else {
				if _, err := b.Create(ctx, spec(id)); err != nil {
					t.Fatalf("Create = %v", err)
				}
				if err := b.Delete(ctx, id); err == nil {
					t.Fatalf("Delete passed crash point keeper:%s: is DSEC_BIN built with -tags dsec_crashhook?", point)
				}
			}
			b.Close()
			waitGone(t, v.Pid)
			if log := keeperLog(n); !strings.Contains(log, "crash point keeper:"+point) {
				t.Fatalf("the keeper did not die at keeper:%s; its log:\n%s", point, log)
			}
			os.Unsetenv(keeper.CrashEnv)
			stopKeeper(t) // one the first backend's watcher may have started meanwhile
			b2 := open(t)
			defer b2.Close()
			// What the edge does after a create or delete that failed:
			// delete (again).
			if err := b2.Delete(ctx, id); err != nil {
				t.Errorf("Delete after the crash = %v", err)
			}
			// Processes are checked by their ids, below: footprint's
			// count zombies too.
			var fp []string
			for _, f := range n.footprint(t, b2) {
				if f != "process in a sandbox cgroup" {
					fp = append(fp, f)
				}
			}
			live, dead := idProcs(t)
			for _, z := range dead {
				zombies[z] = point
			}
			if fp = append(fp, live...); len(fp) > 0 {
				t.Errorf("left after a crash at keeper:%s and a delete:\n%s", point, strings.Join(fp, "\n"))
			}
			if _, err := os.Stat(n.stateDir + "/sandboxes/" + id); err == nil {
				t.Errorf("the sandbox's directory is left")
			}
		})
	}
	// Every id range is free again: as many sandboxes as there are ranges
	// start.
	b := open(t)
	defer b.Close()
	ctx := context.Background()
	for i := range crashRanges {
		id := fmt.Sprintf("after-%d", i)
		if _, err := b.Create(ctx, spec(id)); err != nil {
			t.Errorf("Create(%s) after the crashes = %v: an id range (or more) leaked", id, err)
			continue
		}
		defer func() {
			if err := b.Delete(ctx, id); err != nil {
				t.Errorf("Delete(%s) = %v", id, err)
			}
		}()
	}
}

func keeperLog(n *node) string {
	b, _ := os.ReadFile(filepath.Join(n.stateDir, "logs", "keeper.log"))
	return string(b)
}

// idProcs lists processes with a host uid of the crash test's range (user
// namespace helpers, inits, execs): those alive, and the pids of zombies.
func idProcs(t *testing.T) (live []string, zombies []int) {
	t.Helper()
	lo, hi := uint64(crashIDs.HostID), uint64(crashIDs.HostID)+uint64(crashIDs.Size)*crashRanges
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		f, err := os.Open(filepath.Join("/proc", p.Name(), "status"))
		if err != nil {
			continue
		}
		var state, ppid string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 {
				continue
			}
			switch fields[0] {
			case "State:":
				state = fields[1]
			case "PPid:":
				ppid = fields[1]
			case "Uid:":
				uid, err := strconv.ParseUint(fields[1], 10, 32)
				if err != nil || uid < lo || uid >= hi {
					break
				}
				if state == "Z" {
					pid, _ := strconv.Atoi(p.Name())
					zombies = append(zombies, pid)
					break
				}
				cmd, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
				live = append(live, fmt.Sprintf("process %s (uid %d, state %s, parent %s): %q", p.Name(), uid, state, ppid, strings.ReplaceAll(string(cmd), "\x00", " ")))
			}
		}
		f.Close()
	}
	return live, zombies
}
