package keeper

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Shell sessions (protocol 4). A session is a long-lived shell of the
// sandbox, started by the driver's Exec like any command, reading command
// lines from a pipe of the keeper. Each command of the session is an exec
// of the journal with its own output files; the keeper writes it to the
// shell as one line
//
//	__dsec_c='CMD'; command eval "$__dsec_c" </dev/null; command printf 'M%d\n' "$?"; command printf 'M\n' >&2
//
// where M is an end marker with a fresh random nonce, and routes what the
// shell writes to its stdout and stderr into the command's files until it
// reads M on both (the status after it on stdout), stripping the markers.
// Output without the nonce is the command's, whatever it looks like.
//
// The shell runs without job control, with `trap : INT`: a timeout sends
// SIGINT to the shell's process group, which ends the foreground commands
// (background jobs ignore SIGINT in a shell without job control) while the
// shell lives on; if the command has not ended after sessionGrace the
// shell and every process it started are killed and the command ends
// session_lost. A shell that exits (`exit`, `exec bash` whose new shell
// reads the command's /dev/null, a killed shell) ends its running command
// session_lost; the next command of the name starts a new shell and
// reports session_restarted. The names of sessions are kept on disk
// (sessions/NAME.json in the sandbox's directory) so that a keeper that
// restarted, whose shells ended with the old keeper's pipes, reports
// session_restarted too.

// sessionGrace is how long a timed-out command has after SIGINT.
const sessionGrace = 2 * time.Second

// session is one shell session of a sandbox.
type session struct {
	name    string
	shell   string
	created time.Time
	uid     uint32
	gid     uint32
	pid     int
	// startTime is the shell's start time (ProcStartTime).
	startTime uint64
	stdin     *os.File      // the shell's command pipe
	exited    chan struct{} // closed once the shell has ended
	pumped    chan struct{} // closed once both output pipes reached EOF
	// killed is set before the keeper kills the shell: a command that
	// ends after it ended with the session, whatever the shell said.
	killed atomic.Bool

	mu sync.Mutex
	// guarded by mu
	ws       syscall.WaitStatus
	cur      *sessionCmd
	pend     [2][]byte
	commands int64
	deleted  bool
}

// sessionCmd is the command a session runs.
type sessionCmd struct {
	id       string
	marker   []byte
	outs     [2]*os.File
	limit    int64
	take     func(int64) int64
	written  [2]int64
	trunc    [2]bool
	seen     [2]bool
	status   int
	finished chan struct{} // closed once both markers were read
}

func (c *sessionCmd) write(i int, p []byte) {
	if len(p) == 0 {
		return
	}
	keep := min(int64(len(p)), max(c.limit-c.written[i], 0))
	if keep > 0 {
		keep = c.take(keep)
	}
	if keep < int64(len(p)) {
		c.trunc[i] = true
	}
	if keep > 0 {
		n, err := c.outs[i].Write(p[:keep])
		c.written[i] += int64(n)
		if err != nil {
			c.trunc[i] = true
		}
	}
}

// feed routes output of stream i (0 stdout, 1 stderr) of the shell to the
// current command, up to its marker. Output while no command runs (of
// background jobs) is dropped.
func (s *session) feed(i int, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pend[i] = append(s.pend[i], data...)
	for {
		c := s.cur
		if c == nil || c.seen[i] {
			s.pend[i] = s.pend[i][:0]
			return
		}
		p := s.pend[i]
		j := bytes.Index(p, c.marker)
		if j < 0 {
			hold := partialSuffix(p, c.marker)
			c.write(i, p[:len(p)-hold])
			s.pend[i] = append(p[:0], p[len(p)-hold:]...)
			return
		}
		c.write(i, p[:j])
		rest := p[j+len(c.marker):]
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			if len(rest) > 16 { // not our printf's: take it as output
				c.write(i, p[j:j+len(c.marker)])
				s.pend[i] = append(p[:0], rest...)
				continue
			}
			s.pend[i] = append(p[:0], p[j:]...)
			return
		}
		if i == 0 {
			n, err := strconv.Atoi(string(rest[:nl]))
			if err != nil {
				n = -1
			}
			c.status = n
		}
		c.seen[i] = true
		s.pend[i] = append(p[:0], rest[nl+1:]...)
		if c.seen[0] && c.seen[1] {
			close(c.finished)
		}
	}
}

