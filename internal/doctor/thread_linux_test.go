package doctor

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/testenv"
)

func mountNS(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestThrowawayThread checks that a private mount namespace never reaches
// the process (what /proc/self shows, which is the main thread's view) and
// that its thread ends. It runs many times, so that the runtime schedules
// some of them on the main thread.
func TestThrowawayThread(t *testing.T) {
	testenv.RequireRoot(t)
	host := mountNS(t, "/proc/self/ns/mnt")
	for i := range 50 {
		var tid int
		var inside uint64
		err := inPrivateMountNS(func() error {
			tid = unix.Gettid()
			var st unix.Stat_t
			if err := unix.Stat(fmt.Sprintf("/proc/self/task/%d/ns/mnt", tid), &st); err != nil {
				return err
			}
			inside = st.Ino
			return nil
		})
		if err != nil {
			t.Fatalf("inPrivateMountNS: %v", err)
		}
		if tid == os.Getpid() || inside == host {
			t.Fatalf("run %d: probe ran on thread %d (pid %d) in mount namespace %d (host's %d), want another thread in another namespace", i, tid, os.Getpid(), inside, host)
		}
		if got := mountNS(t, "/proc/self/ns/mnt"); got != host {
			t.Fatalf("run %d: the process's mount namespace is %d after the probe, want %d", i, got, host)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid))
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %d: thread %d still exists after the probe (stat: %v)", i, tid, err)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

func TestThrowawayThreadPanic(t *testing.T) {
	err := onThrowawayThread(func() error { panic("boom") })
	if err == nil {
		t.Errorf("onThrowawayThread(panic) = nil, want an error")
	}
}
