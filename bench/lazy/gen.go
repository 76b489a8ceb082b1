//go:build linux

package main

import (
	"archive/tar"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
)

// The synthetic images: each is the base image plus one data layer of
// pseudo-random content under /data, a few large files and many small
// ones. Everything derives from the image's index, so the layer, its
// files and every task's picks are the same on every run.

const (
	largeShare = 0.85 // of the layer's bytes, in large files
	largeMin   = 4 << 20
	largeMax   = 16 << 20
	smallMax   = 64 << 10
	poolSize   = 64 << 20 // random bytes the files' blocks are cut from
	blockSize  = 64 << 10
)

// file is one file of a data layer.
type file struct {
	Path  string // inside the sandbox
	Size  int64
	Large bool
}

// layerSpec lists the files of image i's data layer, of about size bytes.
func layerSpec(i int, size int64) []file {
	rng := rand.New(rand.NewPCG(uint64(i)+1, 0x1a2b))
	var files []file
	large := int64(float64(size) * largeShare)
	for sum, n := int64(0), 0; sum < large; n++ {
		s := min(largeMin+rng.Int64N(largeMax-largeMin), large-sum)
		files = append(files, file{Path: fmt.Sprintf("/data/big/b%03d.bin", n), Size: s, Large: true})
		sum += s
	}
	for sum, n := large, 0; sum < size; n++ {
		s := min(1+rng.Int64N(smallMax), size-sum)
		files = append(files, file{Path: fmt.Sprintf("/data/small/d%02d/s%05d.bin", n%32, n), Size: s})
		sum += s
	}
	return files
}

// pool is the random bytes file contents are cut from: generating each
// byte anew would take longer than building the layers.
func newPool() []byte {
	rng := rand.New(rand.NewChaCha8([32]byte{'l', 'a', 'z', 'y'}))
	b := make([]byte, poolSize)
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return b
}

// writeTar writes image i's data layer as a tar stream to w: each 64 KiB
// block of a file is a slice of pool at a pseudo-random offset, stamped
// with the image, file and block, so no two blocks of the benchmark are
// alike.
func writeTar(w io.Writer, i int, files []file, pool []byte) error {
	tw := tar.NewWriter(w)
	rng := rand.New(rand.NewPCG(uint64(i)+1, 0x3c4d))
	var stamp [24]byte
	for n, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.Path[1:], Mode: 0o644, Size: f.Size, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			return err
		}
		for off := int64(0); off < f.Size; off += blockSize {
			l := min(blockSize, f.Size-off)
			start := rng.Int64N(poolSize-blockSize) &^ 7
			blk := pool[start : start+l]
			binary.LittleEndian.PutUint64(stamp[0:], uint64(i))
			binary.LittleEndian.PutUint64(stamp[8:], uint64(n))
			binary.LittleEndian.PutUint64(stamp[16:], uint64(off))
			s := min(int64(len(stamp)), l)
			if _, err := tw.Write(stamp[:s]); err != nil {
				return err
			}
			if _, err := tw.Write(blk[s:]); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// pick returns the files task k of image i reads: about frac of the large
// files' bytes and frac of the small files, chosen at random (fixed per
// task; tasks of one image choose independently).
func pick(i, k int, files []file, frac float64) []file {
	rng := rand.New(rand.NewPCG(uint64(i)+1, uint64(k)+0x5e6f))
	var largeBytes int64
	var nSmall int
	for _, f := range files {
		if f.Large {
			largeBytes += f.Size
		} else {
			nSmall++
		}
	}
	want := int64(frac * float64(largeBytes))
	wantSmall := int(frac*float64(nSmall) + 0.5)
	var out []file
	var got int64
	gotSmall := 0
	for _, j := range rng.Perm(len(files)) {
		f := files[j]
		switch {
		case f.Large && got < want*9/10 && got+f.Size <= want*5/4:
			got += f.Size
			out = append(out, f)
		case !f.Large && gotSmall < wantSmall:
			gotSmall++
			out = append(out, f)
		}
	}
	return out
}

// pickTask returns the files task k of image i reads: a part of frac that
// every task of the image reads (shared of it: the files of the
// environment that every run touches, its interpreter and libraries) and
// the rest chosen by the task alone. shared 0 is pick's independent choice.
func pickTask(i, k int, files []file, frac, shared float64) []file {
	if shared <= 0 {
		return pick(i, k, files, frac)
	}
	common := pick(i, -1, files, frac*shared)
	if shared >= 1 {
		return common
	}
	in := make(map[string]bool, len(common))
	for _, f := range common {
		in[f.Path] = true
	}
	var rest []file
	var all, left int64
	for _, f := range files {
		all += f.Size
		if !in[f.Path] {
			rest = append(rest, f)
			left += f.Size
		}
	}
	if left == 0 {
		return common
	}
	// pick takes a fraction of what it is given: scale the task's own part
	// to frac*(1-shared) of the whole layer.
	own := pick(i, k, rest, min(1, frac*(1-shared)*float64(all)/float64(left)))
	return append(common, own...)
}
