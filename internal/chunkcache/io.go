package chunkcache

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// directAlign is the alignment O_DIRECT needs of offsets, lengths and
// buffers.
const directAlign = 4096

// readChunk reads len(p) bytes of chunk k at off.
func (c *Cache) readChunk(k chunkKey, p []byte, off int64) error {
	path := c.chunkPath(k)
	if c.direct.Load() {
		f, err := os.OpenFile(path, os.O_RDONLY|oDirect, 0)
		if err == nil {
			defer f.Close()
			lo := off &^ (directAlign - 1)
			hi := (off + int64(len(p)) + directAlign - 1) &^ (directAlign - 1)
			buf := alignedBuf(int(hi - lo))
			n, err := f.ReadAt(buf, lo)
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			if int64(n) < off-lo+int64(len(p)) {
				return fmt.Errorf("chunk file %s: %w", path, io.ErrUnexpectedEOF)
			}
			copy(p, buf[off-lo:])
			return nil
		}
		if !errors.Is(err, syscall.EINVAL) {
			return err
		}
		c.disableDirect(err)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := f.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = fmt.Errorf("chunk file %s: %w", path, io.ErrUnexpectedEOF)
	}
	return err
}

// writeFile creates path with data, with O_DIRECT when enabled and the
// length allows it.
func (c *Cache) writeFile(path string, data []byte) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	direct := c.direct.Load() && len(data)%directAlign == 0 && isAligned(data)
	if direct {
		f, err := os.OpenFile(path, flags|oDirect, 0o600)
		if err == nil {
			_, err = f.Write(data)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			return err
		}
		if !errors.Is(err, syscall.EINVAL) {
			return err
		}
		c.disableDirect(err)
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (c *Cache) disableDirect(err error) {
	if c.direct.Swap(false) {
		c.log.Warn("chunk cache: the file system refuses O_DIRECT; using buffered I/O", "dir", c.root, "err", err)
	}
}
