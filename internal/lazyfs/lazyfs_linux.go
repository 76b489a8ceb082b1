package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Fixed node IDs: no lookup state, so a server that takes over knows them.
const (
	rootID = 1
	fileID = 2
)

// maxIO is the largest read the connection negotiates (max_read and
// max_pages), the size of one FUSE reply.
const maxIO = 1 << 20

// Conn is one mounted blob.
type Conn struct {
	cfg  Config
	blob Blob
	fd   int    // /dev/fuse, closed by Close after the serving goroutines end
	conn uint32 // fusectl connection number: the mount's device minor
	ps   *fuse.ProtocolServer

	wg       sync.WaitGroup // serving goroutines and the watchdog
	stop     chan struct{}  // closed by Close
	stopOnce sync.Once

	answered                   atomic.Int64 // requests answered, for the watchdog
	reads, bytesRead, readErrs atomic.Int64
	aborted                    atomic.Bool

	mu sync.Mutex
	// guarded by mu
	inflight map[uint64]time.Time // request unique → start, for reads
}

// Mount mounts a FUSE connection at cfg.Dir serving blob as Dir/FileName
// and starts serving it. Close unmounts it.
func Mount(cfg Config, blob Blob) (*Conn, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("lazyfs: %w", err)
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("lazyfs: open /dev/fuse: %w", err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,max_read=%d", fd, maxIO)
	if err := mountRetry(cfg.Name, cfg.Dir, "fuse."+cfg.Name, unix.MS_NODEV|unix.MS_NOSUID|unix.MS_RDONLY, opts); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lazyfs: mount fuse at %s: %w", cfg.Dir, err)
	}
	c := &Conn{
		cfg: cfg, blob: blob, fd: fd,
		stop: make(chan struct{}), inflight: map[uint64]time.Time{},
	}
	if c.conn, err = mountMinor(cfg.Dir); err != nil {
		unix.Close(fd)
		_ = unmount(cfg.Dir)
		return nil, fmt.Errorf("lazyfs: %w", err)
	}
	mo := &fuse.MountOptions{
		MaxWrite: maxIO, MaxReadAhead: maxIO, MaxBackground: 64,
		// EROFS refuses a file on a passthrough connection as its
		// source, and passthrough would bypass the deadlines.
		DisabledCapabilities: fuse.CAP_PASSTHROUGH,
	}
	c.ps = fuse.NewProtocolServer(&blobFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), c: c}, mo)
	for range cfg.Readers {
		c.wg.Add(1)
		go c.serve()
	}
	c.wg.Add(1)
	go c.watchdog()
	return c, nil
}

// Path is the data file, to give to EROFS as device=.
func (c *Conn) Path() string { return filepath.Join(c.cfg.Dir, FileName) }

// Stats returns the connection's counters.
func (c *Conn) Stats() Stats {
	return Stats{Reads: c.reads.Load(), BytesRead: c.bytesRead.Load(), ReadErrors: c.readErrs.Load(), Aborted: c.aborted.Load()}
}

// Abort ends the connection: every read not answered yet, and every later
// one, fails with EIO; cached pages stay readable. The mount stays until
// Close.
func (c *Conn) Abort() {
	if !c.aborted.CompareAndSwap(false, true) {
		return
	}
	if err := c.abort(); err != nil {
		c.cfg.Logger.Warn("lazyfs: abort through fusectl", "conn", c.conn, "err", err)
	}
}

func (c *Conn) abort() error {
	p := filepath.Join(c.cfg.Fusectl, strconv.FormatUint(uint64(c.conn), 10), "abort")
	return os.WriteFile(p, []byte("1"), 0)
}

// Close unmounts the file system, ends the connection and waits for its
// goroutines. The caller unmounts whatever uses the file first. It is
// idempotent.
func (c *Conn) Close() error {
	var err error
	c.stopOnce.Do(func() {
		close(c.stop)
		// Unmounting ends the connection when nothing holds it any
		// more; the abort covers a mount that lingers. Either way the
		// serving goroutines get ENODEV.
		_ = c.abort()
		err = unmount(c.cfg.Dir)
		c.wg.Wait()
		unix.Close(c.fd)
		if rerr := os.Remove(c.cfg.Dir); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
			err = fmt.Errorf("lazyfs: %w", rerr)
		}
	})
	return err
}

