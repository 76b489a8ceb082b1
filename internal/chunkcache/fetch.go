package chunkcache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// startFetch fetches (or, with onDisk, first checks the kept file of) the
// adjacent chunks run of b, whose entries the caller put in the index in
// stateFetching. The Cache owns the goroutine; the caller has added it to
// c.wg and to the fetches in flight.
func (c *Cache) startFetch(b *Blob, run []int64, onDisk bool) {
	go func() {
		defer c.wg.Done()
		defer c.st.inFlight.Add(-1)
		c.fetchRun(b, run, onDisk)
	}()
}

func (c *Cache) fetchRun(b *Blob, run []int64, onDisk bool) {
	pending := run
	if onDisk {
		pending = pending[:0:0]
		for _, i := range run {
			if size, ok := c.checkKept(b, i); ok {
				c.publish(chunkKey{b.hex, i}, size)
			} else {
				pending = append(pending, i)
			}
		}
	}
	refetched := make(map[int64]bool)
	for len(pending) > 0 {
		var again []int64
		for _, sub := range runs(pending, int64(len(pending))) {
			again = append(again, c.fetchAndStore(b, sub, refetched)...)
		}
		pending = again
	}
}

// fetchAndStore fetches the adjacent chunks sub with one range request,
// stores those that verify and fails the others, except that a corrupt
// chunk not refetched yet is returned to be fetched again.
func (c *Cache) fetchAndStore(b *Blob, sub []int64, refetched map[int64]bool) (again []int64) {
	cs := c.opts.ChunkSize
	off := sub[0] * cs
	end := min(b.size, (sub[len(sub)-1]+1)*cs)
	buf := alignedBuf(int(end - off))
	if err := c.fetchRange(b, buf, off); err != nil {
		err = fmt.Errorf("read blob %s bytes %d-%d: %w: %w", b.digest, off, end-1, ErrIO, err)
		for _, i := range sub {
			c.fail(chunkKey{b.hex, i}, err)
		}
		return nil
	}
	for _, i := range sub {
		data := buf[i*cs-off : min(end, (i+1)*cs)-off]
		k := chunkKey{b.hex, i}
		if b.chunkDigests != nil && digestOf(data) != b.chunkDigests[i] {
			c.st.corrupt.Add(1)
			if !refetched[i] {
				refetched[i] = true
				again = append(again, i)
				continue
			}
			c.log.Warn("chunk cache: corrupt chunk from the blob source", "blob", b.digest, "chunk", i)
			c.fail(k, fmt.Errorf("read blob %s chunk %d: the source sent data that does not match its digest, twice: %w",
				b.digest, i, ErrIO))
			continue
		}
		if err := c.store(k, data); err != nil {
			// The data is good: serve the readers waiting for it from
			// memory rather than fail them; the next read fetches again.
			c.log.Warn("chunk cache: cannot store a chunk", "blob", b.digest, "chunk", i, "err", err)
			c.serveUncached(k, data)
			continue
		}
		c.publish(k, int64(len(data)))
	}
	return again
}

// fetchRange fills buf from the source at off, with FetchTimeout per
// attempt and Retries retries with backoff.
func (c *Cache) fetchRange(b *Blob, buf []byte, off int64) error {
	var err error
	backoff := retryBackoff
	for attempt := 0; attempt <= c.opts.Retries; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-c.bg.Done():
				t.Stop()
				return fmt.Errorf("%w (after: %w)", c.bg.Err(), err)
			}
			backoff *= 2
		}
		ctx, cancel := context.WithTimeout(c.bg, c.opts.FetchTimeout)
		start := time.Now()
		var n int
		n, err = c.src.ReadAt(ctx, b.digest, buf, off)
		cancel()
		c.st.fetched(n, time.Since(start))
		if n == len(buf) && (err == nil || errors.Is(err, io.EOF)) {
			return nil
		}
		c.st.fetchErrors.Add(1)
		if err == nil || errors.Is(err, io.EOF) {
			err = fmt.Errorf("source returned %d of %d bytes: the blob is shorter than its recorded size %d",
				n, len(buf), b.size)
		}
		if errdefs.Is(err, errdefs.ErrNotFound) || errdefs.Is(err, errdefs.ErrInvalidArgument) || c.bg.Err() != nil {
			return err // retrying cannot help
		}
	}
	return err
}

// checkKept checks a chunk kept across a restart: its size and digest.
// A torn chunk's file is removed.
func (c *Cache) checkKept(b *Blob, i int64) (int64, bool) {
	k := chunkKey{b.hex, i}
	want := b.chunkLen(i)
	data := alignedBuf(int(want))
	err := c.readChunk(k, data, 0)
	if err == nil {
		// The file must not be longer either.
		if fi, serr := os.Stat(c.chunkPath(k)); serr != nil {
			err = serr
		} else if fi.Size() != want {
			err = fmt.Errorf("file has %d bytes, want %d", fi.Size(), want)
		}
	}
	if err == nil && (b.chunkDigests == nil || digestOf(data) == b.chunkDigests[i]) {
		return want, true
	}
	c.log.Warn("chunk cache: discarding a torn chunk", "blob", b.digest, "chunk", i, "err", err)
	if err := os.Remove(c.chunkPath(k)); err != nil && !errors.Is(err, os.ErrNotExist) {
		c.log.Warn("chunk cache: remove torn chunk", "err", err)
	}
	return 0, false
}

// store writes a verified chunk to a temporary file and renames it into
// place, first evicting to make room.
func (c *Cache) store(k chunkKey, data []byte) error {
	dir := filepath.Join(c.root, k.blob)
	c.mu.Lock()
	c.cached += int64(len(data)) // reserve, so that eviction makes room for it
	c.evictLocked()
	c.cached -= int64(len(data))
	_, known := c.dirs[dir]
	c.mu.Unlock()
	if !known {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		c.mu.Lock()
		c.dirs[dir] = struct{}{}
		c.mu.Unlock()
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, tmpPrefix+hex.EncodeToString(rnd[:]))
	if err := c.writeFile(tmp, data); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, c.chunkPath(k)); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// publish marks a stored chunk present and wakes its readers.
func (c *Cache) publish(k chunkKey, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.chunks[k]
	e.state, e.verified, e.size = statePresent, true, size
	e.elem = c.lru.PushFront(e)
	c.cached += size
	close(e.done)
	c.evictLocked()
}

// serveUncached drops a chunk that could not be stored and hands its
// verified data to the readers waiting for it.
func (c *Cache) serveUncached(k chunkKey, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.chunks[k]
	delete(c.chunks, k)
	e.mem = data
	close(e.done)
}

// fail drops a chunk whose fetch failed and wakes its readers with err.
func (c *Cache) fail(k chunkKey, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.chunks[k]
	delete(c.chunks, k)
	e.err = err
	close(e.done)
}
