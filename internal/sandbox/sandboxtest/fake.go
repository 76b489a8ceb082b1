package sandboxtest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// TierFake is the tier of Fake: no isolation at all, so no tier's policy
// cases apply to it.
const TierFake sandbox.Tier = "fake"

// FakeNode is the state of a node as a Fake backend sees it: its sandboxes
// outlive any one Fake, as real ones outlive the edge process, so a test
// restarts the edge by opening a new Fake on the same node.
//
// Its fields inject faults; set them before the edge uses the node, or
// under Lock.
type FakeNode struct {
	mu sync.Mutex
	// guarded by mu
	boxes   map[string]*fakeBox
	events  []sandbox.Event
	waiters []chan struct{} // woken when events are added
	calls   map[string]int  // Create, Delete, ... by name

	// CreateErr, when set, fails a Create after the sandbox was half made
	// (it stays until Delete, as a crashed runtime's leftovers do).
	CreateErr func(spec sandbox.Spec) error // guarded by mu
	// DeleteErr, when set, fails a Delete; the sandbox stays.
	DeleteErr func(id string) error // guarded by mu
	// CreateBlock, when set, is received from before Create returns (a
	// test holds a create in flight).
	CreateBlock chan struct{} // guarded by mu
	// Features are what the fake declares (nil: restart, tty and step
	// keys).
	Features []sandbox.Capability // guarded by mu
	// Run decides how a command ends; nil runs argv as: "exit N" exits N,
	// "sleep" runs until Finish, anything else prints its argv and exits 0.
	Run func(spec sandbox.ExecSpec) (stdout string, exit sandbox.ExitStatus, runs bool) // guarded by mu
}

type fakeBox struct {
	spec   sandbox.Spec
	state  sandbox.State
	reason string
	execs  map[string]*fakeExec
	order  []string
	files  map[string]*fakeFile
	// partial: made by a Create that failed.
	partial bool
}

type fakeExec struct {
	spec    sandbox.ExecSpec
	started time.Time
	out     [2]bytes.Buffer
	exit    *sandbox.ExitStatus
	done    chan struct{}
}

type fakeFile struct {
	data []byte
	mode fs.FileMode
	uid  uint32
	gid  uint32
	mod  time.Time
}

// NewFakeNode returns an empty node.
func NewFakeNode() *FakeNode {
	return &FakeNode{boxes: map[string]*fakeBox{}, calls: map[string]int{}}
}

// Lock and Unlock guard the fault fields.
func (n *FakeNode) Lock()   { n.mu.Lock() }
func (n *FakeNode) Unlock() { n.mu.Unlock() }

// Open returns a backend on the node.
func (n *FakeNode) Open() *Fake { return &Fake{n: n, name: "fake"} }

// IDs lists the node's sandboxes, half-made ones too, sorted.
func (n *FakeNode) IDs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for id := range n.boxes {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Calls reports how often a method was called.
func (n *FakeNode) Calls(method string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls[method]
}

// Exit ends sandbox id's init with reason and reports it as an event.
func (n *FakeNode) Exit(id, reason string) {
	n.end(id, sandbox.EventExited, reason)
}

// FailSandbox marks sandbox id failed, as a backend that cannot go on
// does, and reports it as an event.
func (n *FakeNode) FailSandbox(id, reason string) {
	n.end(id, sandbox.EventFailed, reason)
}

// Forget drops sandbox id without a trace or an event (a keeper that lost
// it).
func (n *FakeNode) Forget(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.boxes, id)
}

// Spec returns what sandbox id was created with.
func (n *FakeNode) Spec(id string) (sandbox.Spec, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.boxes[id]
	if !ok {
		return sandbox.Spec{}, false
	}
	return b.spec, true
}

// Finish ends a running exec (one that Run left running) with code.
func (n *FakeNode) Finish(id, execID string, code int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if b, ok := n.boxes[id]; ok {
		if x, ok := b.execs[execID]; ok && x.exit == nil {
			x.exit = &sandbox.ExitStatus{Code: code, Started: x.started, Ended: time.Now()}
			close(x.done)
		}
	}
}

func (n *FakeNode) end(id string, typ sandbox.EventType, reason string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.boxes[id]
	if !ok || b.state != sandbox.StateRunning {
		return
	}
	b.state, b.reason = sandbox.StateExited, reason
	n.addEvent(sandbox.Event{Sandbox: id, Type: typ, Reason: reason, Time: time.Now()})
}