// serve reads requests and answers them until the connection ends.
func (c *Conn) serve() {
	defer c.wg.Done()
	in := make([]byte, maxIO+64<<10)
	out := make([]byte, maxIO+64<<10)
	for {
		n, err := unix.Read(c.fd, in)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.ENOENT):
			continue // interrupted, or a request the kernel withdrew
		case errors.Is(err, unix.ENODEV):
			return // unmounted or aborted
		default:
			c.cfg.Logger.Warn("lazyfs: read /dev/fuse", "dir", c.cfg.Dir, "err", err)
			return
		}
		m, st := c.ps.HandleRequest([][]byte{in[:n]}, [][]byte{out})
		c.answered.Add(1)
		if !st.Ok() || m == 0 {
			continue // FORGET and friends have no reply
		}
		if _, err := unix.Write(c.fd, out[:m]); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINTR) {
			if errors.Is(err, unix.ENODEV) {
				return
			}
			c.cfg.Logger.Warn("lazyfs: write reply", "dir", c.cfg.Dir, "err", err)
		}
	}
}

// watchdogInterval is how often the watchdog looks.
const watchdogInterval = time.Second

// watchdog aborts the connection when a read outlives its deadline by
// Grace (a Blob that ignores its context) or when requests wait in the
// kernel for Grace with none answered (serving goroutines stuck).
func (c *Conn) watchdog() {
	defer c.wg.Done()
	t := time.NewTicker(watchdogInterval)
	defer t.Stop()
	lastAnswered, lastMove := c.answered.Load(), time.Now()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		if c.aborted.Load() {
			return
		}
		now := time.Now()
		if a := c.answered.Load(); a != lastAnswered {
			lastAnswered, lastMove = a, now
		}
		var oldest time.Time
		c.mu.Lock()
		for _, s := range c.inflight {
			if oldest.IsZero() || s.Before(oldest) {
				oldest = s
			}
		}
		c.mu.Unlock()
		reason := ""
		switch {
		case !oldest.IsZero() && now.Sub(oldest) > c.cfg.ReadTimeout+c.cfg.Grace:
			reason = fmt.Sprintf("a read has waited %v", now.Sub(oldest).Round(time.Millisecond))
		case now.Sub(lastMove) > c.cfg.Grace && c.waiting() > 0:
			reason = fmt.Sprintf("requests waited %v with none answered", now.Sub(lastMove).Round(time.Millisecond))
		}
		if reason != "" {
			c.cfg.Logger.Warn("lazyfs: aborting connection", "dir", c.cfg.Dir, "reason", reason)
			// Reported first, so that whoever sees the EIO can find why.
			c.cfg.OnError(fmt.Errorf("%w (%s)", ErrAborted, reason))
			c.Abort()
			return
		}
	}
}

// waiting is fusectl's count of requests the kernel holds for the server;
// 0 when fusectl is not available.
func (c *Conn) waiting() int {
	b, err := os.ReadFile(filepath.Join(c.cfg.Fusectl, strconv.FormatUint(uint64(c.conn), 10), "waiting"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// read serves one FUSE read of the file.
func (c *Conn) read(unique uint64, pid uint32, p []byte, off int64) (int, error) {
	if off >= c.cfg.Size {
		return 0, nil
	}
	p = p[:min(int64(len(p)), c.cfg.Size-off)]
	c.mu.Lock()
	c.inflight[unique] = time.Now()
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.inflight, unique)
		c.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ReadTimeout)
	defer cancel()
	n, err := c.blob.ReadAt(ctx, p, off)
	if err == nil && n < len(p) {
		err = fmt.Errorf("short read: %d of %d bytes", n, len(p))
	}
	if err != nil {
		c.readErrs.Add(1)
		c.cfg.OnError(&ReadError{Off: off, Len: int64(len(p)), Pid: pid, Err: err})
		return 0, err
	}
	c.reads.Add(1)
	c.bytesRead.Add(int64(n))
	return n, nil
}

// blobFS answers the few operations the kernel and EROFS need.
type blobFS struct {
	fuse.RawFileSystem
	c *Conn
}

func (f *blobFS) attr(id uint64, a *fuse.Attr) bool {
	switch id {
	case rootID:
		*a = fuse.Attr{Ino: rootID, Mode: syscall.S_IFDIR | 0o555, Nlink: 2}
	case fileID:
		size := uint64(f.c.cfg.Size)
		*a = fuse.Attr{Ino: fileID, Mode: syscall.S_IFREG | 0o444, Nlink: 1, Size: size, Blocks: (size + 511) / 512, Blksize: 4096}
	default:
		return false
	}
	return true
}

func (f *blobFS) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if h.NodeId != rootID || name != FileName {
		return fuse.ENOENT
	}
	out.NodeId = fileID
	out.SetEntryTimeout(time.Hour)
	out.SetAttrTimeout(time.Hour)
	f.attr(fileID, &out.Attr)
	return fuse.OK
}

