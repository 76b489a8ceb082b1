package keeper

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// vault holds the file descriptors of sandboxes that must outlive what
// made them and survive a keeper being replaced: FUSE connections of lazy
// layers, network namespaces, TAP devices, resolver sockets. Drivers put
// a sandbox's fds in by name; the core drops them when the sandbox is
// deleted, and hands all of them to the keeper that replaces this one (at
// an upgrade or a settings change) over SCM_RIGHTS, so the new keeper
// holds the same kernel objects. A crash loses them: what depends on them
// must be recreatable from the sandbox's record.
type vault struct {
	mu sync.Mutex
	// fds by sandbox, then name; guarded by mu.
	fds map[string]map[string]*os.File
}

func newVault() *vault { return &vault{fds: map[string]map[string]*os.File{}} }

// put keeps a duplicate of f as sandbox's name, replacing (and closing)
// one kept before; the caller keeps f.
func (v *vault) put(sandbox, name string, f *os.File) error {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("vault %s/%s: %w", sandbox, name, err)
	}
	v.keep(sandbox, name, os.NewFile(uintptr(fd), sandbox+"/"+name))
	return nil
}

func (v *vault) keep(sandbox, name string, f *os.File) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.fds[sandbox]
	if m == nil {
		m = map[string]*os.File{}
		v.fds[sandbox] = m
	}
	if old := m[name]; old != nil {
		old.Close()
	}
	m[name] = f
}

// get returns sandbox's fd name (the vault's own: do not close it), or nil.
func (v *vault) get(sandbox, name string) *os.File {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.fds[sandbox][name]
}

// drop closes every fd of sandbox.
func (v *vault) drop(sandbox string) {
	v.mu.Lock()
	m := v.fds[sandbox]
	delete(v.fds, sandbox)
	v.mu.Unlock()
	for _, f := range m {
		f.Close()
	}
}

// closeAll closes every fd.
func (v *vault) closeAll() {
	v.mu.Lock()
	all := v.fds
	v.fds = map[string]map[string]*os.File{}
	v.mu.Unlock()
	for _, m := range all {
		for _, f := range m {
			f.Close()
		}
	}
}

// vaultEntry is the header of one fd in a handoff; the fd itself is in
// the message's SCM_RIGHTS. The last message has Done set and no fd.
type vaultEntry struct {
	Sandbox string `json:"sandbox,omitempty"`
	Name    string `json:"name,omitempty"`
	Done    bool   `json:"done,omitempty"`
	Count   int    `json:"count,omitempty"`
}

// send writes every fd to c, one message each, then the end; the vault
// keeps its copies (the sender exits after).
func (v *vault) send(c *net.UnixConn) (int, error) {
	v.mu.Lock()
	type item struct {
		e vaultEntry
		f *os.File
	}
	var items []item
	for sb, m := range v.fds {
		for name, f := range m {
			items = append(items, item{vaultEntry{Sandbox: sb, Name: name}, f})
		}
	}
	v.mu.Unlock()
	sort.Slice(items, func(i, j int) bool {
		return items[i].e.Sandbox+"/"+items[i].e.Name < items[j].e.Sandbox+"/"+items[j].e.Name
	})
	for _, it := range items {
		hdr, _ := json.Marshal(it.e)
		if _, _, err := c.WriteMsgUnix(hdr, unix.UnixRights(int(it.f.Fd())), nil); err != nil {
			return 0, fmt.Errorf("hand over %s/%s: %w", it.e.Sandbox, it.e.Name, err)
		}
	}
	hdr, _ := json.Marshal(vaultEntry{Done: true, Count: len(items)})
	if _, _, err := c.WriteMsgUnix(hdr, nil, nil); err != nil {
		return 0, fmt.Errorf("hand over the vault: %w", err)
	}
	return len(items), nil
}

// receive reads a handoff from c into the vault.
func (v *vault) receive(c *net.UnixConn) (int, error) {
	n := 0
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		nb, noob, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return n, fmt.Errorf("receive the vault: %w", err)
		}
		var e vaultEntry
		if err := json.Unmarshal(buf[:nb], &e); err != nil {
			return n, fmt.Errorf("receive the vault: %w", err)
		}
		var fds []int
		if noob > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:noob])
			if err != nil {
				return n, fmt.Errorf("receive the vault: %w", err)
			}
			for _, m := range msgs {
				got, err := unix.ParseUnixRights(&m)
				if err != nil {
					return n, fmt.Errorf("receive the vault: %w", err)
				}
				fds = append(fds, got...)
			}
		}
		if e.Done {
			for _, fd := range fds {
				unix.Close(fd)
			}
			if e.Count != n {
				return n, fmt.Errorf("receive the vault: %d fds of %d", n, e.Count)
			}
			return n, nil
		}
		if len(fds) != 1 || e.Sandbox == "" || e.Name == "" {
			for _, fd := range fds {
				unix.Close(fd)
			}
			return n, fmt.Errorf("receive the vault: a message of %d fds for %q/%q", len(fds), e.Sandbox, e.Name)
		}
		unix.CloseOnExec(fds[0])
		v.keep(e.Sandbox, e.Name, os.NewFile(uintptr(fds[0]), e.Sandbox+"/"+e.Name))
		n++
	}
}

// handoffSocket is where a keeper that is being replaced waits for its
// successor, to hand it the vault.
func (l Layout) handoffSocket() string { return filepath.Join(l.RunDir(), "handoff.sock") }

// handoffTimeout bounds how long a replaced keeper waits for its successor.
const handoffTimeout = 30 * time.Second

// listenHandoff opens the handoff socket (before the keeper says it will
// hand over, so that the successor finds it).
func (k *Keeper) listenHandoff() (*net.UnixListener, error) {
	p := k.l.handoffSocket()
	_ = os.Remove(p)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("handoff socket: %w", err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// handOver gives the vault to the successor that connects to ln, waiting
// up to handoffTimeout; the keeper's lock must be released first, so that
// the successor can start.
func (k *Keeper) handOver(ln *net.UnixListener) {
	defer os.Remove(k.l.handoffSocket())
	defer ln.Close()
	_ = ln.SetDeadline(time.Now().Add(handoffTimeout))
	c, err := ln.AcceptUnix()
	if err != nil {
		k.log.Error("no keeper took the vault over; its fds are closed", "err", err)
		return
	}
	defer c.Close()
	n, err := k.vault.send(c)
	if err != nil {
		k.log.Error("hand the vault over", "err", err)
		return
	}
	k.log.Info("handed the vault over", "fds", n)
}

// takeOver receives the vault of the keeper this one replaces, when it
// waits on the handoff socket.
func (k *Keeper) takeOver() {
	p := k.l.handoffSocket()
	if _, err := os.Stat(p); err != nil {
		return
	}
	c, err := net.DialTimeout("unix", p, time.Second)
	if err != nil {
		k.log.Warn("a handoff socket nobody listens on", "err", err)
		_ = os.Remove(p)
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(handoffTimeout))
	n, err := k.vault.receive(c.(*net.UnixConn))
	if err != nil {
		k.log.Error("take the vault over", "err", err, "fds", n)
		return
	}
	k.log.Info("took the vault over from the keeper replaced", "fds", n)
}
