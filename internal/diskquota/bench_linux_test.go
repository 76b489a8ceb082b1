package diskquota

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/rootfs"
)

// Run with: go test -run '^$' -bench . -benchtime 100x ./internal/diskquota

func BenchmarkCreate(b *testing.B) {
	for _, mode := range modes() {
		b.Run(string(mode), func(b *testing.B) {
			if mode == ModeProject && !xfsQuotaSupported() {
				b.Skip("this kernel's XFS has no quota support")
			}
			if os.Geteuid() != 0 {
				b.Skip("needs root")
			}
			dir := b.TempDir()
			f, err := Open(context.Background(), config(dir, mode))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			times := make([]time.Duration, 0, b.N)
			for i := 0; b.Loop(); i++ {
				start := time.Now()
				if _, err := f.Create(context.Background(), fmt.Sprintf("c%d", i), 0, 0); err != nil {
					b.Fatal(err)
				}
				times = append(times, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds()), "median-µs")
			b.ReportMetric(float64(times[len(times)*9/10].Microseconds()), "p90-µs")
			dirs, _ := f.List()
			for _, d := range dirs {
				if err := f.Remove(context.Background(), d.Name); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMkfsMountXFS times what Open does to a fresh image in
// ModeProject (mkfs.xfs, loop device, mount), without prjquota so that it
// runs on kernels without XFS quotas.
func BenchmarkMkfsMountXFS(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for _, size := range []int64{1 << 30, DefaultSize} {
		b.Run(fmt.Sprintf("%dGiB", size>>30), func(b *testing.B) {
			dir := b.TempDir()
			mnt := filepath.Join(dir, "mnt")
			if err := os.Mkdir(mnt, 0o755); err != nil {
				b.Fatal(err)
			}
			for i := 0; b.Loop(); i++ {
				img := filepath.Join(dir, fmt.Sprintf("%d.img", i))
				if err := makeImage(context.Background(), execRun, img, size, "mkfs.xfs", mkfsXFSArgs(size)...); err != nil {
					b.Fatal(err)
				}
				if _, err := mountImage(img, mnt, "xfs", "", nil); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := unmount(mnt); err != nil {
					b.Fatal(err)
				}
				var st unix.Stat_t
				if err := unix.Stat(img, &st); err == nil && i == 0 {
					b.ReportMetric(float64(st.Blocks*512>>20), "MiB-on-host")
				}
				os.Remove(img)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkOverlayWrite writes and syncs a 100 MiB file through an overlay
// whose upper is a limited directory, and one whose upper is on the file
// system of the test's temporary directory.
func BenchmarkOverlayWrite(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	const size = 100 << 20
	run := func(b *testing.B, upper, work string) {
		dir := b.TempDir()
		lower, merged := filepath.Join(dir, "lower"), filepath.Join(dir, "merged")
		for _, p := range []string{lower, merged} {
			if err := os.Mkdir(p, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		lowerDir, err := os.Open(lower)
		if err != nil {
			b.Fatal(err)
		}
		defer lowerDir.Close()
		if err := rootfs.Overlay(merged, upper, work, []*os.File{lowerDir}); err != nil {
			b.Fatal(err)
		}
		defer unix.Unmount(merged, 0)
		b.SetBytes(size)
		for b.Loop() {
			if n, err := fill(filepath.Join(merged, "f"), size); err != nil {
				b.Fatalf("fill = %d, %v", n, err)
			}
			b.StopTimer()
			os.Remove(filepath.Join(merged, "f"))
			unix.Sync()
			b.StartTimer()
		}
	}
	b.Run("host", func(b *testing.B) {
		dir := b.TempDir()
		var st unix.Statfs_t
		unix.Statfs(dir, &st)
		b.Logf("host file system type %#x", st.Type)
		upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
		os.Mkdir(upper, 0o755)
		os.Mkdir(work, 0o700)
		run(b, upper, work)
	})
	for _, mode := range modes() {
		b.Run(string(mode), func(b *testing.B) {
			if mode == ModeProject && !xfsQuotaSupported() {
				b.Skip("this kernel's XFS has no quota support")
			}
			f, err := Open(context.Background(), config(b.TempDir(), mode))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			d, err := f.Create(context.Background(), "box", 1<<30, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Remove(context.Background(), "box")
			run(b, d.Upper, d.Work)
		})
	}
}
