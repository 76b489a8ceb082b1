package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"github.com/erofs/go-erofs"

	"github.com/dsecproject/dsec/internal/layer"
)

// synthFile is one file of the synthetic layer.
type synthFile struct {
	Path string `json:"path"` // relative to the layer root
	Size int64  `json:"size"`
}

// images are the built layer in its two forms.
type images struct {
	tree  string      // the source directory
	files []synthFile // every regular file, in creation order
	full  string      // the layer image (internal/layer), data inline
	meta  string      // metadata-only image whose file data is on device 1
	data  string      // device 1 of meta: the file data, block aligned
	info  layer.Info

	FullSize int64 `json:"full_image_bytes"`
	MetaSize int64 `json:"meta_image_bytes"`
	DataSize int64 `json:"data_blob_bytes"`
	Files    int   `json:"files"`
	Bytes    int64 `json:"file_bytes"`
}

// buildImages writes a tree of random files of sizes log-uniform in
// [4 KiB, 8 MiB] totalling about total bytes, builds the layer with
// internal/layer, then splits it with go-erofs into a metadata image and a
// data blob (Create with WithDataFile copies each file's data to the blob,
// block aligned, and records chunk indexes on device 1).
func buildImages(ctx context.Context, dir string, total int64, seed uint64) (*images, error) {
	im := &images{
		tree: filepath.Join(dir, "tree"),
		full: filepath.Join(dir, "layer.erofs"),
		meta: filepath.Join(dir, "meta.erofs"),
		data: filepath.Join(dir, "data.blob"),
	}
	rng := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}))
	buf := make([]byte, 8<<20)
	lo, hi := math.Log(4<<10), math.Log(8<<20)
	for i := 0; im.Bytes < total; i++ {
		size := int64(math.Exp(lo + rng.Float64()*(hi-lo)))
		p := fmt.Sprintf("d%02d/f%04d.bin", i%16, i)
		full := filepath.Join(im.tree, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return nil, err
		}
		b := buf[:(size+7)&^7]
		for j := 0; j < len(b); j += 8 {
			binary.LittleEndian.PutUint64(b[j:], rng.Uint64())
		}
		if err := os.WriteFile(full, buf[:size], 0o644); err != nil {
			return nil, err
		}
		im.files = append(im.files, synthFile{Path: p, Size: size})
		im.Bytes += size
	}
	im.Files = len(im.files)

	out, err := os.Create(im.full)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	if im.info, err = layer.BuildFromDir(ctx, im.tree, out, layer.Options{TempDir: dir}); err != nil {
		return nil, fmt.Errorf("build layer: %w", err)
	}
	im.FullSize = im.info.Size

	src, err := erofs.Open(out)
	if err != nil {
		return nil, fmt.Errorf("open layer: %w", err)
	}
	meta, err := os.Create(im.meta)
	if err != nil {
		return nil, err
	}
	defer meta.Close()
	data, err := os.Create(im.data)
	if err != nil {
		return nil, err
	}
	defer data.Close()
	w := erofs.Create(meta, erofs.WithDataFile(data))
	if err := w.CopyFrom(src); err != nil {
		return nil, fmt.Errorf("split layer: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("split layer: %w", err)
	}
	for _, f := range []struct {
		name string
		size *int64
	}{{im.meta, &im.MetaSize}, {im.data, &im.DataSize}} {
		st, err := os.Stat(f.name)
		if err != nil {
			return nil, err
		}
		*f.size = st.Size()
	}
	return im, nil
}

// dataRanger is what go-erofs's FileInfo offers for uncompressed files.
type dataRanger interface{ DataRange() []erofs.DataRange }

// chunksOf returns the chunks of the blob (the full image, or the data
// blob for the metadata-only image) that hold the data of files.
func chunksOf(img, dataDev string, files []string, chunk int64) (map[int64]bool, error) {
	f, err := os.Open(img)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var opts []erofs.OpenOpt
	if dataDev != "" {
		d, err := os.Open(dataDev)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		opts = append(opts, erofs.WithExtraDevices(d))
	}
	fsys, err := erofs.Open(f, opts...)
	if err != nil {
		return nil, err
	}
	touched := map[int64]bool{}
	for _, p := range files {
		fi, err := fs.Stat(fsys, p)
		if err != nil {
			return nil, err
		}
		dr, ok := fi.(dataRanger)
		if !ok {
			return nil, fmt.Errorf("%s: no data ranges", p)
		}
		for _, r := range dr.DataRange() {
			if r.Offset < 0 || r.Size == 0 {
				continue
			}
			for c := r.Offset / chunk; c*chunk < r.Offset+r.Size; c++ {
				touched[c] = true
			}
		}
	}
	return touched, nil
}

// pickFiles picks n files spread over the size distribution.
func pickFiles(files []synthFile, n int) []synthFile {
	s := slices.Clone(files)
	slices.SortFunc(s, func(a, b synthFile) int { return int(a.Size - b.Size) })
	var out []synthFile
	for i := range n {
		out = append(out, s[(2*i+1)*len(s)/(2*n)])
	}
	return out
}

func sha256File(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
