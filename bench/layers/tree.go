//go:build linux

package main

import (
	"archive/tar"
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
)

// filesPerDir is how many files a synthetic tree puts in one directory.
const filesPerDir = 32

// treeSpec describes a synthetic tree: files regular files of about bytes
// in total, with pseudo-random content drawn from seed, plus one marker
// file holding marker.
type treeSpec struct {
	seed   uint64
	files  int
	bytes  int64
	marker string
	// markerName is the marker file's name at the tree's root.
	markerName string
}

// treeStats is what genTree wrote.
type treeStats struct {
	Files int   `json:"files"`
	Dirs  int   `json:"dirs"`
	Bytes int64 `json:"bytes"`
}

// fileSizes returns the sizes of the files of s: each drawn uniformly
// between a quarter and seven quarters of the mean, then scaled so that
// they sum to s.bytes (at least one byte each).
func fileSizes(s treeSpec) []int64 {
	if s.files <= 0 {
		return nil
	}
	r := rand.New(rand.NewPCG(s.seed, 0x6c61796572)) // "layer"
	w := make([]float64, s.files)
	var sumW float64
	for i := range w {
		w[i] = 0.25 + 1.5*r.Float64()
		sumW += w[i]
	}
	sizes := make([]int64, s.files)
	var sum int64
	for i := range sizes {
		sizes[i] = max(1, int64(w[i]/sumW*float64(s.bytes)))
		sum += sizes[i]
	}
	sizes[s.files-1] = max(1, sizes[s.files-1]+s.bytes-sum)
	return sizes
}

// filePath is the name of file i of a tree: dNN/sNN/fNNNN.dat, at most
// filesPerDir files a directory and 16 subdirectories a directory.
func filePath(i int) string {
	d := i / filesPerDir
	return fmt.Sprintf("d%02d/s%02d/f%05d.dat", d/16, d%16, i)
}

// genTree writes the tree s describes under root (created): the same spec
// always gives the same names, sizes and bytes.
func genTree(root string, s treeSpec) (treeStats, error) {
	var st treeStats
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], s.seed)
	src := rand.NewChaCha8(key)
	buf := make([]byte, 64<<10)
	dirs := map[string]bool{}
	for i, size := range fileSizes(s) {
		name := filepath.Join(root, filePath(i))
		if dir := filepath.Dir(name); !dirs[dir] {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return st, err
			}
			dirs[dir] = true
		}
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return st, err
		}
		for left := size; left > 0; {
			n := min(left, int64(len(buf)))
			_, _ = src.Read(buf[:n]) // never fails
			if _, err := f.Write(buf[:n]); err != nil {
				f.Close()
				return st, err
			}
			left -= n
		}
		if err := f.Close(); err != nil {
			return st, err
		}
		st.Files++
		st.Bytes += size
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return st, err
	}
	if err := os.WriteFile(filepath.Join(root, s.markerName), []byte(s.marker), 0o644); err != nil {
		return st, err
	}
	st.Files++
	st.Bytes += int64(len(s.marker))
	// d00, d00/s00 …: every directory below root once.
	seen := map[string]bool{}
	for d := range dirs {
		for ; d != root && !seen[d]; d = filepath.Dir(d) {
			seen[d] = true
		}
	}
	st.Dirs = len(seen)
	return st, nil
}

// writeTar writes the tree under root to the file out as a tar archive of
// directories and regular files named relative to root, what `tar -C root
// -cf out .` would hold, and returns the archive's size.
func writeTar(root, out string) (int64, error) {
	f, err := os.Create(out)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("tar %s: %w", root, err)
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	if err := bw.Flush(); err != nil {
		return 0, err
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), f.Close()
}