// Event reports an event of sandbox id (an OOM kill, say).
func (n *FakeNode) Event(id string, typ sandbox.EventType, reason string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.addEvent(sandbox.Event{Sandbox: id, Type: typ, Reason: reason, Time: time.Now()})
}

func (n *FakeNode) addEvent(ev sandbox.Event) {
	n.events = append(n.events, ev)
	for _, w := range n.waiters {
		close(w)
	}
	n.waiters = nil
}

// Fake is a backend in memory: no isolation, nothing on the host. It keeps
// the contract's semantics (idempotent Delete, NotFound, journals, output
// from offsets) so that the edge's own logic can be tested fast.
type Fake struct {
	n    *FakeNode
	name string
}

var (
	_ sandbox.Backend     = (*Fake)(nil)
	_ sandbox.EventSource = (*Fake)(nil)
)

// Describe implements sandbox.Backend.
func (f *Fake) Describe() sandbox.Description {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	feats := f.n.Features
	if feats == nil {
		feats = []sandbox.Capability{sandbox.CapRestart, sandbox.CapTTY, sandbox.CapStepKeys}
	}
	return sandbox.Description{Name: f.name, Tier: TierFake, Features: slices.Clone(feats)}
}

// Close implements sandbox.Backend.
func (f *Fake) Close() error { return nil }

func (f *Fake) call(method string) { f.n.calls[method]++ }

func (f *Fake) box(id string) (*fakeBox, error) {
	b, ok := f.n.boxes[id]
	if !ok || b.partial {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	return b, nil
}

// Create implements sandbox.Backend.
func (f *Fake) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Status, error) {
	if err := sandbox.CheckSpec(f, spec); err != nil {
		return sandbox.Status{}, err
	}
	f.n.mu.Lock()
	f.call("Create")
	block := f.n.CreateBlock
	if _, ok := f.n.boxes[spec.ID]; ok {
		f.n.mu.Unlock()
		return sandbox.Status{}, errdefs.Newf(errdefs.ErrAlreadyExists, "sandbox %s exists", spec.ID)
	}
	b := &fakeBox{spec: spec, state: sandbox.StateRunning, execs: map[string]*fakeExec{}, files: map[string]*fakeFile{
		"/":           {mode: fs.ModeDir | 0o755},
		"/etc":        {mode: fs.ModeDir | 0o755},
		"/etc/passwd": {data: []byte("root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n"), mode: 0o644},
		"/etc/group":  {data: []byte("root:x:0:\nagent:x:1000:\n"), mode: 0o644},
	}}
	f.n.boxes[spec.ID] = b
	var err error
	if f.n.CreateErr != nil {
		err = f.n.CreateErr(spec)
	}
	if err != nil {
		b.partial = true
	}
	f.n.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return sandbox.Status{}, ctx.Err()
		}
	}
	if err != nil {
		return sandbox.Status{}, err
	}
	return sandbox.Status{ID: spec.ID, State: sandbox.StateRunning}, nil
}

// Delete implements sandbox.Backend.
func (f *Fake) Delete(ctx context.Context, id string) error {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	f.call("Delete")
	if f.n.DeleteErr != nil {
		if err := f.n.DeleteErr(id); err != nil {
			return err
		}
	}
	if b, ok := f.n.boxes[id]; ok {
		for _, x := range b.execs {
			if x.exit == nil {
				x.exit = &sandbox.ExitStatus{Signal: 9, Started: x.started, Ended: time.Now()}
				close(x.done)
			}
		}
	}
	delete(f.n.boxes, id)
	return nil
}

func (b *fakeBox) status(id string) sandbox.Status {
	st := sandbox.Status{ID: id, State: b.state, Reason: b.reason}
	for _, x := range b.execs {
		if x.exit == nil {
			st.RunningExecs++
		}
	}
	return st
}

// Status implements sandbox.Backend.
func (f *Fake) Status(ctx context.Context, id string) (sandbox.Status, error) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	b, err := f.box(id)
	if err != nil {
		return sandbox.Status{}, err
	}
	return b.status(id), nil
}

