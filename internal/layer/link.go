package layer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// The image writer gives every name its own inode. Hard links are made
// after it is done: each further name of a linked inode was written as an
// empty placeholder file, and its directory entry is now pointed at the
// primary name's inode. The placeholder inodes stay in the metadata area,
// unreferenced (32 bytes each), and the superblock's inode count is
// lowered by their number.

// Offsets in the on-disk superblock, which starts at byte 1024.
const (
	sbOffset      = 1024
	sbMagic       = 0xe0f5e1e2
	sbBlkSzBits   = sbOffset + 12
	sbRootNid     = sbOffset + 14
	sbInos        = sbOffset + 16
	sbMetaBlkAddr = sbOffset + 40
)

var errCorrupt = errors.New("corrupt image")

type image struct {
	r        io.ReaderAt
	blkBits  uint
	metaBase int64
	rootNid  uint64
	dirs     map[string]map[string]dirent // by directory path
}

type dirent struct {
	off   int64 // of the on-disk dirent
	nid   uint64
	ftype byte
}

func openImage(r io.ReaderAt) (*image, error) {
	var sb [128]byte
	if _, err := r.ReadAt(sb[:], sbOffset); err != nil {
		return nil, fmt.Errorf("read superblock: %w", err)
	}
	if binary.LittleEndian.Uint32(sb[0:]) != sbMagic {
		return nil, fmt.Errorf("%w: bad superblock magic", errCorrupt)
	}
	bits := uint(sb[sbBlkSzBits-sbOffset])
	if bits < 9 || bits > 16 {
		return nil, fmt.Errorf("%w: block size bits %d", errCorrupt, bits)
	}
	return &image{
		r:        r,
		blkBits:  bits,
		metaBase: int64(binary.LittleEndian.Uint32(sb[sbMetaBlkAddr-sbOffset:])) << bits,
		rootNid:  uint64(binary.LittleEndian.Uint16(sb[sbRootNid-sbOffset:])),
		dirs:     map[string]map[string]dirent{},
	}, nil
}

// readDir returns the entries of the directory whose inode is nid.
func (img *image) readDir(nid uint64) (map[string]dirent, error) {
	ipos := img.metaBase + int64(nid)*32
	var ino [64]byte
	if _, err := img.r.ReadAt(ino[:32], ipos); err != nil {
		return nil, fmt.Errorf("read inode %d: %w", nid, err)
	}
	format := binary.LittleEndian.Uint16(ino[0:])
	icount := int64(binary.LittleEndian.Uint16(ino[2:]))
	mode := binary.LittleEndian.Uint16(ino[4:])
	if mode&typeMask != typeDir {
		return nil, fmt.Errorf("%w: inode %d is not a directory", errCorrupt, nid)
	}
	isize := int64(32)
	size := int64(binary.LittleEndian.Uint32(ino[8:]))
	if format&1 != 0 {
		isize = 64
		if _, err := img.r.ReadAt(ino[32:], ipos+32); err != nil {
			return nil, fmt.Errorf("read inode %d: %w", nid, err)
		}
		size = int64(binary.LittleEndian.Uint64(ino[8:]))
	}
	blkaddr := int64(binary.LittleEndian.Uint32(ino[16:]))
	xsize := int64(0)
	if icount > 0 {
		xsize = 12 + (icount-1)*4
	}
	layout := (format >> 1) & 7
	if layout != 0 && layout != 2 {
		return nil, fmt.Errorf("%w: directory inode %d has layout %d", errCorrupt, nid, layout)
	}
	if size < 0 || size > 1<<32 {
		return nil, fmt.Errorf("%w: directory inode %d has size %d", errCorrupt, nid, size)
	}

	bs := int64(1) << img.blkBits
	nblocks := (size + bs - 1) / bs
	out := map[string]dirent{}
	buf := make([]byte, bs)
	for i := range nblocks {
		pos := (blkaddr + i) << img.blkBits
		if layout == 2 && i == nblocks-1 {
			pos = ipos + isize + xsize
		}
		blk := buf[:min(bs, size-i*bs)]
		if _, err := img.r.ReadAt(blk, pos); err != nil {
			return nil, fmt.Errorf("read directory inode %d: %w", nid, err)
		}
		if err := parseDirents(blk, pos, out); err != nil {
			return nil, fmt.Errorf("directory inode %d: %w", nid, err)
		}
	}
	return out, nil
}

