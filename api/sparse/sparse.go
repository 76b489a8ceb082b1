// Package sparse carries the holes of sparse files through tar archives.
//
// It is the encoding of the sparse entries in the API's tar streams
// (UploadTar, DownloadTar), so it lives in the API module, where both the
// server and the Go SDK use it without either importing the other; the
// Python SDK writes and reads the same format. It needs only the standard
// library.
//
// A file's data segments are found with SEEK_DATA/SEEK_HOLE (Segments) and
// written as a POSIX PAX entry in the GNU sparse format 1.0 (Writer): a PAX
// extended header with GNU.sparse.major=1, GNU.sparse.minor=0,
// GNU.sparse.name (the file's name) and GNU.sparse.realsize (its apparent
// size), then a ustar header whose data section begins with the sparse map
// (the number of segments, then each segment's offset and length, in
// decimal, one per line, padded to a 512-byte block) followed by the
// segments' bytes. GNU tar, bsdtar and Go's archive/tar read it; Go's
// archive/tar no longer writes it, so the header is encoded here.
//
// The reading side is archive/tar's: it parses and checks the map (at most
// 1 MiB of it; offsets sorted, segments not overlapping and within
// realsize; the data exactly as long as the segments) and yields the file
// with its holes as zeros. Copy writes that back leaving a hole wherever a
// whole block is zero, and sets the size, so a 20 GiB hole costs no disk
// and no I/O at either end, only the time to look at zeros in memory
// (about 50 ms per GiB). Callers bound the apparent size, which the header
// states (tar.Header.Size), before they create anything.
package sparse

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Segment is a run of data of a file; what lies between segments (and past
// the last one, up to the file's size) is a hole.
type Segment struct {
	Offset, Length int64
}

// End returns the offset just past the segment.
func (s Segment) End() int64 { return s.Offset + s.Length }

// MaxSegments bounds the sparse map of an entry: Segments covers the rest of
// a file with more data segments as one segment, holes included.
const MaxSegments = 4096

// BlockSize is the granularity of holes Copy makes.
const BlockSize = 4096

// Holey reports whether segs of a file of size bytes leave any hole, so
// that it is worth writing the file as a sparse entry.
func Holey(segs []Segment, size int64) bool {
	var data int64
	for _, s := range segs {
		data += s.Length
	}
	return data < size
}

// FileError is an error of the file being read (Writer.WriteSparse) or
// written (Copy), as opposed to one of the archive.
type FileError struct{ Err error }

func (e *FileError) Error() string { return e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// Writer is a tar.Writer that also writes sparse entries.
type Writer struct {
	*tar.Writer
	w io.Writer
}

// NewWriter returns a Writer writing to w.
func NewWriter(w io.Writer) *Writer { return &Writer{Writer: tar.NewWriter(w), w: w} }

// WriteSparse writes a regular file as a sparse entry, its data read from
// r at the offsets of segs, and finishes the entry. hdr gives its Name,
// Mode, Uid, Gid, Uname, Gname and ModTime, and its apparent size in Size;
// other fields are ignored. segs must be sorted, not overlap and lie
// within Size, and be at most MaxSegments (Segments returns such). A file
// that shrank meanwhile is padded with zeros, as the header promised its
// data. Errors of r are *FileError; ctx stops the copy.
func (w *Writer) WriteSparse(ctx context.Context, hdr *tar.Header, r io.ReaderAt, segs []Segment) error {
	if err := checkSegments(segs, hdr.Size); err != nil {
		return err
	}
	// The map, padded to a block; a trailing hole is marked by an empty
	// segment at the end, as GNU tar does, so the map alone gives the size.
	if n := len(segs); n == 0 || segs[n-1].End() < hdr.Size {
		segs = append(slices.Clip(segs), Segment{Offset: hdr.Size})
	}
	var m []byte
	m = append(strconv.AppendInt(m, int64(len(segs)), 10), '\n')
	var data int64
	for _, s := range segs {
		m = append(strconv.AppendInt(m, s.Offset, 10), '\n')
		m = append(strconv.AppendInt(m, s.Length, 10), '\n')
		data += s.Length
	}
	m = append(m, make([]byte, padding(int64(len(m))))...)

	blocks, err := headerBlocks(hdr, int64(len(m))+data)
	if err != nil {
		return err
	}
	// Finish the previous entry's padding, then write ours by hand: the
	// tar.Writer stays at an entry boundary and goes on after it.
	if err := w.Flush(); err != nil {
		return err
	}
	if _, err := w.w.Write(blocks); err != nil {
		return err
	}
	if _, err := w.w.Write(m); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for _, s := range segs {
		if err := copySegment(ctx, w.w, r, s, buf); err != nil {
			return err
		}
	}
	_, err = w.w.Write(make([]byte, padding(data)))
	return err
}

// copySegment copies segment s of r to w, padding with zeros what r no
// longer has.
func copySegment(ctx context.Context, w io.Writer, r io.ReaderAt, s Segment, buf []byte) error {
	for off := s.Offset; off < s.End(); {
		if err := ctx.Err(); err != nil {
			return err
		}
		b := buf[:min(int64(len(buf)), s.End()-off)]
		n, err := r.ReadAt(b, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return &FileError{Err: err}
		}
		if n < len(b) {
			clear(b[n:]) // the file shrank: zeros, as promised
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}

// checkSegments checks that segs can describe a file of size bytes.
func checkSegments(segs []Segment, size int64) error {
	if size < 0 {
		return fmt.Errorf("sparse entry: negative size %d", size)
	}
	if len(segs) > MaxSegments {
		return fmt.Errorf("sparse entry: %d segments, more than %d", len(segs), MaxSegments)
	}
	var end int64
	for _, s := range segs {
		if s.Offset < end || s.Length < 0 || s.End() < s.Offset || s.End() > size {
			return fmt.Errorf("sparse entry: segment %d+%d is out of order or outside the %d bytes of the file", s.Offset, s.Length, size)
		}
		end = s.End()
	}
	return nil
}

// Header field limits of ustar (octal, NUL-terminated).
const (
	maxOctal8  = 1<<21 - 1 // 7 octal digits
	maxOctal12 = 1<<33 - 1 // 11 octal digits
)

// headerBlocks encodes the PAX extended header and the ustar header of a
// sparse entry whose data section is size bytes.
func headerBlocks(hdr *tar.Header, size int64) ([]byte, error) {
	name := strings.TrimSuffix(hdr.Name, "/")
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return nil, fmt.Errorf("sparse entry: invalid name %.80q", hdr.Name)
	}
	dir, file := path.Split(name)
	recs := map[string]string{
		"GNU.sparse.major":    "1",
		"GNU.sparse.minor":    "0",
		"GNU.sparse.name":     name,
		"GNU.sparse.realsize": strconv.FormatInt(hdr.Size, 10),
		"mtime":               paxTime(hdr.ModTime),
	}
	var ustar block
	ustar.setString(0, 100, path.Join(dir, "GNUSparseFile.0", file))
	ustar.setOctal(100, 8, hdr.Mode&0o7777)
	for _, f := range []struct {
		off, n int
		v      int64
		max    int64
		key    string
	}{
		{108, 8, int64(hdr.Uid), maxOctal8, "uid"},
		{116, 8, int64(hdr.Gid), maxOctal8, "gid"},
		{124, 12, size, maxOctal12, "size"},
		{136, 12, hdr.ModTime.Unix(), maxOctal12, ""},
	} {
		switch {
		case f.v >= 0 && f.v <= f.max:
			ustar.setOctal(f.off, f.n, f.v)
		case f.key != "":
			ustar.setOctal(f.off, f.n, 0)
			recs[f.key] = strconv.FormatInt(f.v, 10)
		default:
			ustar.setOctal(f.off, f.n, 0) // mtime: the PAX record has it
		}
	}
	for _, f := range []struct {
		off int
		v   string
		key string
	}{{265, hdr.Uname, "uname"}, {297, hdr.Gname, "gname"}} {
		if len(f.v) < 32 {
			ustar.setString(f.off, 32, f.v)
		} else {
			recs[f.key] = f.v
		}
	}
	ustar[156] = tar.TypeReg
	ustar.setUstar()

	var pax strings.Builder
	for _, k := range slices.Sorted(mapKeys(recs)) {
		pax.WriteString(paxRecord(k, recs[k]))
	}
	var x block
	x.setString(0, 100, path.Join(dir, "PaxHeaders.0", file))
	x.setOctal(100, 8, 0o644)
	x.setOctal(108, 8, 0)
	x.setOctal(116, 8, 0)
	x.setOctal(124, 12, int64(pax.Len()))
	x.setOctal(136, 12, 0)
	x[156] = tar.TypeXHeader
	x.setUstar()

	out := make([]byte, 0, 3*blockLen+pax.Len())
	out = append(out, x[:]...)
	out = append(out, pax.String()...)
	out = append(out, make([]byte, padding(int64(pax.Len())))...)
	return append(out, ustar[:]...), nil
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// paxTime formats t as PAX does: seconds, and a fraction when there is one.
func paxTime(t time.Time) string {
	sec, nsec := t.Unix(), t.Nanosecond()
	if nsec == 0 {
		return strconv.FormatInt(sec, 10)
	}
	sign := ""
	if sec < 0 {
		sign, sec, nsec = "-", -sec-1, 1e9-nsec
	}
	return strings.TrimRight(fmt.Sprintf("%s%d.%09d", sign, sec, nsec), "0")
}

// paxRecord formats one record, "LEN KEY=VALUE\n", LEN counting itself.
func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	for {
		s := strconv.Itoa(n) + " " + k + "=" + v + "\n"
		if len(s) == n {
			return s
		}
		n = len(s)
	}
}

const blockLen = 512

// padding returns the zeros that complete n bytes to a block.
func padding(n int64) int64 { return -n & (blockLen - 1) }

type block [blockLen]byte

// setString stores s in the n bytes at off, cut to fit with a NUL.
func (b *block) setString(off, n int, s string) {
	if len(s) > n {
		s = s[len(s)-n:] // the end of a name says more than its start
	}
	copy(b[off:off+n], s)
}

// setOctal stores v in octal in the n bytes at off, NUL-terminated.
func (b *block) setOctal(off, n int, v int64) {
	s := strconv.FormatInt(v, 8)
	s = strings.Repeat("0", n-1-len(s)) + s
	copy(b[off:], s)
	b[off+n-1] = 0
}

// setUstar sets the POSIX magic and version and the checksum.
func (b *block) setUstar() {
	copy(b[257:], "ustar\x0000")
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	s := strconv.FormatInt(sum, 8)
	copy(b[148:], strings.Repeat("0", 6-len(s))+s+"\x00 ")
}

// File is what Copy writes: an *os.File.
type File interface {
	io.WriterAt
	Truncate(size int64) error
}

// Copy copies src to dst, an empty file, from its start: blocks of
// BlockSize bytes that are all zero are skipped, leaving holes, and the
// size is set to what src yielded. It returns that size. Errors of dst are
// *FileError.
func Copy(dst File, src io.Reader) (int64, error) {
	buf := make([]byte, copyBuf)
	var off int64
	for {
		n, rerr := io.ReadFull(src, buf)
		if err := writeData(dst, buf[:n], off); err != nil {
			return off, err
		}
		off += int64(n)
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return off, rerr
		}
	}
	if err := dst.Truncate(off); err != nil {
		return off, &FileError{Err: err}
	}
	return off, nil
}

// copyBuf is Copy's buffer size; zeros is a buffer of zeros as large.
const copyBuf = 256 << 10

var zeros [copyBuf]byte

var zeroBlock = zeros[:BlockSize]

// writeData writes the runs of b (at offset off of the file, a multiple of
// BlockSize) that are not whole zero blocks.
func writeData(dst File, b []byte, off int64) error {
	if bytes.Equal(b, zeros[:len(b)]) {
		return nil // all hole: the common case of a sparse file, at memory speed
	}
	for i := 0; i < len(b); {
		j := min(i+BlockSize, len(b))
		if bytes.Equal(b[i:j], zeroBlock[:j-i]) {
			i = j
			continue
		}
		k := j
		for k < len(b) {
			e := min(k+BlockSize, len(b))
			if bytes.Equal(b[k:e], zeroBlock[:e-k]) {
				break
			}
			k = e
		}
		if _, err := dst.WriteAt(b[i:k], off+int64(i)); err != nil {
			return &FileError{Err: err}
		}
		i = k
	}
	return nil
}
