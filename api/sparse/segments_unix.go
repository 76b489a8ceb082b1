//go:build linux || darwin || freebsd

package sparse

import (
	"errors"
	"os"
	"syscall"
)

// Segments returns the data segments of the first size bytes of f, as
// SEEK_DATA and SEEK_HOLE report them, at most MaxSegments: past that, the
// rest of the file is one segment, holes included. A file system that cannot
// tell reports the whole file as data. The file offset of f is left
// anywhere; read it with ReadAt.
func Segments(f *os.File, size int64) ([]Segment, error) {
	var segs []Segment
	for off := int64(0); off < size; {
		d, err := f.Seek(off, seekData)
		switch {
		case errors.Is(err, syscall.ENXIO):
			return segs, nil // a hole to the end
		case errors.Is(err, syscall.EINVAL) && off == 0:
			return []Segment{{0, size}}, nil // no hole support
		case err != nil:
			return nil, err
		}
		if d >= size {
			return segs, nil
		}
		if len(segs) == MaxSegments-1 {
			return append(segs, Segment{d, size - d}), nil
		}
		h, err := f.Seek(d, seekHole)
		if err != nil {
			return nil, err
		}
		h = min(h, size)
		if h <= d {
			return append(segs, Segment{d, size - d}), nil // should not happen; be safe
		}
		segs = append(segs, Segment{d, h - d})
		off = h
	}
	return segs, nil
}
