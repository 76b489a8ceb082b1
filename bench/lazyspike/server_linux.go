package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The FUSE server: one read-only file, "layer", whose bytes are a blob of
// the simulated remote store, fetched in whole chunks on first read into a
// node-local chunk cache (one sparse file plus a presence map, both shared
// with a server that takes over). It runs in a child process (-serve) so
// that the fault tests can kill it; the parent, playing the keeper, opened
// /dev/fuse, mounted it, and passes the descriptor as fd 3.
//
// The server speaks the protocol through go-fuse's ProtocolServer on a
// descriptor it did not open, which lets a second process take over a
// mounted connection: it replays the kernel's INIT request (saved by the
// first server and handed over by the keeper) to set up its own protocol
// state without a reply, then asks the kernel to resend the requests the
// dead server had read but not answered (FUSE_NOTIFY_RESEND, Linux 6.9).

// Node IDs are fixed, so that a server that takes over a mount knows them.
const (
	rootID  = 1
	layerID = 2
	// fileName is the blob's name in the FUSE mount.
	fileName = "layer"
)

// FUSE protocol numbers the server needs beyond go-fuse's API.
const (
	opInit            = 26
	notifyResend      = 7       // FUSE_NOTIFY_RESEND
	capRequestTimeout = 1 << 42 // FUSE_REQUEST_TIMEOUT, in InitOut.Flags2 bit 10
	capInitExt        = 1 << 30 // FUSE_INIT_EXT
	outHeaderSize     = 16
)

// serverConfig is what a server child is told on its command line.
type serverConfig struct {
	blob      string        // the remote blob (a local file read slowly)
	cache     string        // chunk cache data file; cache+".map" is the presence map
	chunk     int64         // chunk size
	latency   time.Duration // per remote request
	bandwidth int64         // bytes/s of the remote, 0 = unlimited
	directIO  bool          // answer OPEN with FOPEN_DIRECT_IO
	timeout   int           // FUSE request timeout to ask the kernel for, seconds (0 = none)
	initReq   string        // hex of the INIT request, when taking over
	readers   int           // goroutines reading /dev/fuse
	// passthrough lets the server negotiate FUSE_PASSTHROUGH (go-fuse
	// does by default, with a stack depth of 1); the spike turns it off,
	// see mountChecks.
	passthrough bool
	// cacheDirect reads and writes the chunk cache file with O_DIRECT, so
	// that the server adds no page-cache copy of its own.
	cacheDirect bool
}

// remote is the simulated shared store: a local file read with a latency
// per request and a bandwidth cap shared by all requests.
type remote struct {
	f       *os.File
	latency time.Duration
	bw      int64

	mu sync.Mutex
	// guarded by mu
	busyUntil time.Time // when the link is free again
}

func (r *remote) readAt(p []byte, off int64) (int, error) {
	time.Sleep(r.latency)
	if r.bw > 0 {
		d := time.Duration(float64(len(p)) / float64(r.bw) * float64(time.Second))
		r.mu.Lock()
		start := time.Now()
		if r.busyUntil.After(start) {
			start = r.busyUntil
		}
		r.busyUntil = start.Add(d)
		end := r.busyUntil
		r.mu.Unlock()
		time.Sleep(time.Until(end))
	}
	return r.f.ReadAt(p, off)
}

// chunkCache is the node-local cache of one blob: a sparse file of the
// blob's size and a presence map, one byte per chunk, set after the
// chunk's data is written (both shared with a server that takes over).
type chunkCache struct {
	data    *os.File
	direct  bool   // data is open with O_DIRECT: aligned buffers, offsets and lengths
	present []byte // mmap of the presence map
	size    int64
	chunk   int64
	remote  *remote

	hang chan struct{} // closed = fetches proceed; replaced by an open one to hang

	hangMu sync.Mutex // guards hang

	fetchMu sync.Mutex
	// guarded by fetchMu
	fetching map[int64]chan struct{} // chunk → done, for chunks being fetched

	chunksFetched, bytesFetched, hits, reads, bytesServed atomic.Int64
	fetchNanos                                            atomic.Int64
}