// List implements sandbox.Backend; half-made sandboxes are listed too, as
// a real backend finds their leftovers.
func (f *Fake) List(ctx context.Context) ([]sandbox.Status, error) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	f.call("List")
	var out []sandbox.Status
	for id, b := range f.n.boxes {
		out = append(out, b.status(id))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Stats implements sandbox.Backend.
func (f *Fake) Stats(ctx context.Context, id string) (sandbox.Stats, error) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	b, err := f.box(id)
	if err != nil {
		return sandbox.Stats{}, err
	}
	r := b.spec.Resources
	return sandbox.Stats{MemoryBytes: r.MemoryBytes / 4, MemoryLimit: r.MemoryBytes, PidsLimit: r.Pids, DiskLimit: r.DiskBytes}, nil
}

// Events implements sandbox.EventSource: the cursor is an index into the
// node's events.
func (f *Fake) Events(ctx context.Context, cursor string) ([]sandbox.Event, string, error) {
	var from int
	if cursor != "" {
		if _, err := fmt.Sscan(cursor, &from); err != nil {
			return nil, "", errdefs.Newf(errdefs.ErrInvalidArgument, "cursor %q", cursor)
		}
	}
	for {
		f.n.mu.Lock()
		if from > len(f.n.events) {
			from = 0
		}
		if evs := f.n.events[from:]; len(evs) > 0 {
			out := slices.Clone(evs)
			next := fmt.Sprint(len(f.n.events))
			f.n.mu.Unlock()
			return out, next, nil
		}
		w := make(chan struct{})
		f.n.waiters = append(f.n.waiters, w)
		f.n.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return nil, cursor, ctx.Err()
		}
	}
}

// StartExec implements sandbox.Backend.
func (f *Fake) StartExec(ctx context.Context, id string, spec sandbox.ExecSpec) error {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	b, err := f.box(id)
	if err != nil {
		return err
	}
	if b.state != sandbox.StateRunning {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s", id, b.state)
	}
	if _, ok := b.execs[spec.ID]; ok {
		return errdefs.Newf(errdefs.ErrAlreadyExists, "exec %s exists", spec.ID)
	}
	if spec.StepKey != "" {
		for _, xid := range b.order {
			if b.execs[xid].spec.StepKey == spec.StepKey {
				return errdefs.Newf(errdefs.ErrAlreadyExists, "step key %q is exec %s's in sandbox %s", spec.StepKey, xid, id)
			}
		}
	}
	x := &fakeExec{spec: spec, started: time.Now(), done: make(chan struct{})}
	b.execs[spec.ID] = x
	b.order = append(b.order, spec.ID)
	run := f.n.Run
	if run == nil {
		run = defaultRun
	}
	out, st, runs := run(spec)
	x.out[0].WriteString(out)
	if !runs {
		st.Started, st.Ended = x.started, time.Now()
		x.exit = &st
		close(x.done)
	}
	return nil
}

func defaultRun(spec sandbox.ExecSpec) (string, sandbox.ExitStatus, bool) {
	switch {
	case len(spec.Argv) == 2 && spec.Argv[0] == "exit":
		var code int
		fmt.Sscan(spec.Argv[1], &code)
		return "", sandbox.ExitStatus{Code: code}, false
	case len(spec.Argv) > 0 && spec.Argv[0] == "sleep":
		return "", sandbox.ExitStatus{}, true
	case len(spec.Argv) > 0 && spec.Argv[0] == "env":
		return strings.Join(spec.Env, "\n") + "\n", sandbox.ExitStatus{}, false
	}
	return strings.Join(spec.Argv, " ") + "\n", sandbox.ExitStatus{}, false
}

func (f *Fake) exec(id, execID string) (*fakeExec, error) {
	b, err := f.box(id)
	if err != nil {
		return nil, err
	}
	x, ok := b.execs[execID]
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "exec %s not found in sandbox %s", execID, id)
	}
	return x, nil
}

// WaitExec implements sandbox.Backend.
func (f *Fake) WaitExec(ctx context.Context, id, execID string) (sandbox.ExitStatus, error) {
	f.n.mu.Lock()
	x, err := f.exec(id, execID)
	f.n.mu.Unlock()
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	select {
	case <-x.done:
	case <-ctx.Done():
		return sandbox.ExitStatus{}, ctx.Err()
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	return *x.exit, nil
}

// OpenOutput implements sandbox.Backend.
func (f *Fake) OpenOutput(ctx context.Context, id, execID string, s sandbox.Stream) (sandbox.Output, error) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	x, err := f.exec(id, execID)
	if err != nil {
		return nil, err
	}
	if s != sandbox.Stdout && s != sandbox.Stderr {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "stream %d", s)
	}
	return fakeOutput{n: f.n, buf: &x.out[s-1]}, nil
}

