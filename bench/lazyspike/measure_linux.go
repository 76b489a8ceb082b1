package main

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// candidate is one way of presenting the remote layer to the kernel.
type candidate struct {
	Name string `json:"name"`
	How  string `json:"how"`
	// blob is what the FUSE server serves; image/devOpts build the EROFS
	// mount from the FUSE file's path.
	blob   string
	source func(fuseFile string) (src, opts string)
	// for chunksOf
	img, dev string
}

func candidates(im *images) []candidate {
	return []candidate{
		{
			Name: "A-image-on-fuse",
			How:  "EROFS file-backed mount of the whole layer image, which is a FUSE file",
			blob: im.full, img: im.full,
			source: func(ff string) (string, string) { return ff, "" },
		},
		{
			Name: "B-meta-local+device-on-fuse",
			How:  "EROFS file-backed mount of a local metadata-only image, device=<FUSE file of the data blob>",
			blob: im.data, img: im.meta, dev: im.data,
			source: func(ff string) (string, string) { return im.meta, "device=" + ff },
		},
	}
}

type readFigures struct {
	Files         int     `json:"files"`
	BytesRead     int64   `json:"bytes_read"`
	Millis        float64 `json:"ms"`
	MiBps         float64 `json:"mib_per_s"`
	ChunksTouched int     `json:"data_chunks_touched,omitempty"`
	ChunksFetched int64   `json:"chunks_fetched"`
	BytesFetched  int64   `json:"bytes_fetched"`
	FuseReads     int64   `json:"fuse_reads"`
}

type cacheSnap struct {
	ErofsMiB      float64 `json:"erofs_files_cached_mib"`
	FuseFileMiB   float64 `json:"fuse_file_cached_mib"`
	ChunkCacheMiB float64 `json:"chunk_cache_file_cached_mib"`
}

type candidateResult struct {
	Name          string      `json:"name"`
	How           string      `json:"how"`
	WalkEntries   int         `json:"walk_entries"`
	WalkMillis    float64     `json:"walk_ms"`
	WalkFetched   int64       `json:"walk_chunks_fetched"`
	Cold5         readFigures `json:"cold_5_files"`
	Warm5         readFigures `json:"warm_5_files_second_mount"`
	SeqCold       readFigures `json:"seq_all_cold"`
	SeqWarm       readFigures `json:"seq_all_warm_chunk_cache"`
	SeqPageCached readFigures `json:"seq_all_warm_fuse_page_cache"`
	CacheAfter    cacheSnap   `json:"page_cache_after_warm"`
	Err           string      `json:"error,omitempty"`
}

type spike struct {
	k      *keeper
	im     *images
	base   serverConfig
	chosen []synthFile
	nCache int
}

func (s *spike) cfg(blob string) serverConfig {
	c := s.base
	c.blob = blob
	s.nCache++
	c.cache = filepath.Join(s.k.dir, fmt.Sprintf("cache%d.chunks", s.nCache))
	return c
}

// readAll reads files under root and returns the bytes read.
func readAll(root string, files []synthFile) (int64, error) {
	buf := make([]byte, 1<<20)
	var n int64
	for _, f := range files {
		fh, err := os.Open(filepath.Join(root, f.Path))
		if err != nil {
			return n, err
		}
		m, err := io.CopyBuffer(io.Discard, fh, buf)
		fh.Close()
		n += m
		if err != nil {
			return n, fmt.Errorf("%s: %w", f.Path, err)
		}
		if m != f.Size {
			return n, fmt.Errorf("%s: read %d bytes, want %d", f.Path, m, f.Size)
		}
	}
	return n, nil
}

// measureRead reads files through the mount at root, with the server's
// counters before and after.
func measureRead(m *fuseMount, root string, files []synthFile) (readFigures, error) {
	before, err := m.stats()
	if err != nil {
		return readFigures{}, err
	}
	start := time.Now()
	n, err := readAll(root, files)
	d := time.Since(start)
	if err != nil {
		return readFigures{}, err
	}
	after, err := m.stats()
	if err != nil {
		return readFigures{}, err
	}
	return readFigures{
		Files: len(files), BytesRead: n, Millis: float64(d.Microseconds()) / 1000,
		MiBps:         float64(n) / (1 << 20) / d.Seconds(),
		ChunksFetched: after.ChunksFetched - before.ChunksFetched,
		BytesFetched:  after.BytesFetched - before.BytesFetched,
		FuseReads:     after.Reads - before.Reads,
	}, nil
}