func openCache(cfg serverConfig) (*chunkCache, error) {
	bf, err := os.Open(cfg.blob)
	if err != nil {
		return nil, err
	}
	st, err := bf.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	flags := os.O_RDWR | os.O_CREATE
	if cfg.cacheDirect {
		flags |= syscall.O_DIRECT
	}
	data, err := os.OpenFile(cfg.cache, flags, 0o600)
	if err != nil {
		return nil, err
	}
	if err := data.Truncate(size); err != nil {
		return nil, err
	}
	n := (size + cfg.chunk - 1) / cfg.chunk
	mf, err := os.OpenFile(cfg.cache+".map", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer mf.Close()
	if err := mf.Truncate(n); err != nil {
		return nil, err
	}
	present, err := unix.Mmap(int(mf.Fd()), 0, int(max(n, 1)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	c := &chunkCache{
		data: data, direct: cfg.cacheDirect, present: present, size: size, chunk: cfg.chunk,
		remote:   &remote{f: bf, latency: cfg.latency, bw: cfg.bandwidth},
		hang:     make(chan struct{}),
		fetching: map[int64]chan struct{}{},
	}
	close(c.hang)
	return c, nil
}

// ensure makes chunk i present, fetching it once however many readers
// want it.
func (c *chunkCache) ensure(i int64) error {
	if c.present[i] == 1 {
		c.hits.Add(1)
		return nil
	}
	c.fetchMu.Lock()
	if c.present[i] == 1 {
		c.fetchMu.Unlock()
		c.hits.Add(1)
		return nil
	}
	if done, ok := c.fetching[i]; ok {
		c.fetchMu.Unlock()
		<-done
		if c.present[i] != 1 {
			return syscall.EIO
		}
		return nil
	}
	done := make(chan struct{})
	c.fetching[i] = done
	c.fetchMu.Unlock()
	defer func() {
		c.fetchMu.Lock()
		delete(c.fetching, i)
		c.fetchMu.Unlock()
		close(done)
	}()

	c.hangMu.Lock()
	h := c.hang
	c.hangMu.Unlock()
	<-h // a hung remote: blocks until the process dies

	off := i * c.chunk
	n := min(c.chunk, c.size-off)
	buf := alignedBuf(roundUp(n))
	start := time.Now()
	if _, err := c.remote.readAt(buf[:n], off); err != nil {
		return err
	}
	if !c.direct {
		buf = buf[:n]
	}
	if _, err := c.data.WriteAt(buf, off); err != nil {
		return err
	}
	c.present[i] = 1
	c.fetchNanos.Add(int64(time.Since(start)))
	c.chunksFetched.Add(1)
	c.bytesFetched.Add(n)
	return nil
}

func (c *chunkCache) readAt(p []byte, off int64) (int, error) {
	if off >= c.size {
		return 0, nil
	}
	p = p[:min(int64(len(p)), c.size-off)]
	for i := off / c.chunk; i*c.chunk < off+int64(len(p)); i++ {
		if err := c.ensure(i); err != nil {
			return 0, err
		}
	}
	c.reads.Add(1)
	c.bytesServed.Add(int64(len(p)))
	if !c.direct {
		return c.data.ReadAt(p, off)
	}
	start := off &^ (dioAlign - 1)
	buf := alignedBuf(roundUp(off + int64(len(p)) - start))
	if _, err := c.data.ReadAt(buf, start); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	return copy(p, buf[off-start:]), nil
}

// dioAlign is the alignment O_DIRECT needs of buffers, offsets and lengths.
const dioAlign = 4096

func roundUp(n int64) int64 { return (n + dioAlign - 1) &^ (dioAlign - 1) }

func alignedBuf(n int64) []byte {
	b := make([]byte, n+dioAlign)
	a := int(dioAlign - uintptr(unsafe.Pointer(&b[0]))&(dioAlign-1))
	return b[a%dioAlign : a%dioAlign+int(n)]
}

type serverStats struct {
	ChunksFetched int64 `json:"chunks_fetched"`
	BytesFetched  int64 `json:"bytes_fetched"`
	ChunkHits     int64 `json:"chunk_hits"`
	Reads         int64 `json:"fuse_reads"`
	BytesServed   int64 `json:"bytes_served"`
	FetchMillis   int64 `json:"fetch_ms"`
}

func (c *chunkCache) stats() serverStats {
	return serverStats{
		ChunksFetched: c.chunksFetched.Load(), BytesFetched: c.bytesFetched.Load(),
		ChunkHits: c.hits.Load(), Reads: c.reads.Load(), BytesServed: c.bytesServed.Load(),
		FetchMillis: c.fetchNanos.Load() / 1e6,
	}
}

// blobFS is the file system: a root directory holding "layer". It keeps
// no per-open state, so a server that takes over serves the same IDs.
type blobFS struct {
	fuse.RawFileSystem
	c        *chunkCache
	directIO bool
}

func (f *blobFS) attr(id uint64, a *fuse.Attr) bool {
	switch id {
	case rootID:
		*a = fuse.Attr{Ino: rootID, Mode: syscall.S_IFDIR | 0o555, Nlink: 2}
	case layerID:
		*a = fuse.Attr{Ino: layerID, Mode: syscall.S_IFREG | 0o444, Nlink: 1, Size: uint64(f.c.size),
			Blocks: uint64(f.c.size+511) / 512, Blksize: 4096}
	default:
		return false
	}
	return true
}

func (f *blobFS) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if h.NodeId != rootID || name != fileName {
		return fuse.ENOENT
	}
	out.NodeId = layerID
	out.SetEntryTimeout(time.Hour)
	out.SetAttrTimeout(time.Hour)
	f.attr(layerID, &out.Attr)
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
	if in.NodeId != layerID {
		return fuse.EISDIR
	}
	if in.Flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return fuse.EROFS
	}
	if f.directIO {
		out.OpenFlags = fuse.FOPEN_DIRECT_IO
	} else {
		out.OpenFlags = fuse.FOPEN_KEEP_CACHE
	}
	return fuse.OK
}

func (f *blobFS) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, _ *fuse.OpenOut) fuse.Status {
	if in.NodeId != rootID {
		return fuse.ENOTDIR
	}
	return fuse.OK
}

