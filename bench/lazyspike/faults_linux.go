package main

import (
	"fmt"
	"path/filepath"
	"syscall"
	"time"
)

// faultResult is what one fault scenario observed, step by step.
type faultResult struct {
	Name      string   `json:"name"`
	Candidate string   `json:"candidate"`
	Steps     []string `json:"steps"`
	Err       string   `json:"error,omitempty"`
}

func (f *faultResult) logf(format string, a ...any) {
	f.Steps = append(f.Steps, fmt.Sprintf(format, a...))
}

func describe(r readerResult, done bool) string {
	if !done {
		return "still blocked"
	}
	if r.Err != "" {
		return fmt.Sprintf("error %q after %.0f ms", r.Err, r.Millis)
	}
	return fmt.Sprintf("ok, %d bytes in %.0f ms", r.Bytes, r.Millis)
}

// faultSetup mounts a fresh server and the candidate's layer and reads
// one file so that some of the layer is cached.
func (s *spike) faultSetup(c candidate, cfg serverConfig, hold bool, f *faultResult) (*fuseMount, string, error) {
	m, err := s.k.mountFUSE(cfg, hold)
	if err != nil {
		return nil, "", err
	}
	src, opts := c.source(m.file)
	e, err := s.k.mountEROFS(src, opts)
	if err != nil {
		m.destroy()
		return nil, "", err
	}
	if _, err := readAll(e, s.chosen[:1]); err != nil {
		m.destroy()
		return nil, "", err
	}
	f.logf("server pid %d, keeper holds /dev/fuse fd: %v; layer mounted, %s read (%d bytes)",
		m.srv.cmd.Process.Pid, hold, s.chosen[0].Path, s.chosen[0].Size)
	return m, e, nil
}