// cachedBytes is how much of the file at p is in the page cache
// (cachestat(2), Linux 6.5), without reading or mapping it.
func cachedBytes(p string) (int64, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{}, &cs, 0); err != nil {
		return 0, err
	}
	return int64(cs.Cache) * int64(os.Getpagesize()), nil
}

// dropFileCache evicts one file's clean pages (this file only; the
// machine's caches are left alone).
func dropFileCache(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

func (s *spike) snapshot(root string, files []synthFile, fuseFile, cacheFile string) cacheSnap {
	var sn cacheSnap
	for _, f := range files {
		if n, err := cachedBytes(filepath.Join(root, f.Path)); err == nil {
			sn.ErofsMiB += mib(n)
		}
	}
	if n, err := cachedBytes(fuseFile); err == nil {
		sn.FuseFileMiB = mib(n)
	}
	if n, err := cachedBytes(cacheFile); err == nil {
		sn.ChunkCacheMiB = mib(n)
	}
	return sn
}

// runCandidate measures one candidate on a fresh server and chunk cache.
func (s *spike) runCandidate(c candidate) (res candidateResult) {
	res.Name, res.How = c.Name, c.How
	fail := func(err error) candidateResult {
		res.Err = err.Error()
		return res
	}
	cfg := s.cfg(c.blob)
	m, err := s.k.mountFUSE(cfg, true)
	if err != nil {
		return fail(err)
	}
	defer m.destroy()
	src, opts := c.source(m.file)

	e1, err := s.k.mountEROFS(src, opts)
	if err != nil {
		return fail(err)
	}
	before, err := m.stats()
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	err = filepath.WalkDir(e1, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		res.WalkEntries++
		var st unix.Stat_t
		return unix.Lstat(p, &st)
	})
	if err != nil {
		return fail(fmt.Errorf("walk: %w", err))
	}
	res.WalkMillis = msSince(start)
	after, err := m.stats()
	if err != nil {
		return fail(err)
	}
	res.WalkFetched = after.ChunksFetched - before.ChunksFetched

	var paths []string
	for _, f := range s.chosen {
		paths = append(paths, f.Path)
	}
	touched, err := chunksOf(c.img, c.dev, paths, cfg.chunk)
	if err != nil {
		return fail(fmt.Errorf("chunks of the 5 files: %w", err))
	}
	if res.Cold5, err = measureRead(m, e1, s.chosen); err != nil {
		return fail(fmt.Errorf("cold read: %w", err))
	}
	res.Cold5.ChunksTouched = len(touched)

	// A second mount of the same layer, with the FUSE file's page cache
	// dropped: everything comes from the chunk cache through the server.
	remount := func(prev string) (string, error) {
		if err := unmount(prev); err != nil {
			return "", fmt.Errorf("unmount %s: %w", prev, err)
		}
		if err := dropFileCache(m.file); err != nil {
			return "", fmt.Errorf("drop FUSE file cache: %w", err)
		}
		return s.k.mountEROFS(src, opts)
	}
	e2, err := remount(e1)
	if err != nil {
		return fail(err)
	}
	if res.Warm5, err = measureRead(m, e2, s.chosen); err != nil {
		return fail(fmt.Errorf("warm read: %w", err))
	}
	res.Warm5.ChunksTouched = len(touched)
	if res.SeqCold, err = measureRead(m, e2, s.im.files); err != nil {
		return fail(fmt.Errorf("sequential cold read: %w", err))
	}
	e3, err := remount(e2)
	if err != nil {
		return fail(err)
	}
	if res.SeqWarm, err = measureRead(m, e3, s.im.files); err != nil {
		return fail(fmt.Errorf("sequential warm read: %w", err))
	}
	res.CacheAfter = s.snapshot(e3, s.im.files, m.file, cfg.cache)
	// A third mount with the FUSE file's page cache kept: what a second
	// sandbox on a layer mounted again sees.
	if err := unmount(e3); err != nil {
		return fail(err)
	}
	e4, err := s.k.mountEROFS(src, opts)
	if err != nil {
		return fail(err)
	}
	if res.SeqPageCached, err = measureRead(m, e4, s.im.files); err != nil {
		return fail(fmt.Errorf("sequential page-cached read: %w", err))
	}
	_ = unmount(e4)
	return res
}

