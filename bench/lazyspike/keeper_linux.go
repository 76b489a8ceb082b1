package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The parent process plays the keeper: it opens /dev/fuse, mounts the FUSE
// file system, starts server children with the descriptor, may hold its own
// copy (so that a server's death does not end the connection), and mounts
// EROFS on top. Everything it creates is registered in a cleanup stack run
// in reverse on every path (normal end, error, panic, SIGINT/SIGTERM).

type cleanups struct {
	mu sync.Mutex
	// guarded by mu
	fns []func()
}

func (c *cleanups) push(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, f)
}

// run runs and forgets every cleanup, newest first; it is idempotent.
func (c *cleanups) run() {
	c.mu.Lock()
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// keeper owns the spike's mounts and children.
type keeper struct {
	self    string // this program, for children
	dir     string // work directory
	fusectl string // where fusectl is mounted (by us), "" if unavailable
	clean   *cleanups
	seq     int
}

func newKeeper(dir string, clean *cleanups) (*keeper, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	k := &keeper{self: self, dir: dir, clean: clean}
	// fusectl is a single superblock; mounting it again under our own
	// directory gives the abort files without touching the host's
	// /sys/fs/fuse/connections.
	ctl := filepath.Join(dir, "fusectl")
	if err := os.MkdirAll(ctl, 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mount("fusectl", ctl, "fusectl", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err == nil {
		k.fusectl = ctl
		clean.push(func() { _ = unix.Unmount(ctl, unix.MNT_DETACH) })
	}
	return k, nil
}

func (k *keeper) mkdir(prefix string) (string, error) {
	k.seq++
	d := filepath.Join(k.dir, fmt.Sprintf("%s%d", prefix, k.seq))
	return d, os.MkdirAll(d, 0o700)
}

// server is a running server child.
type server struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string
	initHex string
	exited  chan struct{}
}

func (s *server) send(cmd string) { _, _ = io.WriteString(s.stdin, cmd+"\n") }

// expect waits for a line with the prefix and returns the rest.
func (s *server) expect(prefix string, d time.Duration) (string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				return "", fmt.Errorf("server exited waiting for %q", prefix)
			}
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return strings.TrimSpace(rest), nil
			}
		case <-t.C:
			return "", fmt.Errorf("no %q from server in %v", prefix, d)
		}
	}
}

func (s *server) kill() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGKILL) // our own child, by pid
	}
	<-s.exited
}

// fuseMount is one mounted FUSE connection.
type fuseMount struct {
	k    *keeper
	dir  string
	file string // the blob's path in the mount
	dev  *os.File
	conn uint32 // fusectl connection number (the mount's device minor)
	srv  *server
}

// mountFUSE opens /dev/fuse, mounts it at a new directory and starts a
// server child with the descriptor. With hold the keeper keeps its copy of
// the descriptor (the connection outlives the server); without, it closes
// it once the child has it.
func (k *keeper) mountFUSE(cfg serverConfig, hold bool) (*fuseMount, error) {
	dir, err := k.mkdir("fuse")
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/fuse: %w", err)
	}
	m := &fuseMount{k: k, dir: dir, file: filepath.Join(dir, fileName), dev: os.NewFile(uintptr(fd), "/dev/fuse")}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,max_read=%d", fd, 1<<20)
	if err := unix.Mount("lazyspike", dir, "fuse.lazyspike", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_RDONLY, opts); err != nil {
		m.dev.Close()
		return nil, fmt.Errorf("mount fuse: %w", err)
	}
	k.clean.push(m.destroy)
	// The mount's device number, read without asking the server.
	if m.conn, err = mountMinor(dir); err != nil {
		return nil, err
	}
	if m.srv, err = k.startServer(m.dev, cfg); err != nil {
		return nil, err
	}
	if m.srv.initHex, err = m.srv.expect("init ", 10*time.Second); err != nil {
		return nil, err
	}
	if !hold {
		m.dev.Close()
		m.dev = nil
	}
	return m, nil
}

