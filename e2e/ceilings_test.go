package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestHostCeilingFlags starts dsec up with its own host reserves and
// checks they reach the keeper (the cgroup parent's pids.max and memory
// limit) and the edge (a disk reserve larger than the file system refuses
// every create, naming disk); test/adversarial checks the defaults.
func TestHostCeilingFlags(t *testing.T) {
	p := newPlatform(t, func(p *platform) {
		p.Extra = append(p.Extra, "--host-pids-reserve", "10000", "--host-memory-reserve", "20%,1G", "--disk-reserve", "100T")
	})
	p.Busybox(t)
	h, err := ceiling.ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	l, err := cgroup.DetectLayout()
	if err != nil {
		t.Fatal(err)
	}
	pidsMax := filepath.Join(l.V1["pids"], p.CgroupParent, "pids.max")
	memMax := filepath.Join(l.V1["memory"], p.CgroupParent, "memory.limit_in_bytes")
	if l.Mode == cgroup.Unified {
		pidsMax = filepath.Join(l.Unified, p.CgroupParent, "pids.max")
		memMax = filepath.Join(l.Unified, p.CgroupParent, "memory.max")
	}
	if got, want := readInt(t, pidsMax), h.Tasks-10000; got != want {
		t.Errorf("%s = %d, want %d (the host's %d tasks minus --host-pids-reserve 10000)", pidsMax, got, want, h.Tasks)
	}
	wantMem := h.MemoryBytes - max((h.MemoryBytes*2+9)/10, 1<<30)
	if got := readInt(t, memMax); got > wantMem || got < wantMem-4096 {
		t.Errorf("%s = %d, want %d (the host's %d bytes minus --host-memory-reserve 20%%,1G)", memMax, got, wantMem, h.MemoryBytes)
	}

	c := p.Client(t, p.AdminKey(t))
	sb, err := c.Create(ctxT(t), dsec.CreateOptions{Image: "busybox", Disk: 64 << 20})
	if err == nil {
		_ = sb.Delete(ctxT(t))
		t.Fatalf("Create with --disk-reserve 100T = %s, want InvalidArgument", sb.ID)
	}
	// The reserve keeps the whole file system: no disk can ever fit.
	var de *dsec.Error
	if !errors.Is(err, dsec.ErrInvalidArgument) || !errors.As(err, &de) || !strings.Contains(de.Message, "disk 64 MiB is more than node e2e can ever give a sandbox: the most is 0 B") {
		t.Errorf("Create with --disk-reserve 100T = %v, want InvalidArgument naming disk that can never hold more than 0 B", err)
	}

	// A reserve that leaves the sandboxes nothing is refused at start,
	// naming the flag.
	for _, bad := range [][]string{{"--host-pids-reserve", "100%"}, {"--host-memory-reserve", "0"}, {"--disk-overcommit", "0.5"}} {
		cmd := exec.Command(p.Bin, append([]string{"up", "--state-dir", t.TempDir(), "--listen", freePort(t)}, bad...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), bad[0]) {
			t.Errorf("dsec up %s = %v, %q; want a failure naming %s", strings.Join(bad, " "), err, out, bad[0])
		}
	}
}

func readInt(t *testing.T, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s = %q, want a number", file, b)
	}
	return v
}