// afterDeath reads a cached and an uncached file, walks the tree, and
// unmounts, on a connection whose server is gone or aborted.
func (s *spike) afterDeath(m *fuseMount, e string, f *faultResult) {
	for i, what := range []string{"file read before (page cache)", "file never read"} {
		r, err := s.k.startReader("read", filepath.Join(e, s.chosen[i*2].Path))
		if err != nil {
			f.logf("start reader: %v", err)
			return
		}
		res, done := r.wait(10 * time.Second)
		f.logf("read of a %s: %s; reader state %s", what, describe(res, done), r.state())
		if !done {
			_ = m.abort()
			res, done = r.wait(5 * time.Second)
			f.logf("  after abort: %s", describe(res, done))
		}
	}
	r, err := s.k.startReader("walk", e)
	if err == nil {
		res, done := r.wait(10 * time.Second)
		f.logf("stat of every entry: %s (%d entries)", describe(res, done), res.Bytes)
	}
	f.logf("fusectl waiting=%s", m.waiting())
	start := time.Now()
	err = unmount(e)
	f.logf("umount(erofs) without MNT_DETACH: %v in %.1f ms", errString(err), msSince(start))
	start = time.Now()
	err = unmount(m.dir)
	f.logf("umount(fuse) without MNT_DETACH: %v in %.1f ms", errString(err), msSince(start))
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// faultServerExits: the server process dies and nothing else holds the
// FUSE descriptor, so the kernel ends the connection.
func (s *spike) faultServerExits(c candidate) (f faultResult) {
	f.Name, f.Candidate = "server exits, no fd holder", c.Name
	m, e, err := s.faultSetup(c, s.cfg(c.blob), false, &f)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	defer m.destroy()
	m.srv.kill()
	f.logf("server killed (SIGKILL)")
	s.afterDeath(m, e, &f)
	return f
}

// faultAbort: the connection is aborted through fusectl with the server
// alive.
func (s *spike) faultAbort(c candidate) (f faultResult) {
	f.Name, f.Candidate = "connection aborted through fusectl", c.Name
	m, e, err := s.faultSetup(c, s.cfg(c.blob), true, &f)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	defer m.destroy()
	start := time.Now()
	err = m.abort()
	f.logf("abort: %v in %.1f ms", errString(err), msSince(start))
	s.afterDeath(m, e, &f)
	return f
}

// faultHang: the server stops answering (its fetch blocks): does a reader
// hang, in which state, can it be killed, and what does an abort do.
func (s *spike) faultHang(c candidate) (f faultResult) {
	f.Name, f.Candidate = "server stops answering (no request timeout)", c.Name
	m, e, err := s.faultSetup(c, s.cfg(c.blob), true, &f)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	defer m.destroy()
	m.srv.send("hang")
	if _, err := m.srv.expect("hanging", 5*time.Second); err != nil {
		f.Err = err.Error()
		return f
	}
	r1, err := s.k.startReader("read", filepath.Join(e, s.chosen[2].Path))
	if err != nil {
		f.Err = err.Error()
		return f
	}
	res, done := r1.wait(2 * time.Second)
	f.logf("reader 1 of an uncached file after 2 s: %s; threads %s; fusectl waiting=%s", describe(res, done), r1.state(), m.waiting())
	if !done {
		_ = r1.cmd.Process.Signal(syscall.SIGKILL) // our own child
		start := time.Now()
		_, exited := r1.wait(3 * time.Second)
		f.logf("SIGKILL to reader 1: %s", map[bool]string{true: fmt.Sprintf("it exited in %.0f ms", msSince(start)),
			false: "it did NOT exit within 3 s (" + r1.state() + ")"}[exited])
	}
	r2, err := s.k.startReader("read", filepath.Join(e, s.chosen[3].Path))
	if err != nil {
		f.Err = err.Error()
		return f
	}
	res, done = r2.wait(1500 * time.Millisecond)
	f.logf("reader 2 of another uncached file after 1.5 s: %s; threads %s", describe(res, done), r2.state())
	start := time.Now()
	err = m.abort()
	res, done = r2.wait(5 * time.Second)
	f.logf("abort through fusectl (%v): reader 2 %s, %.0f ms after the abort", errString(err), describe(res, done), msSince(start))
	f.logf("server process after abort: %s", taskStates(m.srv.cmd.Process.Pid))
	start = time.Now()
	err = unmount(e)
	f.logf("umount(erofs) without MNT_DETACH: %v in %.1f ms", errString(err), msSince(start))
	err = unmount(m.dir)
	f.logf("umount(fuse) without MNT_DETACH: %v", errString(err))
	return f
}

// faultTimeout: the server asks the kernel for a request timeout in its
// INIT reply (FUSE_REQUEST_TIMEOUT, Linux 6.14), then stops answering.
func (s *spike) faultTimeout(c candidate, secs int) (f faultResult) {
	f.Name, f.Candidate = fmt.Sprintf("server stops answering, FUSE request_timeout=%ds", secs), c.Name
	cfg := s.cfg(c.blob)
	cfg.timeout = secs
	m, e, err := s.faultSetup(c, cfg, true, &f)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	defer m.destroy()
	m.srv.send("hang")
	if _, err := m.srv.expect("hanging", 5*time.Second); err != nil {
		f.Err = err.Error()
		return f
	}
	r, err := s.k.startReader("read", filepath.Join(e, s.chosen[2].Path))
	if err != nil {
		f.Err = err.Error()
		return f
	}
	res, done := r.wait(time.Duration(secs+40) * time.Second)
	f.logf("reader of an uncached file: %s (fusectl waiting=%s)", describe(res, done), m.waiting())
	if !done {
		_ = m.abort()
		res, done = r.wait(5 * time.Second)
		f.logf("  after abort: %s", describe(res, done))
	}
	f.logf("server process: %s", taskStates(m.srv.cmd.Process.Pid))
	if r2, err := s.k.startReader("read", filepath.Join(e, s.chosen[3].Path)); err == nil {
		res, done := r2.wait(5 * time.Second)
		f.logf("then a read of another uncached file: %s", describe(res, done))
	}
	err = unmount(e)
	f.logf("umount(erofs) without MNT_DETACH: %v", errString(err))
	return f
}

// faultTakeover: the keeper holds the /dev/fuse descriptor; the server
// hangs with a request in flight and is killed; a new server process gets
// the descriptor and the saved INIT, asks the kernel to resend, and must
// finish the blocked read and serve new ones.
func (s *spike) faultTakeover(c candidate) (f faultResult) {
	f.Name, f.Candidate = "server restart: new process takes over the held /dev/fuse fd", c.Name
	cfg := s.cfg(c.blob)
	m, e, err := s.faultSetup(c, cfg, true, &f)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	defer m.destroy()
	first, _ := m.stats()
	m.srv.send("hang")
	if _, err := m.srv.expect("hanging", 5*time.Second); err != nil {
		f.Err = err.Error()
		return f
	}
	target := s.chosen[2]
	want, err := sha256File(filepath.Join(s.im.tree, target.Path))
	if err != nil {
		f.Err = err.Error()
		return f
	}
	r, err := s.k.startReader("read", filepath.Join(e, target.Path))
	if err != nil {
		f.Err = err.Error()
		return f
	}
	res, done := r.wait(time.Second)
	f.logf("reader of an uncached file with the server hung: %s; fusectl waiting=%s", describe(res, done), m.waiting())
	m.srv.kill()
	res, done = r.wait(time.Second)
	f.logf("old server killed: reader %s, threads %s; fusectl waiting=%s", describe(res, done), r.state(), m.waiting())
	start := time.Now()
	cfg.initReq = m.srv.initHex
	srv, err := s.k.startServer(m.dev, cfg)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	m.srv = srv
	l, err := srv.expect("resend ", 5*time.Second)
	f.logf("new server pid %d started, FUSE_NOTIFY_RESEND: %s %v", srv.cmd.Process.Pid, l, errString(err))
	if !done {
		res, done = r.wait(10 * time.Second)
		f.logf("blocked reader: %s, %.0f ms after the new server started; data %s", describe(res, done), msSince(start),
			map[bool]string{true: "matches the source", false: "DIFFERS from the source"}[res.SHA256 == want])
		if !done {
			_ = m.abort()
		}
	}
	next := s.chosen[4]
	want, _ = sha256File(filepath.Join(s.im.tree, next.Path))
	r2, err := s.k.startReader("read", filepath.Join(e, next.Path))
	if err == nil {
		res, done = r2.wait(10 * time.Second)
		f.logf("new read through the new server: %s; data %s", describe(res, done),
			map[bool]string{true: "matches the source", false: "DIFFERS from the source"}[res.SHA256 == want])
	}
	if st, err := m.stats(); err == nil {
		f.logf("new server fetched %d chunks (the first server had fetched %d before it hung; its chunk cache was reused)",
			st.ChunksFetched, first.ChunksFetched)
	}
	err = unmount(e)
	f.logf("umount(erofs) without MNT_DETACH: %v", errString(err))
	return f
}