// flush gives what is pending to the current command (the shell ended).
func (s *session) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.pend {
		if c := s.cur; c != nil && !c.seen[i] {
			c.write(i, s.pend[i])
		}
		s.pend[i] = nil
	}
}

// partialSuffix is the length of the longest suffix of p that is a proper
// prefix of m: bytes that may be the start of the marker.
func partialSuffix(p, m []byte) int {
	for n := min(len(p), len(m)-1); n > 0; n-- {
		if bytes.HasSuffix(p, m[:n]) {
			return n
		}
	}
	return 0
}

func (s *session) alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// shQuote quotes s for a POSIX shell.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func nonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sessionRecord is a session's file on disk.
type sessionRecord struct {
	Name     string    `json:"name"`
	Shell    string    `json:"shell"`
	Created  time.Time `json:"created"`
	Commands int64     `json:"commands"`
	// Pid and StartTime name the shell's host process, which a later
	// keeper kills with what it started.
	Pid       int    `json:"pid,omitempty"`
	StartTime uint64 `json:"start_time,omitempty"`
}

func (k *Keeper) sessionPath(id, name string) string {
	return filepath.Join(k.l.SandboxDir(id), "sessions", name+".json")
}

// startSessionExec starts spec's command line in its session.
func (k *Keeper) startSessionExec(ctx context.Context, req ExecRequest) error {
	spec := req.Spec
	switch {
	case !execIDRe.MatchString(spec.ID):
		return errdefs.Newf(errdefs.ErrInvalidArgument, "exec id %q: use 1-64 of [a-zA-Z0-9_.-]", spec.ID)
	case !execIDRe.MatchString(spec.Session):
		return errdefs.Newf(errdefs.ErrInvalidArgument, "session name %.80q: use 1-64 of [a-zA-Z0-9_.-]", spec.Session)
	case len(spec.Argv) != 1:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "a session command is one shell command line")
	case spec.TTY:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "a session command runs without a terminal: drop tty")
	case spec.Seal != 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "a sealed command runs alone, not in a session: drop session or sealed")
	case spec.StdinOpen:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "a session command's stdin is given whole: drop stdin_open")
	case bytes.IndexByte(spec.Stdin, 0) >= 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "a session command's stdin must be text without NUL bytes")
	case spec.SessionShell != "" && !strings.HasPrefix(spec.SessionShell, "/"):
		return errdefs.Newf(errdefs.ErrInvalidArgument, "session shell %q: give an absolute path", spec.SessionShell)
	}
	b, err := k.lookup(req.Sandbox)
	if err != nil {
		return err
	}
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	info, deleting := b.info, b.deleting
	_, dup := b.execs[spec.ID]
	if b.sessions == nil {
		b.sessions = map[string]*session{}
	}
	s := b.sessions[spec.Session]
	b.mu.Unlock()
	switch {
	case deleting:
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", req.Sandbox)
	case info.State != StateRunning:
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s (%s): create a new one", req.Sandbox, info.State, info.Reason)
	case info.Paused:
		return pausedError(req.Sandbox)
	case dup:
		return errdefs.Newf(errdefs.ErrAlreadyExists, "exec %s exists in sandbox %s", spec.ID, req.Sandbox)
	}
	if s != nil {
		s.mu.Lock()
		cur := s.cur
		s.mu.Unlock()
		if cur != nil {
			return errdefs.Newf(errdefs.ErrFailedPrecondition, "session %s runs exec %s: wait for it, or run this in another session", spec.Session, cur.id)
		}
		if s.uid != spec.UID || s.gid != spec.GID {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "session %s runs as uid %d gid %d: use another session for another user", spec.Session, s.uid, s.gid)
		}
	}
	dir := k.l.ExecDir(req.Sandbox, spec.ID)
	if _, err := os.Stat(dir); err == nil {
		return errdefs.Newf(errdefs.ErrAlreadyExists, "exec %s exists in sandbox %s", spec.ID, req.Sandbox)
	}
	releaseStep, err := k.claimStep(req.Sandbox, spec.StepKey, spec.ID)
	if err != nil {
		return err
	}
	restarted, fresh := false, false
	if s == nil || !s.alive() {
		fresh = true
		_, statErr := os.Stat(k.sessionPath(req.Sandbox, spec.Session))
		restarted = s != nil || statErr == nil
		if s == nil && statErr == nil {
			k.killStaleShell(req.Sandbox, spec.Session)
		}
		if s, err = k.startShell(ctx, b, req.Sandbox, spec); err != nil {
			releaseStep()
			return err
		}
	}

	if err := os.Mkdir(dir, 0o700); err != nil {
		releaseStep()
		if errors.Is(err, os.ErrExist) {
			return errdefs.Newf(errdefs.ErrAlreadyExists, "exec %s exists in sandbox %s", spec.ID, req.Sandbox)
		}
		return fmt.Errorf("exec dir: %w", err)
	}
	started := time.Now()
	if err := writeJSON(filepath.Join(dir, "spec.json"), journalEntry{ID: spec.ID, Argv: spec.Argv, Started: started.UTC(), Session: spec.Session, StepKey: spec.StepKey}); err != nil {
		os.RemoveAll(dir)
		releaseStep()
		return fmt.Errorf("exec journal: %w", err)
	}
	limit := spec.OutputLimit
	if limit <= 0 {
		limit = k.cfg.OutputLimit
	}
	m := "__dsec_end_" + nonce() + ":"
	c := &sessionCmd{id: spec.ID, marker: []byte(m), limit: limit, take: b.takeOutput, finished: make(chan struct{})}
	for i, st := range []Stream{Stdout, Stderr} {
		f, err := os.OpenFile(k.l.OutputPath(req.Sandbox, spec.ID, st), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			for _, f := range c.outs[:i] {
				f.Close()
			}
			os.RemoveAll(dir)
			releaseStep()
			return fmt.Errorf("exec output: %w", err)
		}
		c.outs[i] = f
	}
	p := &execProc{pid: s.pid, done: make(chan struct{}), stdinTurn: make(chan struct{}, 1)}
	b.mu.Lock()
	b.execs[spec.ID] = p
	b.mu.Unlock()
	s.mu.Lock()
	s.cur = c
	s.commands++
	s.mu.Unlock()

	var line strings.Builder
	if fresh {
		// The bootstrap, before the first command of a shell.
		line.WriteString("trap : INT; shopt -s expand_aliases 2>/dev/null; ")
	}
	fmt.Fprintf(&line, "__dsec_c=%s; command eval \"$__dsec_c\" ", shQuote(spec.Argv[0]))
	end := fmt.Sprintf("; command printf '%s%%d\\n' \"$?\"; command printf '%s\\n' >&2\n", m, m)
	if len(spec.Stdin) > 0 {
		delim := "__DSEC_IN_" + nonce()
		in := string(spec.Stdin)
		if !strings.HasSuffix(in, "\n") {
			in += "\n"
		}
		line.WriteString("<<'" + delim + "'" + end + in + delim + "\n")
	} else {
		line.WriteString("</dev/null" + end)
	}
	go k.awaitSessionCmd(req.Sandbox, spec, b, s, c, p, []byte(line.String()), started, restarted)
	return nil
}