// parseDirents adds the entries of one directory block, read from pos.
func parseDirents(blk []byte, pos int64, out map[string]dirent) error {
	if len(blk) < 12 {
		return fmt.Errorf("%w: short directory block", errCorrupt)
	}
	first := int(binary.LittleEndian.Uint16(blk[8:]))
	if first%12 != 0 || first < 12 || first > len(blk) {
		return fmt.Errorf("%w: bad directory block header", errCorrupt)
	}
	n := first / 12
	for j := range n {
		d := blk[j*12:]
		start := int(binary.LittleEndian.Uint16(d[8:]))
		end := len(blk)
		if j+1 < n {
			end = int(binary.LittleEndian.Uint16(d[12+8:]))
		}
		if start < first || start > end || end > len(blk) {
			return fmt.Errorf("%w: bad directory entry", errCorrupt)
		}
		name := string(blk[start:end])
		if j+1 == n {
			name, _, _ = strings.Cut(name, "\x00")
		}
		out[name] = dirent{off: pos + int64(j*12), nid: binary.LittleEndian.Uint64(d[0:]), ftype: d[10]}
	}
	return nil
}

// dir returns the entries of the directory at p ("" is the root).
func (img *image) dir(p string) (map[string]dirent, error) {
	if d, ok := img.dirs[p]; ok {
		return d, nil
	}
	nid := img.rootNid
	if p != "" {
		parent, name := splitPath(p)
		pd, err := img.dir(parent)
		if err != nil {
			return nil, err
		}
		de, ok := pd[name]
		if !ok {
			return nil, fmt.Errorf("%w: no entry %q", errCorrupt, p)
		}
		nid = de.nid
	}
	d, err := img.readDir(nid)
	if err != nil {
		return nil, err
	}
	img.dirs[p] = d
	return d, nil
}

func (img *image) lookup(p string) (dirent, error) {
	parent, name := splitPath(p)
	d, err := img.dir(parent)
	if err != nil {
		return dirent{}, err
	}
	de, ok := d[name]
	if !ok {
		return dirent{}, fmt.Errorf("%w: no entry %q", errCorrupt, p)
	}
	return de, nil
}

func splitPath(p string) (dir, name string) {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i], p[i+1:]
	}
	return "", p
}

// linkNames points the directory entry of every further name of a
// hard-linked inode at its primary inode, and fixes the inode count.
func linkNames(rw interface {
	io.ReaderAt
	io.WriterAt
}, links []entry,
) error {
	img, err := openImage(rw)
	if err != nil {
		return err
	}
	for _, e := range links {
		primary, err := img.lookup(e.n.primary)
		if err != nil {
			return err
		}
		de, err := img.lookup(e.path)
		if err != nil {
			return err
		}
		var b [11]byte
		binary.LittleEndian.PutUint64(b[:], primary.nid)
		if _, err := rw.WriteAt(b[:8], de.off); err != nil {
			return err
		}
		if _, err := rw.WriteAt([]byte{e.n.direntType()}, de.off+10); err != nil {
			return err
		}
	}
	var b [8]byte
	if _, err := rw.ReadAt(b[:], sbInos); err != nil {
		return err
	}
	inos := binary.LittleEndian.Uint64(b[:]) - uint64(len(links))
	binary.LittleEndian.PutUint64(b[:], inos)
	_, err = rw.WriteAt(b[:], sbInos)
	return err
}