// pageCacheResult is one cell of the duplication matrix.
type pageCacheResult struct {
	Candidate  string      `json:"candidate"`
	FuseDirect bool        `json:"fuse_fopen_direct_io"`
	ErofsDIO   bool        `json:"erofs_directio"`
	CacheODIR  bool        `json:"chunk_cache_o_direct"`
	Err        string      `json:"error,omitempty"`
	Cold       readFigures `json:"cold"`
	Cache      cacheSnap   `json:"page_cache_after_cold"`
	Remount    readFigures `json:"second_mount"`
}

// runPageCache reads a subset cold and reports where its pages ended up,
// then reads it again through a second mount.
func (s *spike) runPageCache(c candidate, fuseDirect, erofsDIO, cacheDirect bool, files []synthFile) (res pageCacheResult) {
	res.Candidate, res.FuseDirect, res.ErofsDIO, res.CacheODIR = c.Name, fuseDirect, erofsDIO, cacheDirect
	fail := func(err error) pageCacheResult {
		res.Err = err.Error()
		return res
	}
	cfg := s.cfg(c.blob)
	cfg.directIO = fuseDirect
	cfg.cacheDirect = cacheDirect
	m, err := s.k.mountFUSE(cfg, true)
	if err != nil {
		return fail(err)
	}
	defer m.destroy()
	src, opts := c.source(m.file)
	if erofsDIO {
		opts = joinOpts(opts, "directio")
	}
	e1, err := s.k.mountEROFS(src, opts)
	if err != nil {
		return fail(err)
	}
	if res.Cold, err = measureRead(m, e1, files); err != nil {
		return fail(err)
	}
	res.Cache = s.snapshot(e1, files, m.file, cfg.cache)
	if err := unmount(e1); err != nil {
		return fail(err)
	}
	e2, err := s.k.mountEROFS(src, opts)
	if err != nil {
		return fail(err)
	}
	if res.Remount, err = measureRead(m, e2, files); err != nil {
		return fail(err)
	}
	_ = unmount(e2)
	return res
}

func joinOpts(a, b string) string {
	if a == "" {
		return b
	}
	return a + "," + b
}

// baselineLocal reads every file of the layer mounted from the local image
// file, its page cache dropped first: the no-FUSE reference.
func (s *spike) baselineLocal() (readFigures, error) {
	if err := dropFileCache(s.im.full); err != nil {
		return readFigures{}, err
	}
	e, err := s.k.mountEROFS(s.im.full, "")
	if err != nil {
		return readFigures{}, err
	}
	defer unmount(e)
	start := time.Now()
	n, err := readAll(e, s.im.files)
	if err != nil {
		return readFigures{}, err
	}
	d := time.Since(start)
	return readFigures{Files: len(s.im.files), BytesRead: n, Millis: float64(d.Microseconds()) / 1000,
		MiBps: mib(n) / d.Seconds()}, nil
}

// mountChecks records which stackings the kernel accepts: EROFS on a FUSE
// file whose connection negotiated FUSE_PASSTHROUGH (the FUSE superblock
// then has a stack depth of 1), and overlayfs over an EROFS-on-FUSE layer
// (how internal/rootfs builds a sandbox root).
func (s *spike) mountChecks(cands []candidate) []string {
	var out []string
	for _, c := range cands {
		for _, pt := range []bool{true, false} {
			cfg := s.cfg(c.blob)
			cfg.passthrough = pt
			m, err := s.k.mountFUSE(cfg, true)
			if err != nil {
				out = append(out, fmt.Sprintf("%s: FUSE mount: %v", c.Name, err))
				continue
			}
			src, opts := c.source(m.file)
			e, err := s.k.mountEROFS(src, opts)
			line := fmt.Sprintf("%s, FUSE_PASSTHROUGH negotiated=%v: EROFS mount %s", c.Name, pt, errString(err))
			if err == nil {
				upper, _ := s.k.mkdir("upper")
				work, _ := s.k.mkdir("work")
				root, _ := s.k.mkdir("root")
				oerr := unix.Mount("overlay", root, "overlay", unix.MS_NODEV,
					fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,redirect_dir=off,metacopy=off", e, upper, work))
				line += "; overlayfs over it: " + errString(oerr)
				if oerr == nil {
					_, rerr := readAll(root, s.chosen[:1])
					line += ", read through overlay: " + errString(rerr)
					_ = unmount(root)
				}
				_ = unmount(e)
			}
			out = append(out, line)
			m.destroy()
		}
	}
	return out
}
