//go:build linux

package harness

import (
	"context"
	"io/fs"
	"path/filepath"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// ForEach calls fn for 0 … n-1, conc at a time; the first error stops the
// calls not yet started and is returned once the running ones end.
func ForEach(ctx context.Context, n, conc int, fn func(ctx context.Context, i int) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(conc, 1))
	for i := range n {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error { return fn(gctx, i) })
	}
	return g.Wait()
}

// Allocated returns the bytes of the blocks allocated to files under dir
// on dir's own file system (mounts below it are not entered), each inode
// once.
func Allocated(dir string) int64 {
	var root unix.Stat_t
	if err := unix.Lstat(dir, &root); err != nil {
		return 0
	}
	type devIno struct{ dev, ino uint64 }
	seen := map[devIno]bool{}
	var total int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone while walking
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if st.Dev != root.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if k := (devIno{st.Dev, st.Ino}); !seen[k] {
			seen[k] = true
			total += st.Blocks * 512
		}
		return nil
	})
	return total
}