func (f *blobFS) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if !f.attr(in.NodeId, &out.Attr) {
		return fuse.ENOENT
	}
	out.SetTimeout(time.Hour)
	return fuse.OK
}

func (f *blobFS) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if in.NodeId != fileID {
		return fuse.EISDIR
	}
	if in.Flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return fuse.EROFS
	}
	out.OpenFlags = fuse.FOPEN_DIRECT_IO
	return fuse.OK
}

func (f *blobFS) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, _ *fuse.OpenOut) fuse.Status {
	if in.NodeId != rootID {
		return fuse.ENOTDIR
	}
	return fuse.OK
}

func (f *blobFS) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if in.Offset == 0 {
		out.AddDirEntry(fuse.DirEntry{Name: FileName, Ino: fileID, Mode: syscall.S_IFREG})
	}
	return fuse.OK
}

func (f *blobFS) Release(<-chan struct{}, *fuse.ReleaseIn) {}
func (f *blobFS) ReleaseDir(*fuse.ReleaseIn)               {}

func (f *blobFS) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	*out = fuse.StatfsOut{Bsize: 4096, NameLen: 255}
	return fuse.OK
}

func (f *blobFS) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	if in.NodeId != fileID {
		return nil, fuse.EISDIR
	}
	n, err := f.c.read(in.Unique, in.Pid, buf[:min(int(in.Size), len(buf))], int64(in.Offset))
	if err != nil {
		return nil, fuse.EIO
	}
	return fuse.ReadResultData(buf[:n]), fuse.OK
}

// MountControl mounts fusectl at dir (the file system is one superblock, so
// this does not disturb /sys/fs/fuse/connections). Unmount it with
// UnmountControl.
func MountControl(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("fusectl: %w", err)
	}
	_ = unmount(dir) // a mount left by an earlier process
	if err := mountRetry("fusectl", dir, "fusectl", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount fusectl: %w", err)
	}
	return nil
}

// UnmountControl undoes MountControl; it is idempotent.
func UnmountControl(dir string) error { return unmount(dir) }

// Cleanup removes mounts an earlier process left under dir (FUSE mounts
// whose server is gone); mounts stacked on them must be gone first.
func Cleanup(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("lazyfs: %w", err)
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if err := unmount(p); err != nil {
			errs = append(errs, err)
			continue
		}
		_ = os.Remove(p)
	}
	return errors.Join(errs...)
}

// mountMinor finds the device minor (the fusectl connection number) of
// the mount at dir in /proc/self/mountinfo; stat would ask the server.
func mountMinor(dir string) (uint32, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	var found uint32
	ok := false
	for l := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && f[4] == dir {
			_, minor, cut := strings.Cut(f[2], ":")
			if !cut {
				continue
			}
			n, err := strconv.ParseUint(minor, 10, 32)
			if err != nil {
				return 0, fmt.Errorf("mountinfo of %s: %w", dir, err)
			}
			found, ok = uint32(n), true // the last one is on top
		}
	}
	if !ok {
		return 0, fmt.Errorf("%s: not in mountinfo", dir)
	}
	return found, nil
}

func mountRetry(src, dst, fstype string, flags uintptr, data string) error {
	for {
		err := unix.Mount(src, dst, fstype, flags, data)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// unmount detaches every mount at path; none is success.
func unmount(path string) error {
	for {
		err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default:
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
}