// startShell starts a new shell for spec's session in b.
func (k *Keeper) startShell(ctx context.Context, b *box, id string, spec ExecSpec) (*session, error) {
	shell := spec.SessionShell
	if shell == "" {
		shell = "/bin/sh"
		if hasFile(b.snapshot().Pid, "bin/bash") {
			shell = "/bin/bash"
		}
	}
	var stdio [3]*os.File
	var readers [2]*os.File
	var owned []*os.File
	defer func() {
		for _, f := range owned {
			f.Close()
		}
	}()
	in, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	owned = append(owned, in)
	stdio[0] = in
	for i := range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			inW.Close()
			for _, f := range readers[:i] {
				f.Close()
			}
			return nil, err
		}
		owned = append(owned, w)
		stdio[i+1], readers[i] = w, r
	}
	sh := spec
	sh.Argv = []string{shell}
	sh.Stdin, sh.Timeout = nil, 0
	spawned := time.Now()
	pid, err := k.driverOf(b).Exec(ctx, b, sh, stdio)
	if err != nil {
		inW.Close()
		readers[0].Close()
		readers[1].Close()
		return nil, err
	}
	s := &session{
		name: spec.Session, shell: shell, created: time.Now(), uid: spec.UID, gid: spec.GID,
		pid: pid, stdin: inW, exited: make(chan struct{}), pumped: make(chan struct{}),
	}
	exitCh := k.reaper.watch(pid, spawned)
	var pumps sync.WaitGroup
	for i, r := range readers {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			defer r.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					s.feed(i, buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	go func() { pumps.Wait(); close(s.pumped) }()
	go func() {
		ws := <-exitCh
		s.mu.Lock()
		s.ws = ws
		s.mu.Unlock()
		s.stdin.Close()
		close(s.exited)
	}()
	st, _ := ProcStartTime(pid)
	s.startTime = st
	rec := sessionRecord{Name: s.name, Shell: shell, Created: s.created.UTC(), Pid: pid, StartTime: st}
	if err := os.MkdirAll(filepath.Dir(k.sessionPath(id, s.name)), 0o700); err == nil {
		if err := writeJSON(k.sessionPath(id, s.name), rec); err != nil {
			k.log.Warn("write session record", "sandbox", id, "session", s.name, "err", err)
		}
	}
	b.mu.Lock()
	b.sessions[s.name] = s
	b.mu.Unlock()
	return s, nil
}

// hasFile reports whether the sandbox of init pid has a file at path
// (relative to its root), resolved inside its root.
func hasFile(pid int, path string) bool {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return false
	}
	var st unix.Stat_t
	ok := unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
	unix.Close(fd)
	return ok
}