type fakeOutput struct {
	n   *FakeNode
	buf *bytes.Buffer
}

func (o fakeOutput) ReadAt(p []byte, off int64) (int, error) {
	o.n.mu.Lock()
	defer o.n.mu.Unlock()
	b := o.buf.Bytes()
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (o fakeOutput) Size() (int64, error) {
	o.n.mu.Lock()
	defer o.n.mu.Unlock()
	return int64(o.buf.Len()), nil
}

func (o fakeOutput) Close() error { return nil }

// WriteStdin implements sandbox.Backend: what is written is echoed on
// stdout.
func (f *Fake) WriteStdin(ctx context.Context, id, execID string, data []byte, close bool) error {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	x, err := f.exec(id, execID)
	if err != nil {
		return err
	}
	if x.exit != nil {
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "exec %s has ended", execID)
	}
	x.out[0].Write(data)
	return nil
}

// Signal implements sandbox.Backend: any signal ends the exec.
func (f *Fake) Signal(ctx context.Context, id, execID string, sig int) error {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	x, err := f.exec(id, execID)
	if err != nil {
		return err
	}
	if x.exit == nil {
		x.exit = &sandbox.ExitStatus{Signal: sig, Started: x.started, Ended: time.Now()}
		close(x.done)
	}
	return nil
}

// ResizeTTY implements sandbox.Backend.
func (f *Fake) ResizeTTY(ctx context.Context, id, execID string, rows, cols uint16) error {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	_, err := f.exec(id, execID)
	return err
}

// ListExecs implements sandbox.Backend.
func (f *Fake) ListExecs(ctx context.Context, id string) ([]sandbox.ExecInfo, error) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	b, err := f.box(id)
	if err != nil {
		return nil, err
	}
	var out []sandbox.ExecInfo
	for _, xid := range b.order {
		x := b.execs[xid]
		info := sandbox.ExecInfo{ID: xid, Argv: x.spec.Argv, TTY: x.spec.TTY, Started: x.started, Running: x.exit == nil,
			StdoutBytes: int64(x.out[0].Len()), StderrBytes: int64(x.out[1].Len()), StepKey: x.spec.StepKey}
		if x.exit != nil {
			st := *x.exit
			info.Exit = &st
		}
		out = append(out, info)
	}
	return out, nil
}

func (f *Fake) file(id, p string) (*fakeBox, *fakeFile, error) {
	b, err := f.box(id)
	if err != nil {
		return nil, nil, err
	}
	if !path.IsAbs(p) {
		return nil, nil, errdefs.Newf(errdefs.ErrInvalidArgument, "path %q is not absolute", p)
	}
	return b, b.files[path.Clean(p)], nil
}

func info(p string, ff *fakeFile) sandbox.FileInfo {
	return sandbox.FileInfo{Path: p, Name: path.Base(p), Size: int64(len(ff.data)), Mode: ff.mode, ModTime: ff.mod, UID: ff.uid, GID: ff.gid}
}

// ReadFile implements sandbox.Backend.
func (f *Fake) ReadFile(ctx context.Context, id, p string) (io.ReadCloser, sandbox.FileInfo, error) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	_, ff, err := f.file(id, p)
	switch {
	case err != nil:
		return nil, sandbox.FileInfo{}, err
	case ff == nil:
		return nil, sandbox.FileInfo{}, errdefs.Newf(errdefs.ErrNotFound, "%s: no such file", p)
	case ff.mode.IsDir():
		return nil, sandbox.FileInfo{}, errdefs.Newf(errdefs.ErrInvalidArgument, "%s is a directory", p)
	}
	return io.NopCloser(bytes.NewReader(slices.Clone(ff.data))), info(path.Clean(p), ff), nil
}

