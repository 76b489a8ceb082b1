package edge

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkStoreDurability measures what a sandbox's records cost in each
// durability mode of the store (openStore): a create's insert and its
// transition to running, by 1 and by 64 concurrent creators (a burst). It
// reports writes/s and the latency of one write. Run it on the file
// system of the state dir (DSEC_BENCH_DIR, default the test's temp dir):
//
//	DSEC_BENCH_DIR=/var/lib/dsec-bench go test -run '^$' -bench StoreDurability -benchtime 2000x ./internal/edge/
func BenchmarkStoreDurability(b *testing.B) {
	modes := []struct {
		name      string
		syncEvery time.Duration
	}{
		{"nosync-flush-100ms", 0},
		{"fsync-group", -1},
	}
	if d := os.Getenv("DSEC_BENCH_BATCH_DELAY"); d != "" {
		v, err := time.ParseDuration(d)
		if err != nil {
			b.Fatal(err)
		}
		defer func(old time.Duration) { batchDelay = old }(batchDelay)
		batchDelay = v
	}
	for _, m := range modes {
		for _, writers := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/writers=%d", m.name, writers), func(b *testing.B) {
				dir := os.Getenv("DSEC_BENCH_DIR")
				if dir == "" {
					dir = b.TempDir()
				} else {
					var err error
					if dir, err = os.MkdirTemp(dir, "bench"); err != nil {
						b.Fatal(err)
					}
					defer os.RemoveAll(dir)
				}
				s, err := openStore(filepath.Join(dir, "edge.db"), m.syncEvery)
				if err != nil {
					b.Fatal(err)
				}
				defer s.close()
				var seq atomic.Int64
				var lat atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				per := (b.N + writers - 1) / writers
				for w := 0; w < writers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < per; i++ {
							id := fmt.Sprintf("n-%012d", seq.Add(1))
							t0 := time.Now()
							r := &Record{ID: id, Image: "busybox:latest", Backend: "container", Project: "default", State: StateCreating, CreatedAt: t0}
							if err := s.insert(r); err != nil {
								b.Error(err)
								return
							}
							if _, err := s.update(id, func(r *Record) error { r.State = StateRunning; return nil }); err != nil {
								b.Error(err)
								return
							}
							lat.Add(int64(time.Since(t0)))
						}
					}()
				}
				wg.Wait()
				el := time.Since(start)
				n := float64(per * writers)
				b.ReportMetric(2*n/el.Seconds(), "writes/s")
				b.ReportMetric(float64(lat.Load())/n/2/1e6, "ms/write")
			})
		}
	}
}