// awaitSessionCmd writes a command to its shell and waits for its end.
func (k *Keeper) awaitSessionCmd(id string, spec ExecSpec, b *box, s *session, c *sessionCmd, p *execProc,
	line []byte, started time.Time, restarted bool) {
	lost := false
	_ = s.stdin.SetWriteDeadline(time.Now().Add(stdinWriteTimeout))
	if _, err := s.stdin.Write(line); err != nil {
		k.log.Warn("write session command", "sandbox", id, "session", s.name, "err", err)
		k.killSession(s)
		lost = true
	}
	timedOut := false
	var timer <-chan time.Time
	if spec.Timeout > 0 {
		// Time the sandbox spends paused does not count.
		c, stop := b.activeTimer(spec.Timeout)
		defer stop()
		timer = c
	}
	if !lost {
		select {
		case <-c.finished:
		case <-s.exited:
			lost = true
		case <-timer:
			timedOut = true
			_ = syscall.Kill(-s.pid, syscall.SIGINT)
			select {
			case <-c.finished:
			case <-s.exited:
				lost = true
			case <-time.After(sessionGrace):
				k.killSession(s)
				lost = true
			}
		}
	}
	if s.killed.Load() {
		lost = true
	}
	ended := time.Now()
	rec := ExitRecord{ExitStatus: ExitStatus{Started: started, Ended: ended, TimedOut: timedOut, SessionRestarted: restarted}}
	if lost {
		// The shell's last output, then what it ended with.
		<-s.exited
		select {
		case <-s.pumped:
		case <-time.After(drainGrace):
		}
		s.flush()
		rec.SessionLost = true
		s.mu.Lock()
		ws := s.ws
		s.mu.Unlock()
		switch {
		case ws.Exited():
			rec.Code = ws.ExitStatus()
		case ws.Signaled():
			rec.Signal = int(ws.Signal())
		}
	}
	s.mu.Lock()
	if !lost {
		rec.Code = c.status
	}
	if timedOut && rec.Signal == 0 {
		// SIGINT ended it (the shell says 130, or what the command or the
		// shell made of the signal): a timed-out command has the signal
		// that ended it and no exit code, as one outside a session has
		// SIGKILL.
		rec.Code, rec.Signal = 0, int(syscall.SIGINT)
	}
	rec.StdoutTruncated, rec.StderrTruncated = c.trunc[0], c.trunc[1]
	rec.StdoutBytes, rec.StderrBytes = c.written[0], c.written[1]
	s.cur = nil
	commands, deleted := s.commands, s.deleted
	s.mu.Unlock()
	for _, f := range c.outs {
		f.Close()
	}
	if err := k.l.writeExit(id, spec.ID, rec); err != nil {
		k.log.Warn("write exit record", "sandbox", id, "exec", spec.ID, "err", err)
	}
	if !deleted {
		r := sessionRecord{Name: s.name, Shell: s.shell, Created: s.created.UTC(), Commands: commands, Pid: s.pid, StartTime: s.startTime}
		if err := writeJSON(k.sessionPath(id, s.name), r); err != nil && !errors.Is(err, os.ErrNotExist) {
			k.log.Debug("write session record", "sandbox", id, "session", s.name, "err", err)
		}
	}
	p.mu.Lock()
	p.rec = rec
	p.mu.Unlock()
	close(p.done)
}

