// Package lazyfs presents the data blob of a lazily loaded layer to the
// kernel as one read-only file on its own FUSE connection, so that an EROFS
// mount of the layer's local metadata image can take it as its external
// device (mount option device=). Reads of the file are served by a Blob
// (normally a chunkcache.Blob that fetches verified chunks on first use).
//
// Invariants:
//   - One connection per mounted blob: a fault aborts only that layer.
//   - Node IDs are fixed (the root is 1, the file 2) and nothing is kept per
//     open, so the protocol state can be rebuilt by another server.
//   - The file is opened with FOPEN_DIRECT_IO and FUSE_PASSTHROUGH is never
//     negotiated (EROFS refuses a passthrough file as its source, and
//     direct I/O keeps EROFS's page cache the only copy of the data).
//   - No read blocks forever: each read has a deadline after which it fails
//     with EIO, and a watchdog aborts the connection when a read outlives the
//     deadline by Grace or the kernel's queue stops moving; after an abort
//     every uncached read fails with EIO at once.
package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"
)

// Blob is the data a connection serves.
type Blob interface {
	// ReadAt reads len(p) bytes at off (fewer only at the end of the
	// blob), giving up when ctx ends.
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
}

// FileName is the data file's name in the mount.
const FileName = "data"

// Config configures one connection. The zero value of every field but Dir
// and Size works.
type Config struct {
	// Dir is the mount point; it is created if missing.
	Dir string
	// Size is the blob's length in bytes.
	Size int64
	// ReadTimeout bounds one FUSE read, fetches included; past it the read
	// fails with EIO. Default 30s.
	ReadTimeout time.Duration
	// Grace is how long past ReadTimeout the watchdog waits for a read
	// that ignores its deadline, and how long requests may wait in the
	// kernel with none answered, before it aborts the connection.
	// Default 10s.
	Grace time.Duration
	// Fusectl is where the fusectl file system is mounted (see
	// MountControl); aborts go through it. Default
	// /sys/fs/fuse/connections.
	Fusectl string
	// Readers is the number of goroutines serving requests. Default 4.
	Readers int
	// OnError is called, from a serving goroutine, with every read that
	// failed and once with ErrAborted when the connection is aborted. It
	// must not block.
	OnError func(error)
	// Name labels the mount in /proc/mounts ("dsec-lazy" by default).
	Name   string
	Logger *slog.Logger
}

// ErrAborted is reported when the watchdog aborted a connection.
var ErrAborted = errors.New("lazy layer connection aborted: its blob source stopped answering")

func (c *Config) setDefaults() error {
	if c.Dir == "" {
		return errors.New("lazyfs: no mount directory")
	}
	if c.Size < 0 {
		return fmt.Errorf("lazyfs: negative blob size %d", c.Size)
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = 30 * time.Second
	}
	if c.Grace <= 0 {
		c.Grace = 10 * time.Second
	}
	if c.Fusectl == "" {
		c.Fusectl = "/sys/fs/fuse/connections"
	}
	if c.Readers <= 0 {
		c.Readers = 4
	}
	if c.Name == "" {
		c.Name = "dsec-lazy"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.OnError == nil {
		c.OnError = func(error) {}
	}
	return nil
}

// Stats are a connection's counters.
type Stats struct {
	Reads      int64 // FUSE reads answered
	BytesRead  int64 // bytes they returned
	ReadErrors int64 // reads answered with EIO
	Aborted    bool
}

// ReadError is a failed read of the blob, as given to Config.OnError.
type ReadError struct {
	Off, Len int64
	// Pid is the process whose read the kernel forwarded (in the server's
	// pid namespace; 0 when the kernel read on its own behalf).
	Pid uint32
	Err error
}

func (e *ReadError) Error() string {
	return fmt.Sprintf("read lazy layer data [%d, +%d): %v", e.Off, e.Len, e.Err)
}

func (e *ReadError) Unwrap() error { return e.Err }

// Is makes every ReadError match syscall.EIO, which is what the reader saw.
func (e *ReadError) Is(target error) bool { return target == syscall.EIO }
