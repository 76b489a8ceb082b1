package apiserver

import (
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestBurstOnANodeWithRoom: a burst of 1 GiB creates at 15/s for 4 s on a
// node that admits 64 GiB all succeed at once. The node's reports (polled
// every 2 s) already hold the sandboxes placed before them; counting the
// recent placements on top made the node look full after its first report
// of the burst, and SandboxFusion calls waited 5 s for room (issue 13).
func TestBurstOnANodeWithRoom(t *testing.T) {
	ts := newTenancyServer(t, 0)
	ts.setAdmissible(t, 64<<30)
	const n = 60
	tick := time.NewTicker(time.Second / 15)
	defer tick.Stop()
	var wg sync.WaitGroup
	errs := make([]error, n)
	took := make([]time.Duration, n)
	for i := range n {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, errs[i] = ts.admin.Create(t.Context(), dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}, Memory: 1 << 30})
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			if failed == 0 {
				t.Errorf("create %d of %d on a node with room = %v", i+1, n, err)
			}
			failed++
		} else if took[i] > 2*time.Second {
			t.Errorf("create %d took %v, want it at once", i+1, took[i])
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d creates of 1 GiB failed on a node that admits 64 GiB", failed, n)
	}
}

// TestChurnOnANodeWithLittleRoom: sandboxes created and deleted at once,
// four at a time, as SandboxFusion's calls do, on a node that admits 8 GiB
// of 1 GiB sandboxes: at most four are alive, so every create has room.
// The node's report (polled every 2 s) does not see the deletes since it
// was taken while the placements since then count on top, so a node with
// room looked full for up to 2 s; a refused placement now asks the nodes
// again before it refuses (issue 13).
func TestChurnOnANodeWithLittleRoom(t *testing.T) {
	ts := newTenancyServer(t, 0)
	ts.setAdmissible(t, 8<<30)
	const workers, each = 4, 15
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error // guarded by mu
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				sb, err := ts.admin.Create(t.Context(), dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}, Memory: 1 << 30})
				if err == nil {
					err = ts.admin.Delete(t.Context(), sb.ID)
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Errorf("%d of %d creates and deletes with at most %d sandboxes of 1 GiB alive on a node that admits 8 GiB failed; first: %v", len(errs), workers*each, workers, errs[0])
	}
}