// WriteFile implements sandbox.Backend.
func (f *Fake) WriteFile(ctx context.Context, id, p string, opts sandbox.WriteOptions, r io.Reader) (sandbox.FileInfo, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	b, ff, err := f.file(id, p)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	if ff != nil && ff.mode.IsDir() {
		return sandbox.FileInfo{}, errdefs.Newf(errdefs.ErrInvalidArgument, "%s is a directory", p)
	}
	p = path.Clean(p)
	if dir := b.files[path.Dir(p)]; dir == nil || !dir.mode.IsDir() {
		if !opts.MakeParents {
			return sandbox.FileInfo{}, errdefs.Newf(errdefs.ErrNotFound, "%s: no such directory", path.Dir(p))
		}
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if b.files[d] == nil {
				b.files[d] = &fakeFile{mode: fs.ModeDir | 0o755, mod: time.Now()}
			}
		}
	}
	mode := opts.Mode
	if mode == 0 {
		mode = 0o644
	}
	nf := &fakeFile{data: data, mode: mode, uid: opts.UID, gid: opts.GID, mod: time.Now()}
	b.files[p] = nf
	return info(p, nf), nil
}

// Stat implements sandbox.Backend.
func (f *Fake) Stat(ctx context.Context, id, p string) (sandbox.FileInfo, error) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	_, ff, err := f.file(id, p)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	if ff == nil {
		return sandbox.FileInfo{}, errdefs.Newf(errdefs.ErrNotFound, "%s: no such file", p)
	}
	return info(path.Clean(p), ff), nil
}

