package keeper

import (
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reaper is the keeper's only waiter: as a child subreaper the keeper
// inherits sandbox inits and exec'd commands whose parents exit, and it
// reaps every child with wait4(-1). Nothing else in the process may wait for
// children (so no os/exec): processes are started with syscall.ForkExec and
// their ends are delivered here.
type reaper struct {
	sig  chan os.Signal
	done chan struct{}
	wg   sync.WaitGroup

	mu sync.Mutex
	// guarded by mu
	waiters map[int]chan syscall.WaitStatus
	early   map[int]earlyExit // exits of pids nobody watched yet
}

type earlyExit struct {
	ws syscall.WaitStatus
	at time.Time
}

// earlyTTL bounds how long an unwatched exit is kept: long enough for a
// helper to report its child's pid, short enough that strays do not pile up.
const earlyTTL = time.Minute

func newReaper() *reaper {
	r := &reaper{
		sig:     make(chan os.Signal, 1),
		done:    make(chan struct{}),
		waiters: map[int]chan syscall.WaitStatus{},
		early:   map[int]earlyExit{},
	}
	signal.Notify(r.sig, syscall.SIGCHLD)
	r.wg.Add(1)
	go r.loop()
	return r
}

func (r *reaper) loop() {
	defer r.wg.Done()
	tick := time.NewTicker(time.Second) // catches a coalesced SIGCHLD race
	defer tick.Stop()
	for {
		r.reapAll()
		select {
		case <-r.done:
			return
		case <-r.sig:
		case <-tick.C:
		}
	}
}

func (r *reaper) reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG|unix.WALL, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.deliver(pid, ws)
	}
}

func (r *reaper) deliver(pid int, ws syscall.WaitStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.waiters[pid]; ok {
		delete(r.waiters, pid)
		ch <- ws
		return
	}
	now := time.Now()
	for p, e := range r.early {
		if now.Sub(e.at) > earlyTTL {
			delete(r.early, p)
		}
	}
	r.early[pid] = earlyExit{ws: ws, at: now}
}

// watch returns a channel that receives pid's wait status once. Call it
// right after starting pid (or learning of it); an exit reaped before the
// call is delivered too. since is a time before the process was made: an
// exit reaped before it was an older process's of the same pid (pids are
// reused, quickly on a node whose sandboxes fork a lot), never this one's.
func (r *reaper) watch(pid int, since time.Time) <-chan syscall.WaitStatus {
	ch := make(chan syscall.WaitStatus, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.early[pid]; ok {
		delete(r.early, pid)
		if !e.at.Before(since) {
			ch <- e.ws
			return ch
		}
	}
	r.waiters[pid] = ch
	return ch
}

func (r *reaper) close() {
	signal.Stop(r.sig)
	close(r.done)
	r.wg.Wait()
}

// startProcess starts argv[0] with the given files and environment and
// returns its pid and exit channel. The process is not waited for by
// anything else.
//
// The fork happens under r.mu, so the process's exit cannot be delivered
// before its waiter is registered, and an exit already recorded for its
// pid is an older process's.
func (r *reaper) startProcess(argv []string, env []string, files []uintptr, sys *syscall.SysProcAttr, dir string) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Dir: dir, Env: env, Files: files, Sys: sys})
	if err != nil {
		return 0, nil, err
	}
	delete(r.early, pid)
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}