func (f *blobFS) Release(<-chan struct{}, *fuse.ReleaseIn) {}
func (f *blobFS) ReleaseDir(*fuse.ReleaseIn)               {}

func (f *blobFS) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	n, err := f.c.readAt(buf[:in.Size], int64(in.Offset))
	if err != nil {
		return nil, fuse.EIO
	}
	return fuse.ReadResultData(buf[:n]), fuse.OK
}

// serveMain is the -serve child: it serves fd 3 until the connection ends,
// answering "stats" and "hang" commands on stdin.
func serveMain(args []string) error {
	var cfg serverConfig
	fl := flag.NewFlagSet("serve", flag.ContinueOnError)
	fl.StringVar(&cfg.blob, "blob", "", "")
	fl.StringVar(&cfg.cache, "cache", "", "")
	fl.Int64Var(&cfg.chunk, "chunk", 1<<20, "")
	fl.DurationVar(&cfg.latency, "latency", 0, "")
	fl.Int64Var(&cfg.bandwidth, "bandwidth", 0, "")
	fl.BoolVar(&cfg.directIO, "direct-io", false, "")
	fl.IntVar(&cfg.timeout, "timeout", 0, "")
	fl.StringVar(&cfg.initReq, "init", "", "")
	fl.IntVar(&cfg.readers, "readers", 8, "")
	fl.BoolVar(&cfg.passthrough, "passthrough", false, "")
	fl.BoolVar(&cfg.cacheDirect, "cache-odirect", false, "")
	if err := fl.Parse(args); err != nil {
		return err
	}
	c, err := openCache(cfg)
	if err != nil {
		return err
	}
	fsys := &blobFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), c: c, directIO: cfg.directIO}
	mo := &fuse.MountOptions{MaxWrite: 1 << 20, MaxBackground: 64, MaxReadAhead: 1 << 20}
	if !cfg.passthrough {
		mo.DisabledCapabilities = fuse.CAP_PASSTHROUGH
	}
	ps := fuse.NewProtocolServer(fsys, mo)
	const fd = 3

	var outMu sync.Mutex
	say := func(format string, a ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", a...)
	}

	if cfg.initReq != "" {
		// Takeover: rebuild the protocol state from the saved INIT without
		// answering it, then have the kernel resend what the dead server
		// had read and not answered.
		in, err := hex.DecodeString(cfg.initReq)
		if err != nil {
			return err
		}
		out := make([]byte, 4096)
		if _, st := ps.HandleRequest([][]byte{in}, [][]byte{out}); !st.Ok() {
			return fmt.Errorf("replay INIT: %v", st)
		}
		var n [outHeaderSize]byte
		binary.LittleEndian.PutUint32(n[0:], outHeaderSize)
		binary.LittleEndian.PutUint32(n[4:], notifyResend)
		if _, err := unix.Write(fd, n[:]); err != nil {
			say("resend %v", err)
		} else {
			say("resend ok")
		}
	}

	done := make(chan error, cfg.readers)
	for range cfg.readers {
		go func() { done <- serveLoop(fd, ps, cfg, say) }()
	}
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			switch sc.Text() {
			case "stats":
				b, _ := json.Marshal(c.stats())
				say("stats %s", b)
			case "hang":
				c.hangMu.Lock()
				c.hang = make(chan struct{})
				c.hangMu.Unlock()
				say("hanging")
			}
		}
		os.Exit(0) // the keeper went away
	}()
	say("ready")
	return <-done
}