// ReadDir implements sandbox.Backend.
func (f *Fake) ReadDir(ctx context.Context, id, p string, limit int) ([]sandbox.FileInfo, bool, error) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	b, ff, err := f.file(id, p)
	if err != nil {
		return nil, false, err
	}
	if ff == nil || !ff.mode.IsDir() {
		return nil, false, errdefs.Newf(errdefs.ErrNotFound, "%s: no such directory", p)
	}
	p = path.Clean(p)
	var out []sandbox.FileInfo
	for name, e := range b.files {
		if name != p && path.Dir(name) == p {
			out = append(out, info(name, e))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if limit > 0 && len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

// Mkdir implements sandbox.Backend.
func (f *Fake) Mkdir(ctx context.Context, id, p string, mode fs.FileMode, parents bool, uid, gid uint32) (sandbox.FileInfo, error) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	b, ff, err := f.file(id, p)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	if ff != nil {
		return sandbox.FileInfo{}, errdefs.Newf(errdefs.ErrAlreadyExists, "%s exists", p)
	}
	p = path.Clean(p)
	if b.files[path.Dir(p)] == nil && !parents {
		return sandbox.FileInfo{}, errdefs.Newf(errdefs.ErrNotFound, "%s: no such directory", path.Dir(p))
	}
	for d := p; d != "/" && b.files[d] == nil; d = path.Dir(d) {
		b.files[d] = &fakeFile{mode: fs.ModeDir | mode.Perm(), uid: uid, gid: gid, mod: time.Now()}
	}
	return info(p, b.files[p]), nil
}

// Remove implements sandbox.Backend.
func (f *Fake) Remove(ctx context.Context, id, p string, recursive bool) error {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	b, ff, err := f.file(id, p)
	if err != nil {
		return err
	}
	if ff == nil {
		return errdefs.Newf(errdefs.ErrNotFound, "%s: no such file", p)
	}
	p = path.Clean(p)
	for name := range b.files {
		if strings.HasPrefix(name, p+"/") {
			if !recursive {
				return errdefs.Newf(errdefs.ErrFailedPrecondition, "%s is not empty", p)
			}
			delete(b.files, name)
		}
	}
	delete(b.files, p)
	return nil
}

// Rename implements sandbox.Backend (files only).
func (f *Fake) Rename(ctx context.Context, id, from, to string, overwrite bool) error {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	b, ff, err := f.file(id, from)
	if err != nil {
		return err
	}
	if ff == nil {
		return errdefs.Newf(errdefs.ErrNotFound, "%s: no such file", from)
	}
	to = path.Clean(to)
	if b.files[to] != nil && !overwrite {
		return errdefs.Newf(errdefs.ErrAlreadyExists, "%s exists", to)
	}
	delete(b.files, path.Clean(from))
	b.files[to] = ff
	return nil
}

// DownloadTar implements sandbox.Backend: the tree at p (p itself never
// followed) named relative to p's parent, as the container backend writes
// it. A file whose mode has fs.ModeSymlink is a link to its data; fifos
// are archived, devices and sockets left out.
func (f *Fake) DownloadTar(ctx context.Context, id, p string, w io.Writer) error {
	f.n.mu.Lock()
	b, ff, err := f.file(id, p)
	if err == nil && ff == nil {
		err = errdefs.Newf(errdefs.ErrNotFound, "%s: no such file", p)
	}
	if err != nil {
		f.n.mu.Unlock()
		return err
	}
	p = path.Clean(p)
	type entry struct {
		name string
		ff   fakeFile
	}
	var ents []entry
	for name, e := range b.files {
		if name == p || strings.HasPrefix(name, p+"/") || p == "/" {
			ents = append(ents, entry{name, *e})
		}
	}
	f.n.mu.Unlock()
	sort.Slice(ents, func(i, j int) bool { return ents[i].name < ents[j].name })
	tw := tar.NewWriter(w)
	for _, e := range ents {
		rel := strings.TrimPrefix(e.name, path.Dir(p))
		rel = strings.TrimPrefix(rel, "/")
		h := &tar.Header{Name: rel, Mode: int64(e.ff.mode.Perm()), ModTime: e.ff.mod, Uid: int(e.ff.uid), Gid: int(e.ff.gid), Format: tar.FormatPAX}
		switch m := e.ff.mode; {
		case m.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, rel+"/"
		case m&fs.ModeSymlink != 0:
			h.Typeflag, h.Linkname = tar.TypeSymlink, string(e.ff.data)
		case m&fs.ModeNamedPipe != 0:
			h.Typeflag = tar.TypeFifo
		case m&(fs.ModeDevice|fs.ModeSocket|fs.ModeCharDevice) != 0:
			continue
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.ff.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.ff.data); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// UploadTar implements sandbox.Backend: the archive is read whole and
// checked (relative, clean names), then its entries replace what is at
// their paths under dir; nothing is followed (the fake has no links to
// follow: a link is a file with fs.ModeSymlink).
func (f *Fake) UploadTar(ctx context.Context, id, dir string, r io.Reader, opts sandbox.TarOptions) (sandbox.TarStats, error) {
	type entry struct {
		name string
		ff   *fakeFile
	}
	var ents []entry
	var st sandbox.TarStats
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return sandbox.TarStats{}, errdefs.Newf(errdefs.ErrInvalidArgument, "bad archive: %v", err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		if name == "" || path.IsAbs(name) || path.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../") {
			return sandbox.TarStats{}, errdefs.Newf(errdefs.ErrInvalidArgument, "bad archive: entry %q", h.Name)
		}
		ff := &fakeFile{mode: fs.FileMode(h.Mode).Perm(), uid: opts.UID, gid: opts.GID, mod: h.ModTime}
		switch h.Typeflag {
		case tar.TypeDir:
			ff.mode |= fs.ModeDir
			st.Dirs++
		case tar.TypeSymlink:
			ff.mode |= fs.ModeSymlink
			ff.data = []byte(h.Linkname)
			st.Links++
		case tar.TypeFifo:
			ff.mode |= fs.ModeNamedPipe
			st.Files++
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				return sandbox.TarStats{}, errdefs.Newf(errdefs.ErrInvalidArgument, "bad archive: %v", err)
			}
			ff.data = data
			st.Files++
			st.Bytes += int64(len(data))
		default:
			return sandbox.TarStats{}, errdefs.Newf(errdefs.ErrInvalidArgument, "bad archive: entry %q has type %q", h.Name, h.Typeflag)
		}
		ents = append(ents, entry{name, ff})
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	b, d, err := f.file(id, dir)
	if err != nil {
		return sandbox.TarStats{}, err
	}
	dir = path.Clean(dir)
	if d == nil {
		if !opts.MakeParents {
			return sandbox.TarStats{}, errdefs.Newf(errdefs.ErrNotFound, "%s: no such directory", dir)
		}
		for p := dir; p != "/" && b.files[p] == nil; p = path.Dir(p) {
			b.files[p] = &fakeFile{mode: fs.ModeDir | 0o755, uid: opts.UID, gid: opts.GID, mod: time.Now()}
		}
	} else if !d.mode.IsDir() {
		return sandbox.TarStats{}, errdefs.Newf(errdefs.ErrInvalidArgument, "%s is not a directory", dir)
	}
	for _, e := range ents {
		full := path.Join(dir, e.name)
		if old := b.files[full]; old != nil && old.mode.IsDir() && e.ff.mode.IsDir() {
			continue
		}
		b.files[full] = e.ff
	}
	return st, nil
}