// mountMinor finds the device minor of the mount at dir in
// /proc/self/mountinfo (stat would ask the server).
func mountMinor(dir string) (uint32, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && f[4] == dir {
			_, minor, ok := strings.Cut(f[2], ":")
			if !ok {
				break
			}
			n, err := strconv.ParseUint(minor, 10, 32)
			return uint32(n), err
		}
	}
	return 0, fmt.Errorf("%s: not in mountinfo", dir)
}

func (k *keeper) startServer(dev *os.File, cfg serverConfig) (*server, error) {
	args := []string{"-serve",
		"-blob", cfg.blob, "-cache", cfg.cache, "-chunk", strconv.FormatInt(cfg.chunk, 10),
		"-latency", cfg.latency.String(), "-bandwidth", strconv.FormatInt(cfg.bandwidth, 10),
		"-timeout", strconv.Itoa(cfg.timeout), "-readers", strconv.Itoa(max(cfg.readers, 1)),
	}
	if cfg.directIO {
		args = append(args, "-direct-io")
	}
	if cfg.cacheDirect {
		args = append(args, "-cache-odirect")
	}
	if cfg.passthrough {
		args = append(args, "-passthrough")
	}
	if cfg.initReq != "" {
		args = append(args, "-init", cfg.initReq)
	}
	cmd := exec.Command(k.self, args...)
	cmd.ExtraFiles = []*os.File{dev}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, stdin: stdin, lines: make(chan string, 64), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
		_ = cmd.Wait()
		close(s.exited)
	}()
	k.clean.push(s.kill)
	return s, nil
}

// stats asks the server for its counters.
func (m *fuseMount) stats() (serverStats, error) {
	m.srv.send("stats")
	l, err := m.srv.expect("stats ", 5*time.Second)
	if err != nil {
		return serverStats{}, err
	}
	var st serverStats
	return st, jsonUnmarshal(l, &st)
}

// abort aborts the connection through fusectl.
func (m *fuseMount) abort() error {
	if m.k.fusectl == "" {
		return errors.New("fusectl is not available")
	}
	p := filepath.Join(m.k.fusectl, strconv.Itoa(int(m.conn)), "abort")
	err := os.WriteFile(p, []byte("1"), 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil // connection already gone
	}
	return err
}

// waiting reads fusectl's count of requests waiting for the server.
func (m *fuseMount) waiting() string {
	if m.k.fusectl == "" {
		return "?"
	}
	b, err := os.ReadFile(filepath.Join(m.k.fusectl, strconv.Itoa(int(m.conn)), "waiting"))
	if err != nil {
		return "gone"
	}
	return strings.TrimSpace(string(b))
}

// destroy aborts the connection (nothing can hang on it afterwards),
// detaches the mount and closes the keeper's descriptor; idempotent.
func (m *fuseMount) destroy() {
	_ = m.abort()
	_ = unix.Unmount(m.dir, unix.MNT_DETACH)
	if m.dev != nil {
		m.dev.Close()
		m.dev = nil
	}
}

// mountEROFS mounts an EROFS image (a path, possibly on FUSE) at a new
// directory, the way internal/rootfs mounts layers.
func (k *keeper) mountEROFS(src, opts string) (string, error) {
	dir, err := k.mkdir("erofs")
	if err != nil {
		return "", err
	}
	for {
		err = unix.Mount(src, dir, "erofs", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, opts)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("mount erofs %s (%s): %w", src, opts, err)
	}
	k.clean.push(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir, nil
}

// unmount unmounts without MNT_DETACH first (to see whether it works),
// then detaches whatever is left.
func unmount(dir string) error {
	err := unix.Unmount(dir, 0)
	if err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
	return err
}

// taskStates returns the scheduler states of the threads of pid ("S", "D",
// …), or "exited".
func taskStates(pid int) string {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return "exited"
	}
	count := map[string]int{}
	for _, e := range ents {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, e.Name()))
		if err != nil {
			continue
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i > 0 && i+2 < len(s) {
			count[s[i+2:i+3]]++
		}
	}
	if count["Z"] > 0 && len(count) == 1 {
		return "exited"
	}
	var parts []string
	for _, st := range []string{"R", "S", "D", "T", "Z"} {
		if count[st] > 0 {
			parts = append(parts, fmt.Sprintf("%s:%d", st, count[st]))
		}
	}
	return strings.Join(parts, " ")
}