// serveLoop reads requests from the FUSE device and answers them until the
// connection ends (ENODEV: unmounted or aborted).
func serveLoop(fd int, ps *fuse.ProtocolServer, cfg serverConfig, say func(string, ...any)) error {
	in := make([]byte, 1<<20+64<<10)
	out := make([]byte, 1<<20+64<<10)
	for {
		n, err := unix.Read(fd, in)
		switch {
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ENOENT):
			continue
		case errors.Is(err, unix.ENODEV):
			return nil
		case err != nil:
			return fmt.Errorf("read /dev/fuse: %w", err)
		}
		req := in[:n]
		isInit := n >= 8 && binary.LittleEndian.Uint32(req[4:8]) == opInit
		if isInit {
			say("init %s", hex.EncodeToString(req))
		}
		m, st := ps.HandleRequest([][]byte{req}, [][]byte{out})
		if !st.Ok() || m == 0 {
			continue
		}
		if isInit && cfg.timeout > 0 && m >= outHeaderSize+42 {
			// go-fuse does not offer FUSE_INIT's request_timeout (Linux
			// 6.14): set it in the reply.
			io := out[outHeaderSize:]
			flags := binary.LittleEndian.Uint32(io[12:]) | capInitExt
			binary.LittleEndian.PutUint32(io[12:], flags)
			flags2 := binary.LittleEndian.Uint32(io[32:]) | capRequestTimeout>>32
			binary.LittleEndian.PutUint32(io[32:], flags2)
			binary.LittleEndian.PutUint16(io[40:], uint16(cfg.timeout))
		}
		if _, err := unix.Write(fd, out[:m]); err != nil && !errors.Is(err, unix.ENOENT) {
			if errors.Is(err, unix.ENODEV) {
				return nil
			}
			say("write %v", err)
		}
	}
}