// killStaleShell kills the shell of a session an earlier keeper ran, and
// what it started, if it still runs (busy in a command when that keeper's
// end closed its input).
func (k *Keeper) killStaleShell(id, name string) {
	raw, err := os.ReadFile(k.sessionPath(id, name))
	if err != nil {
		return
	}
	var r sessionRecord
	if json.Unmarshal(raw, &r) != nil || r.Pid <= 1 || r.StartTime == 0 {
		return
	}
	if st, err := ProcStartTime(r.Pid); err != nil || st != r.StartTime {
		return
	}
	for _, pid := range descendants(r.Pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(-r.Pid, syscall.SIGKILL)
	_ = syscall.Kill(r.Pid, syscall.SIGKILL)
}

// killSession kills a session's shell and every process it started: its
// process group and, first, its descendants by parent (those that left the
// group with setsid).
func (k *Keeper) killSession(s *session) {
	if !s.alive() {
		return
	}
	s.killed.Store(true)
	// The shell first: killed after its command, it would see the command
	// die and report that as the command's end.
	below := descendants(s.pid)
	_ = syscall.Kill(s.pid, syscall.SIGKILL)
	_ = syscall.Kill(-s.pid, syscall.SIGKILL)
	for _, pid := range below {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// descendants lists the processes below pid, by the parents /proc shows.
func descendants(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The comm field may hold anything; the fields after it follow the
		// last ')'.
		i := bytes.LastIndexByte(raw, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(raw[i+1:]))
		if len(f) < 2 {
			continue
		}
		pp, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		children[pp] = append(children[pp], p)
	}
	var out []int
	queue := []int{pid}
	seen := map[int]bool{pid: true}
	for len(queue) > 0 {
		q := queue[0]
		queue = queue[1:]
		for _, c := range children[q] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out
}

// listSessions lists a sandbox's sessions: those of this keeper and those
// on disk whose shell ended with an earlier keeper.
func (k *Keeper) listSessions(id string) ([]SessionInfo, error) {
	b, err := k.lookup(id)
	if err != nil {
		return nil, err
	}
	byName := map[string]SessionInfo{}
	ents, _ := os.ReadDir(filepath.Join(k.l.SandboxDir(id), "sessions"))
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(k.l.SandboxDir(id), "sessions", e.Name()))
		if err != nil {
			continue
		}
		var r sessionRecord
		if json.Unmarshal(raw, &r) != nil || !execIDRe.MatchString(r.Name) {
			continue
		}
		byName[r.Name] = SessionInfo{Name: r.Name, Shell: r.Shell, Created: r.Created, Commands: r.Commands}
	}
	b.mu.Lock()
	for _, s := range b.sessions {
		s.mu.Lock()
		si := SessionInfo{Name: s.name, Shell: s.shell, Created: s.created.UTC(), Commands: s.commands}
		if s.cur != nil {
			si.RunningExec = s.cur.id
		}
		s.mu.Unlock()
		byName[s.name] = si
	}
	b.mu.Unlock()
	out := make([]SessionInfo, 0, len(byName))
	for _, si := range byName {
		out = append(out, si)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// deleteSession kills a session's shell tree and forgets the session.
func (k *Keeper) deleteSession(id, name string) error {
	if !execIDRe.MatchString(name) {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "session name %.80q: use 1-64 of [a-zA-Z0-9_.-]", name)
	}
	b, err := k.lookup(id)
	if err != nil {
		return err
	}
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	s := b.sessions[name]
	delete(b.sessions, name)
	b.mu.Unlock()
	path := k.sessionPath(id, name)
	_, statErr := os.Stat(path)
	if s == nil && statErr != nil {
		return errdefs.Newf(errdefs.ErrNotFound, "session %s not found in sandbox %s (list them with `dsec session ls %s`)", name, id, id)
	}
	if s != nil {
		s.mu.Lock()
		s.deleted = true
		s.mu.Unlock()
		k.killSession(s)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove session record: %w", err)
	}
	return nil
}
