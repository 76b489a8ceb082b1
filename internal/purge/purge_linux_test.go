package purge

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/netns"
	"github.com/dsecproject/dsec/internal/testenv"
)

// TestPurgeRemovesRouter: purge removes the sandboxes' router namespace,
// so a sandbox loses its link, and leaves nothing mounted.
func TestPurgeRemovesRouter(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	r, err := netns.Open(keeper.Layout{StateDir: dir}.NetworkDir(), netns.DefaultPool)
	if err != nil {
		t.Fatal(err)
	}
	sb := make(chan int, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is thrown away
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			sb <- -1
			return
		}
		fd, _ := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		sb <- fd
	}()
	fd := <-sb
	if fd < 0 {
		t.Fatal("make a sandbox namespace")
	}
	defer unix.Close(fd)
	if _, err := r.AttachFd("sb", fd); err != nil {
		t.Fatal(err)
	}
	r.Close() // a keeper that died, leaving its router
	var out strings.Builder
	// A cgroup parent no sandbox of anyone's uses.
	if err := Run(context.Background(), Config{StateDir: dir, CgroupParent: "dsec-purge-test-none", Out: &out}); err != nil {
		t.Fatalf("purge: %v\n%s", err, out.String())
	}
	if m := testenv.MountsUnder(t, dir); len(m) > 0 {
		t.Errorf("left mounted: %v", m)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("state dir left: %v", err)
	}
	// The sandbox has lo only: its eth0 went with the router.
	h, err := netlink.NewHandleAt(vnetns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ls, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 {
		t.Errorf("sandbox links after purge = %d, want lo only", len(ls))
	}
}
